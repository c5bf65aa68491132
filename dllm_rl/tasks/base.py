"""Task interface: deterministic example generation, disjoint splits, verifiers.

A task turns ``(split, n, seed)`` into prompts with SFT answers and scores a
decoded completion. Splits are a pure function of an instance's canonical string
(``split_of``), so train and test never share an instance whatever the seeds or
the number of examples drawn.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import hashlib
import inspect
from typing import Any, Iterable, Mapping

import numpy as np

from dllm_rl.registry import Registry

SPLITS = ("train", "test")
# A generated task counts its splits (``split_size``) by hashing every instance's split key when
# its options give at most this many keys (~0.3 s on a 2-core CPU); beyond, counting would
# slow every run's start for a split far larger than a config asks for (a request past its end
# is then stopped by ``stall_draws``).
MAX_COUNTED_KEYS = 300_000


@dataclasses.dataclass(frozen=True)
class Example:
  """One task instance.

  prompt: text given to the model.
  answer: SFT target text, without EOS.
  meta: JSON-serialisable data the verifier needs (e.g. operands, target).
  source: where it was read from, ``"file:line"`` (a task read from files), so an example
    that does not fit a config limit is named where the user can find it; "" for a
    generated instance (named by its index in the split instead).
  """
  prompt: str
  answer: str
  meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  source: str = ""


@dataclasses.dataclass(frozen=True)
class VerifyResult:
  """Score of one completion.

  reward: scalar reward (built-in tasks give 1.0 or 0.0).
  correct: whether the completion solves the instance.
  parsed: the normalised answer that was scored, None when malformed.
  info: JSON-serialisable diagnostics (``reason`` when malformed or wrong).
  """
  reward: float
  correct: bool
  parsed: str | None
  info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def malformed(reason: str, **info: Any) -> VerifyResult:
  """Zero-reward result for a completion that could not be parsed."""
  return VerifyResult(reward=0.0, correct=False, parsed=None,
                      info={"reason": reason, **info})


def split_of(canonical: str, test_fraction: float) -> str:
  """"test" iff sha256(canonical), read as a uniform number in [0, 1), < test_fraction."""
  digest = hashlib.sha256(canonical.encode("utf-8")).digest()
  u = int.from_bytes(digest[:8], "big") / 2.0**64
  return "test" if u < test_fraction else "train"


def count_splits(keys: Iterable[str], test_fraction: float) -> dict[str, int]:
  """How many of the split keys ``keys`` (each once) fall in each split (``split_of``)."""
  counts = dict.fromkeys(SPLITS, 0)
  for key in keys:
    counts[split_of(key, test_fraction)] += 1
  return counts


def check_split(split: str) -> int:
  """Returns the split's index; ValueError for anything but "train"/"test"."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  return SPLITS.index(split)


class Task(abc.ABC):
  """A verifiable task. Subclasses implement ``sample``, ``canonical``, ``verify``.

  ``generate`` draws instances with ``sample`` from a numpy Generator seeded by
  (seed, split), keeps those whose ``split_of(split_key)`` is the requested
  split, and drops duplicates (by canonical string). It gives up with a
  ValueError after ``max_draws(n)`` draws, or sooner, after ``stall_draws()`` draws in a row
  that found no new instance (the split is exhausted, or holds only instances too rare to
  find: ``stall_draws``), or before any draw when the task counts the split's instances
  (``split_size``), or bounds them (``split_size_bound``), and n is more.
  """

  name: str = ""
  # Whether a prompt has many correct answers (Countdown's expressions, chain's operand
  # orders): what the StepRS study's distinct-correct-answers measure can grow on.
  many_answers: bool = False
  # Whether every prompt and answer is written in CharTokenizer's characters (the generated
  # tasks, whose text this code writes); False for a task whose text comes from files
  # written elsewhere (GSM8K's '####', MATH's LaTeX), which needs model.hf_checkpoint's
  # tokenizer: a run without one is told so, not only which character failed.
  char_text: bool = True
  # The constructor options that set how many distinct instances there are: a config asking
  # for more than the task can make is told to change them (``enlarge_hint``).
  size_options: tuple[str, ...] = ()

  def __init__(self, test_fraction: float = 0.1):
    if not 0.0 < test_fraction < 1.0:
      raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    self.test_fraction = float(test_fraction)

  @abc.abstractmethod
  def sample(self, rng: np.random.Generator) -> Example | None:
    """Draws one instance (any split); None to reject the draw."""

  @abc.abstractmethod
  def canonical(self, example: Example) -> str:
    """The string that identifies the instance (decides its split)."""

  @abc.abstractmethod
  def verify(self, example: Example, completion: str) -> VerifyResult:
    """Scores ``completion`` (decoded model output, already cut at EOS)."""

  def split_key(self, example: Example) -> str:
    """The string that decides the instance's split: its canonical string, unless a task
    with several training answers per prompt keeps the prompt alone here (so a test prompt
    is never trained on with any answer)."""
    return self.canonical(example)

  def has_split(self, split: str) -> bool:
    """Whether ``generate(split, ...)`` can give examples (a generated task has both splits;
    a file-backed one may have a test file only)."""
    check_split(split)
    return True

  def max_draws(self, n: int) -> int:
    """Bound on the draws ``generate`` makes before giving up."""
    per_hit = 1.0 / min(self.test_fraction, 1.0 - self.test_fraction)
    return int(1000 + 20 * per_hit * n)

  def stall_draws(self) -> int:
    """Draws in a row without a new instance after which ``generate`` gives up: the draws
    ``max_draws`` allows 100 instances (21,000 at test_fraction 0.1). Were every instance the
    split has left at least as likely as ``max_draws`` assumes (one in 20 / min(test_fraction,
    1 - test_fraction) draws), so many draws without one would have a chance below e**-100:
    the split would be exhausted. The generated tasks hold rarer instances at all but their
    smallest options (one draw in: arithmetic's |ops| * 10**(2 * num_digits); chain's
    num_numbers equal operands 10**(num_digits * num_numbers); sum_split's (target, x) pairs of
    a middle target ~2 * 10**(2 * num_digits); sudoku's and countdown's more), so near a
    split's end the give-up may leave a few rare instances undrawn: its message says so ("or
    only ones too rare to find"; where the task counts the split, ``split_size``, how many are
    left), and a bound that found them all would take millions of draws (minutes). The shipped
    configs and study testbeds never went 400 draws without one (seeds 0-19), so it stops none
    of them."""
    return self.max_draws(100)

  def split_size(self, split: str) -> int | None:
    """How many distinct instances ``split`` has, where the task counts them
    (``count_split_sizes``, once per task); None where it does not. ``generate`` asked for
    more gives up at once, before drawing."""
    check_split(split)
    sizes = self._split_sizes
    return None if sizes is None else sizes[split]

  @functools.cached_property
  def _split_sizes(self) -> dict[str, int] | None:
    return self.count_split_sizes()

  def count_split_sizes(self) -> dict[str, int] | None:
    """Each split's number of distinct instances (``{"train": ..., "test": ...}``), where the
    task counts them; None (this default) where it does not. The generated tasks count theirs
    when their options give at most ``MAX_COUNTED_KEYS`` split keys to hash (countdown:
    ``countdown.COUNT_LIMIT`` multisets of numbers)."""
    return None

  def split_size_bound(self) -> int | None:
    """A sound upper bound on each split's number of distinct instances (both splits'
    together bound either) where the task does not count them (``split_size`` None) but can
    bound them without drawing; None (this default) where it cannot. ``generate`` asked for
    more gives up at once; a request within it is left to the draws (``stall_draws``)."""
    return None

  def enlarge_hint(self) -> str:
    """The end of the config error for a split with too few instances: what gives more."""
    options = " or ".join(f"task.options.{o}" for o in self.size_options) or "task.options"
    return f"change {options} for more distinct instances"

  def generate(self, split: str, n: int, seed: int) -> list[Example]:
    """n distinct examples of ``split``; same arguments → same list."""
    split_idx = check_split(split)
    if n < 0 or seed < 0:
      raise ValueError(f"n and seed must be >= 0, got n={n}, seed={seed}")
    size = self.split_size(split)
    if size is not None and n > size:
      raise ValueError(f"task {self.name!r}: its options give only {size} distinct {split!r}"
                       f" instances, fewer than the {n} requested")
    bound = self.split_size_bound() if size is None else None
    if bound is not None and n > bound:
      raise ValueError(f"task {self.name!r}: its options give at most {bound} distinct"
                       f" instances in both splits together, fewer than the {n} {split!r}"
                       " instances requested")
    rng = np.random.default_rng([seed, split_idx])
    seen: set[str] = set()
    out: list[Example] = []
    budget, stall = self.max_draws(n), self.stall_draws()
    draws = since_new = 0
    while len(out) < n and draws < budget and since_new < stall:
      draws += 1
      since_new += 1
      ex = self.sample(rng)
      if ex is None:
        continue
      key = self.canonical(ex)
      if key in seen or split_of(self.split_key(ex), self.test_fraction) != split:
        continue
      seen.add(key)
      out.append(ex)
      since_new = 0
    if len(out) < n:
      why = f"its budget of {budget} draws ran out"
      if since_new >= stall:  # rarer instances may be left (``stall_draws``)
        rest = ("its options give no more, or only ones too rare to find" if size is None else
                f"the other {size - len(out)} of its {size} are too rare to find")
        why = f"none new in the last {since_new} of {draws} draws: {rest}"
      raise ValueError(f"task {self.name!r}: found only {len(out)} distinct {split!r} "
                       f"instances of the {n} requested ({why})")
    return out


TASKS: Registry[type[Task]] = Registry("task", key="task.name")


def check_options(name: str, options: Mapping[str, Any]) -> None:
  """ValueError when ``name`` is not a registered task or ``options`` holds a keyword its
  constructor does not take; nothing is built (no data file is read)."""
  if name not in TASKS:
    raise ValueError(TASKS.unknown_message(name))
  params = inspect.signature(TASKS.get(name)).parameters
  accepted = sorted(k for k, p in params.items()
                    if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
  unknown = sorted(set(options) - set(accepted))
  if unknown:
    raise ValueError(f"task {name!r} got unknown option(s) {unknown}; "
                     f"accepted: {accepted}")


def contract_problem(name: str) -> str | None:
  """What the registered task ``name``'s class leaves out of the :class:`Task` contract (an
  abstract method it does not implement: ``sample``, ``canonical`` or ``verify``), or None.
  Read from the class: nothing is built."""
  cls = TASKS.get(name)
  missing = sorted(getattr(cls, "__abstractmethods__", ()))
  if not missing:
    return None
  return (f"{name!r}: {cls.__name__} ({cls.__module__}) does not implement"
          f" {', '.join(missing)}; a task subclasses dllm_rl.tasks.base.Task and implements"
          " sample, canonical and verify")


def make_task(name: str, **kwargs: Any) -> Task:
  """Builds the registered task ``name``; ValueError on unknown names or kwargs."""
  check_options(name, kwargs)
  return TASKS.get(name)(**kwargs)
