"""The base of the tasks read from JSON Lines files (:mod:`dllm_rl.tasks.jsonl`, the code
task): options, reading and parsing a file once per run (skipping or raising on malformed
lines), splits, and grading in a worker process.

Files are read through :mod:`dllm_rl.paths`, so a ``gs://`` file works like a
local one (``python -m dllm_rl.data prepare`` writes them). Splits come from
``train_file`` and ``test_file``; without ``test_file`` the test split is carved
out of ``train_file`` by ``split_of`` on the question, like the generated tasks;
without ``train_file`` the task has a test split only (MATH-500: evaluation).
``generate(split, n, seed)`` returns the first n records of the split after a shuffle
seeded by (seed, split), so it is a pure function of the files and its arguments; n = -1
means every record.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import logging
import threading
from typing import Any, Callable, Mapping

import numpy as np

from dllm_rl import paths
from dllm_rl.tasks import prompts, verifiers
from dllm_rl.tasks.timed_verifier import TimedVerifier
from dllm_rl.tasks.base import TASKS, Example, Task, VerifyResult, check_split, malformed, split_of
from dllm_rl.tasks.jsonl_lines import BadRecord, not_jsonl, parse_line

ON_ERROR = ("raise", "skip")
MATH_VERIFY_TIMEOUT = 5.0  # seconds per math-verify grading, in a worker (MATH, GSM8K by it)
_MAX_SKIP_REASONS = 20
_PARSED: dict[tuple, tuple] = {}  # what JsonlTask._parse found, by the file's bytes (_load)
_PARSED_MAX = 2  # a run's train and test file
# A file of more bytes than this (its records take ~4x in memory) has its records kept for one
# later build only (validation, then the run); kept after it, they would outlive every task
# that uses them for the process's lifetime. What its warning said is kept like a small file's.
_PARSED_KEEP_BYTES = 64 << 20


class NoRecords(ValueError):
  """A data file that holds no record (empty, or every line skipped): a smaller split size
  does not help, so callers name the file's option (``option``: "train_file" / "test_file")
  rather than the size."""

  def __init__(self, message: str, option: str):
    super().__init__(message)
    self.option = option


class JsonlTask(Task):
  """Base of the file-backed tasks.

  Options: ``train_file`` / ``test_file`` (paths; FileNotFoundError naming a
  missing one, IsADirectoryError a folder); ``on_error``: "raise" (ValueError
  "file:line: what is wrong", a line that is not UTF-8 included, and a first line
  that opens a JSON array) or "skip" (malformed lines are dropped and counted in
  ``skipped``, the first few described in ``skip_reasons``); a file that is not
  JSON Lines text at all (compressed, an archive, Parquet, Arrow, UTF-16:
  :func:`not_jsonl`) is a ValueError saying what it is and what to do, with
  either; ``prompt_template``: a format string
  over ``{question}`` and the task's own fields; ``prompt_preset``: a named
  template set instead (:data:`dllm_rl.tasks.prompts.PROMPT_PRESETS`, e.g.
  "d1"); ``answer_tag``: the reward reads only the last ``<answer>`` span (to the end when
  unclosed; Countdown and Sudoku: the last closed ``<answer>...</answer>``, as d1; a
  completion without one scores 0); None = the preset's choice for the task (False without
  one; d1: MATH reads no span, it needs a ``\\boxed{}`` answer anywhere instead);
  ``verify_timeout``: seconds per verification in a worker process
  (``timed_verifier.TimedVerifier``), 0 = in process, None = the task's default;
  ``test_fraction``: without ``test_file``, the share of ``train_file`` held out
  as the test split (default 0.1; with a ``test_file`` it is an error to give it);
  ``wrong_reward`` (in [-1, 0]): the reward of a parsed wrong answer that earns nothing
  (StableDRL: -1, with ``rl.malformed_reward`` -1 for one that does not parse). The
  ``stabledrl`` preset grades GSM8K by math-verify on the whole completion, as StableDRL does.

  Subclasses implement ``_fields(record)`` → (template fields, SFT answer,
  verifier meta), raising ``BadRecord`` (and may check the SFT answer against the task's
  options in ``_check_target``); ``_checker()`` and ``_args(example)``
  name the module-level verifier and its arguments after the completion.
  """

  char_text = False  # text written elsewhere: a real tokenizer (model.hf_checkpoint's)
  recipe = ""  # the dllm-rl-data prepare data set that writes this task's files
  default_question = "{question}"
  default_verify_timeout = 0.0  # seconds; 0 = verify in-process
  preload: tuple[str, ...] = ()  # modules the verifier worker imports up front
  # With answer_tag: read the last closed <answer>...</answer> (no closed pair: 0), as d1's
  # Countdown and Sudoku rewards do; False reads the last <answer> to the end when unclosed,
  # as d1's extract_xml_answer (GSM8K).
  closed_answer = False
  # The choices of the task option ``reward`` (the first is the default; a preset may name
  # another, :attr:`dllm_rl.tasks.prompts.Preset.rewards`); none: the task has no such option.
  # "d1": d1's reward functions, as run (:meth:`_d1_reward`).
  rewards: tuple[str, ...] = ()

  def __init__(self, train_file: str = "", test_file: str = "", on_error: str = "raise",
               prompt_template: str = "{question}", test_fraction: float | None = None,
               verify_timeout: float | None = None, prompt_preset: str = "",
               answer_tag: bool | None = None, wrong_reward: float = 0.0,
               reward: str | None = None):
    if test_fraction is not None and test_file:
      raise ValueError(f"task {self.name!r}: test_fraction splits the test set off train_file"
                       f" when there is no test_file; with test_file={str(test_file)!r} it is"
                       " not read: leave it out")
    super().__init__(0.1 if test_fraction is None else test_fraction)  # default: 10 %
    if not train_file and not test_file:
      raise ValueError(f"task {self.name!r} needs option train_file and/or test_file")
    if on_error not in ON_ERROR:
      raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    self.train_file, self.test_file = str(train_file), str(test_file)
    self.on_error, self.prompt_template = on_error, str(prompt_template)
    self.answer_tag = bool(answer_tag)
    self.needs_boxed = False  # the reward needs a \boxed{} answer (0 without one)
    self.math_verify = False  # graded by math-verify (the preset's choice for GSM8K)
    if not -1.0 <= wrong_reward <= 0.0:  # nan too
      raise ValueError(f"task {self.name!r}: wrong_reward must be in [-1, 0], got {wrong_reward!r}")
    self.wrong_reward = float(wrong_reward)
    if prompt_preset:
      if self.prompt_template != "{question}":
        raise ValueError(f"task {self.name!r}: give prompt_preset or prompt_template, not both "
                         f"(got {prompt_preset!r} and {prompt_template!r})")
      found = prompts.preset(prompt_preset, self.name)
      self.prompt_template = found.templates[self.name]
      tagged = self.name in found.answer_tag
      self.answer_tag = tagged if answer_tag is None else bool(answer_tag)
      self.needs_boxed = self.name in found.boxed
      self.math_verify = self.name in found.math_verify
      if self.math_verify:  # its worker imports math-verify before the first deadline
        self.preload = ("math_verify",)
      reward = found.rewards.get(self.name) if reward is None else reward
    if reward is not None and reward not in self.rewards:
      raise ValueError(f"task {self.name!r}: reward must be one of {self.rewards}, got"
                       f" {reward!r}")
    self.reward = reward if reward is not None else (self.rewards or (None,))[0]
    default_timeout = MATH_VERIFY_TIMEOUT if self.math_verify else self.default_verify_timeout
    self.verify_timeout = float(default_timeout if verify_timeout is None else verify_timeout)
    if not 0 <= self.verify_timeout < float("inf"):  # nan too
      raise ValueError(f"task {self.name!r}: verify_timeout must be a finite number of seconds"
                       f" >= 0 (0 = verify in-process), got {verify_timeout!r}")
    self.skipped = 0
    self.skip_reasons: list[str] = []
    self._file_skips: dict[str, tuple[int, str]] = {}  # path → (lines skipped, the first)
    paths = dict.fromkeys(p for p in (self.train_file, self.test_file) if p)
    self._records = {path: self._load(path) for path in paths}  # each file read once
    self._timed: TimedVerifier | None = None
    self._timed_lock = threading.Lock()

  # --- loading --------------------------------------------------------------

  def _prompt(self, fields: Mapping[str, Any]) -> str:
    try:
      return self.prompt_template.format(**fields)
    except (KeyError, IndexError, ValueError) as err:
      raise ValueError(f"task {self.name!r}: prompt_template {self.prompt_template!r} "
                       f"cannot be filled ({type(err).__name__}: {err}); available "
                       f"fields: {sorted(fields)}") from err

  def _load(self, path: str) -> list[Example]:
    paths.check_backend(path)  # gs:// without gcsfs: BackendMissing naming the package
    file = paths.resolve(path)
    if file.is_dir():
      raise IsADirectoryError(f"task {self.name!r}: data file {path!r} is a directory, not a "
                              "file (give the .jsonl file in it)")
    if not file.is_file():
      raise FileNotFoundError(f"task {self.name!r}: data file {path!r} does not exist")
    with file.open("rb") as f:  # bytes: a line that is not UTF-8 is named (or skipped) like
      raw = f.read()  # any other; splitlines splits at \n, \r\n and \r, as text mode does
    split = "train" if path == self.train_file else "test"
    convert = (f"dllm-rl-data prepare {self.recipe} --out DIR --source {split}={{}} (docs/data.md),"
               f" then give DIR/{split}.jsonl")
    problem = not_jsonl(raw, path, convert)
    if problem:  # the whole file, whatever on_error says: no line of it is a record
      raise ValueError(f"task {self.name!r}: {path}: {problem}")
    # what the lines give depends on the bytes and on these alone: a task built again on the
    # same file (validation, then the run) takes the records parsed, and the warning given,
    # by the first (the records shared, not copied: the cache holds no second copy)
    key = (type(self), self.on_error, self.prompt_template, self.answer_tag, self.reward,
           split, path, hashlib.blake2b(raw, digest_size=16).digest())
    parsed = _PARSED.pop(key, None)  # put back as the newest
    hit = parsed is not None and parsed[0] is not None
    if not hit:  # not parsed yet, or a large file whose records a build took: warned already
      parsed = self._parse(path, raw, convert, parsed is None)  # warn: not yet
    out, skipped, first_skip, reasons = parsed
    large = len(raw) > _PARSED_KEEP_BYTES  # taken once: the records are left to the tasks
    _PARSED[key] = (None, skipped, first_skip, reasons) if hit and large else parsed
    while len(_PARSED) > _PARSED_MAX:
      del _PARSED[next(iter(_PARSED))]  # the least recently built
    self.skip_reasons += reasons[:_MAX_SKIP_REASONS - len(self.skip_reasons)]
    self.skipped += skipped
    self._file_skips[path] = (skipped, first_skip)
    return list(out)  # the cached list stays as parsed whatever a caller does with this one

  def _parse(self, path: str, raw: bytes, convert: str,
             warn: bool = True) -> tuple[list[Example], int, str, list]:
    """The records of the file ``path`` (its bytes ``raw``), the number of lines skipped, the
    first skipped line and the first few (``where: what``); warns when lines were skipped
    (``warn``: not already)."""
    lines = raw.removeprefix(codecs.BOM_UTF8).splitlines()  # a leading BOM: see not_jsonl
    first = next((i for i, data in enumerate(lines, start=1) if data.strip()), 0)
    out, skipped, first_skip, reasons = [], 0, "", []
    for line_no, data in enumerate(lines, start=1):
      if not data.strip():
        continue
      try:
        record = parse_line(data, path, convert, first=line_no == first)
        fields, answer, meta = self._fields(record)
        if answer:  # refused before any compile: an SFT target the reward scores as wrong
          self._check_target(answer, meta)
        if self.answer_tag and answer:  # an SFT target the reward reads
          answer = "<reasoning>{}</reasoning>\n<answer>{}</answer>".format(
              *self._reasoning_and_answer(answer))
        fields["question"] = self.default_question.format(**fields)
      except BadRecord as err:
        where = f"{path}:{line_no}: {err}"
        if self.on_error == "raise":
          raise ValueError(f"task {self.name!r}: {where}") from None
        skipped += 1
        first_skip = first_skip or where
        if len(reasons) < _MAX_SKIP_REASONS:
          reasons.append(where)
        continue
      out.append(Example(prompt=self._prompt(fields), answer=answer,
                         meta={**meta, "key": self._key(fields)}, source=f"{path}:{line_no}"))
    if skipped and warn:  # the first one's line and problem: which lines, not only how many
      logging.warning("task %r: skipped %d malformed line(s) of %s (on_error='skip'; the first:"
                      " %s)", self.name, skipped, path, first_skip)
    return out, skipped, first_skip, reasons

  @classmethod
  def _fields(cls, record: Mapping[str, Any]) -> tuple[dict, str, dict]:
    raise NotImplementedError

  def _check_target(self, answer: str, meta: Mapping[str, Any]) -> None:
    """Raises ``BadRecord`` when the SFT target ``answer`` (as the record gives it, before the
    ``answer_tag`` tags) is one this task's ``reward`` would not score as correct;
    ``_fields`` checks a record alone, without the options. Nothing by default."""

  @classmethod
  def _reasoning_and_answer(cls, answer: str) -> tuple[str, str]:
    """An SFT target as (reasoning, final answer), for the tagged target the reward reads under
    ``answer_tag``: ``<reasoning>R</reasoning>\\n<answer>A</answer>``, d1's SFT format
    (SFT/sft_trainer.py @837888f, preprocess_dataset). The whole target is the answer here."""
    return "", answer.strip()

  def _key(self, fields: Mapping[str, Any]) -> str:
    """The instance's canonical string (decides the split without test_file)."""
    return fields["question"]

  def _pool(self, split: str) -> tuple[list[Example], str]:
    """Records of ``split`` and a description of where they come from."""
    if split == "test" and self.test_file:
      return self._records[self.test_file], self.test_file
    if not self.train_file:
      raise ValueError(f"task {self.name!r} has no train_file, so no {split!r} split")
    if self.test_file:
      return self._records[self.train_file], self.train_file
    pool = [ex for ex in self._records[self.train_file]
            if split_of(self.canonical(ex), self.test_fraction) == split]
    return pool, f"the {split!r} part of {self.train_file} (test_fraction={self.test_fraction})"

  # --- Task interface -------------------------------------------------------

  def has_split(self, split: str) -> bool:
    """train: needs ``train_file``; test: ``test_file`` or a share of ``train_file``."""
    check_split(split)
    return bool(self.train_file) if split == "train" else bool(self.test_file or self.train_file)

  def sample(self, rng: np.random.Generator) -> Example | None:
    raise NotImplementedError(f"task {self.name!r} reads its examples from files; "
                              "use generate()")

  def canonical(self, example: Example) -> str:
    return example.meta["key"]

  def enlarge_hint(self) -> str:
    return "give a larger file"

  def generate(self, split: str, n: int, seed: int) -> list[Example]:
    """The first n examples of ``split`` after a shuffle seeded by (seed, split);
    n = -1 for all of them. ValueError if the split has fewer than n."""
    split_idx = check_split(split)
    if n < -1 or seed < 0:
      raise ValueError(f"n must be >= -1 and seed >= 0, got n={n}, seed={seed}")
    pool, source = self._pool(split)
    file = self.test_file if split == "test" and self.test_file else self.train_file
    if n > 0 and not self._records[file]:  # not "has only 0": why the file gave none
      skipped, first = self._file_skips[file]
      why = (f"each of its {skipped} line(s) was skipped as malformed (on_error='skip'; the"
             f" first: {first})" if skipped else "the file is empty (blank lines at most)")
      raise NoRecords(f"task {self.name!r}: asked for {n} {split!r} examples but {file} holds"
                      f" no record: {why}",
                      "test_file" if file == self.test_file else "train_file")
    if n > len(pool):
      raise ValueError(f"task {self.name!r}: asked for {n} {split!r} examples but "
                       f"{source} has only {len(pool)}")
    perm = np.random.default_rng([seed, split_idx]).permutation(len(pool))
    return [pool[i] for i in perm[:len(pool) if n == -1 else n]]

  def _checker(self) -> Callable[..., VerifyResult]:
    """The module-level function that scores (completion, **meta-derived args)."""
    raise NotImplementedError

  def _args(self, example: Example) -> tuple:
    raise NotImplementedError

  def verify(self, example: Example, completion: str) -> VerifyResult:
    result = self._verified(example, completion)
    if self.reward == "d1":  # d1's sum, format terms included: never malformed, as in d1
      score = self._d1_reward(example, completion, result.correct)
      return VerifyResult(score, result.correct, "" if result.parsed is None else result.parsed,
                          {**result.info, "d1_reward": score})
    if self.wrong_reward and not result.correct and result.parsed is not None \
        and result.reward == 0.0:  # a wrong answer (not one with partial or format credit)
      return dataclasses.replace(result, reward=self.wrong_reward)
    return result

  def _d1_reward(self, example: Example, completion: str, correct: bool) -> float:
    """d1's reward of ``completion`` (``reward="d1"``), ``correct`` as this task grades it."""
    raise NotImplementedError

  def _verified(self, example: Example, completion: str) -> VerifyResult:
    """The task's verifier on the part of ``completion`` the preset reads."""
    if self.answer_tag:
      if "<answer>" not in completion:
        return malformed("no <answer> tag")
      if self.closed_answer:
        completion = verifiers.closed_answer_span(completion)
        if completion is None:
          return malformed("no closed <answer>...</answer>")
        # d1 grades the whole body, where an "<answer>" is text; the checkers' answer_span
        # would cut at it ("<answer>x<answer>3*5+7</answer>": d1 reads "x<answer>3*5+7")
        completion = completion.replace("<answer>", "<answer >")
      else:
        completion = verifiers.answer_span(completion)
    if self.needs_boxed and verifiers.last_boxed(completion) is None:
      return malformed("no \\boxed{} answer")
    return self._graded(completion, example)

  def _graded(self, completion: str, example: Example) -> VerifyResult:
    """The verifier's result, in a worker process under ``verify_timeout``."""
    fn, args = self._checker(), self._args(example)
    if self.verify_timeout <= 0:
      return fn(completion, *args)
    with self._timed_lock:  # one worker, also when verify runs on threads (parallel_verify)
      if self._timed is None:
        self._timed = TimedVerifier(fn, self.verify_timeout, preload=self.preload)
    return self._timed(completion, *args)

  def close(self) -> None:
    """Stops the verifier worker process, if any."""
    if self._timed is not None:
      self._timed.close()


def record_problem(task_name: str, record: Mapping[str, Any]) -> str | None:
  """What is wrong with ``record`` as one line of the files of JSONL task ``task_name``
  (None: nothing), by the same checks as loading."""
  cls = TASKS.get(task_name)
  if not issubclass(cls, JsonlTask):
    raise ValueError(f"task {task_name!r} does not read JSONL files")
  if not isinstance(record, dict):
    return f"expected a JSON object, got {type(record).__name__}"
  try:
    cls._fields(record)
  except BadRecord as err:
    return str(err)
  return None
