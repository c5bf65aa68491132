"""Integer arithmetic "a op b" with answers optionally written digit-reversed.

Prompt: ``"123+456="``; with ``pad_operands`` (default) operands are
zero-padded to ``num_digits`` (``"007+045="``), so digit columns sit at fixed
positions; with ``reverse_operands`` they are also written least-significant
digit first (``"700+540="``), so every answer digit sits at the same offset from
the operand digits it depends on (a tiny model then learns the task in a few
hundred steps instead of stalling). Answer: the result; with ``reverse_answer`` (default) its
digits are written least-significant first, which is easier for tiny models to
produce left to right: 123+456=579 → ``"975"``. A negative result keeps its sign
first, then the reversed digits of its magnitude: 12-345=-333 → ``"-333"``,
5-20=-15 → ``"-51"``.

Instances are the |ops| * 10**(2 * num_digits) triples (a, op, b), all equally likely; each
split's are counted (``split_size``) up to 2 digits (at most 30,000); from 3 digits (10**6 per
op, ~1 s to hash at every run's start) they are not, and a request past a split's end is
stopped by ``Task.stall_draws``.
"""

from __future__ import annotations

import re
from typing import Iterator

import numpy as np

from dllm_rl.tasks.base import (MAX_COUNTED_KEYS, TASKS, Example, Task, VerifyResult, count_splits,
                                malformed)

_ANSWER_RE = re.compile(r"-?[0-9]+")
_OPS = "+-*"


def format_answer(value: int, reverse: bool) -> str:
  """Writes ``value`` in the answer convention (sign first, digits maybe reversed)."""
  digits = str(abs(value))
  if reverse:
    digits = digits[::-1]
  return ("-" if value < 0 else "") + digits


def parse_answer(text: str, reverse: bool) -> int | None:
  """Inverse of ``format_answer`` (leading/trailing zeros allowed); None if malformed."""
  if not _ANSWER_RE.fullmatch(text):
    return None
  sign = -1 if text.startswith("-") else 1
  digits = text.lstrip("-")
  return sign * int(digits[::-1] if reverse else digits)


def instance_key(a: int, op: str, b: int) -> str:
  """The canonical string of an instance: ``"12+345"``."""
  return f"{a}{op}{b}"


def instance_keys(num_digits: int, ops: str) -> Iterator[str]:
  """The canonical strings of every instance ``sample`` can draw (each once)."""
  hi = 10**num_digits
  for op in ops:
    for a in range(hi):
      for b in range(hi):
        yield instance_key(a, op, b)


def apply_op(a: int, op: str, b: int) -> int:
  """a op b for op in "+-*"."""
  if op == "+":
    return a + b
  if op == "-":
    return a - b
  if op == "*":
    return a * b
  raise ValueError(f"unsupported op {op!r}")


@TASKS.register("arithmetic")
class ArithmeticTask(Task):
  """a op b with operands uniform in [0, 10**num_digits) and op uniform over ``ops``."""

  name = "arithmetic"
  size_options = ("num_digits", "ops")

  def __init__(self, num_digits: int = 3, ops: str = "+", reverse_answer: bool = True,
               pad_operands: bool = True, reverse_operands: bool = False,
               test_fraction: float = 0.1):
    super().__init__(test_fraction)
    if not 1 <= num_digits <= 18:
      raise ValueError(f"num_digits must be in [1, 18], got {num_digits}")
    if not ops or any(op not in _OPS for op in ops) or len(set(ops)) != len(ops):
      raise ValueError(f"ops must be distinct characters from {_OPS!r}, got {ops!r}")
    self.num_digits = int(num_digits)
    self.ops = str(ops)
    self.reverse_answer = bool(reverse_answer)
    self.pad_operands = bool(pad_operands)
    self.reverse_operands = bool(reverse_operands)
    # Longest well-formed answer: sign + 2*num_digits digits; anything far longer
    # is rejected before int() sees it.
    self._max_answer_chars = 2 * self.num_digits + 8

  def sample(self, rng: np.random.Generator) -> Example:
    hi = 10**self.num_digits
    a, b = int(rng.integers(0, hi)), int(rng.integers(0, hi))
    op = self.ops[int(rng.integers(0, len(self.ops)))]
    value = apply_op(a, op, b)
    width = self.num_digits if self.pad_operands else 0
    x, y = f"{a:0{width}d}", f"{b:0{width}d}"
    if self.reverse_operands:
      x, y = x[::-1], y[::-1]
    return Example(prompt=f"{x}{op}{y}=",
                   answer=format_answer(value, self.reverse_answer),
                   meta={"a": a, "b": b, "op": op, "value": value})

  def canonical(self, example: Example) -> str:
    m = example.meta
    return instance_key(m["a"], m["op"], m["b"])

  def count_split_sizes(self) -> dict[str, int] | None:
    """Each split's number of instances, counted (``instance_keys``) up to 2 digits; None from 3
    (module docstring)."""
    if len(self.ops) * 100**self.num_digits > MAX_COUNTED_KEYS:
      return None
    return count_splits(instance_keys(self.num_digits, self.ops), self.test_fraction)

  def enlarge_hint(self) -> str:
    """The options that give more instances, with their values: more digits (up to 18), the
    ops ``ops`` leaves out."""
    larger = []
    if self.num_digits < 18:
      larger.append(f"raise task.options.num_digits (now {self.num_digits})")
    missing = "".join(op for op in _OPS if op not in self.ops)
    if missing:
      larger.append(f"add {' or '.join(map(repr, missing))} to task.options.ops"
                    f" (now {self.ops!r})")
    if not larger:
      return super().enlarge_hint()
    return f"{' or '.join(larger)} for more distinct instances"

  def verify(self, example: Example, completion: str) -> VerifyResult:
    text = completion.strip()
    if len(text) > self._max_answer_chars:
      return malformed(f"answer too long ({len(text)} characters)")
    value = parse_answer(text, self.reverse_answer)
    if value is None:
      return malformed("answer is not an optional '-' followed by digits")
    target = int(example.meta["value"])
    correct = value == target
    info = {"value": value, "target": target}
    if not correct:
      info["reason"] = "wrong value"
    # parsed by value, in the answer convention: "975" and "9750" (a reversed 579 with a
    # leading zero) are one answer
    return VerifyResult(reward=float(correct), correct=correct,
                        parsed=format_answer(value, self.reverse_answer), info=info)
