"""Sum split: write a given number as the sum of two ``num_digits``-digit numbers.

Prompt: the target T, zero-padded to ``num_digits + 1`` digits, then ``=``. Answer: ``x+y``
with x + y = T and 0 ≤ x, y < 10**num_digits, each zero-padded to ``num_digits`` digits. With
``reverse`` (default) every number is written least-significant digit first, as the embedded
default's addition writes them (``dllm_rl/tasks/arithmetic.py``), so answer digit i of y sits
at a fixed offset from digit i of T and of x: 456 = 123 + 333 → prompt ``"6540="``, answer
``"321+333"``.

A target has min(T, 2·(10**d − 1) − T) + 1 correct answers (up to 10**d), and the SFT answer
draws x uniformly among them per example, so a warm-up policy writes different correct
answers to one prompt: StepRS's exploration measure (distinct correct answers per prompt,
pass@k) has room to grow or shrink, unlike addition's one answer. Instances are (T, x) pairs;
the split is decided by T alone (``split_key``), so a test target is never trained on with
any answer. Validation examples are training-split targets with answers not trained on
(their targets may appear in training with other answers).

A completion is correct iff it is two digit strings of at most ``num_digits`` digits joined by
``+`` whose values sum to T; the parsed answer is ``"x+y"`` by value (zero padding optional),
so ``distinct_correct`` counts distinct (x, y) pairs.

A split holds the (T, x) pairs of its targets: counted (``split_size``) from the targets, each
hashed once, up to 5 digits (199,999 targets); beyond, not (a request past a split's end is
stopped by ``Task.stall_draws``). A pair of a middle target is one draw in
~2 * 10**(2 * num_digits).
"""

from __future__ import annotations

import re

import numpy as np

from dllm_rl.tasks.base import (MAX_COUNTED_KEYS, TASKS, Example, Task, VerifyResult, malformed,
                                split_of)


@TASKS.register("sum_split")
class SumSplitTask(Task):
  """T uniform in [0, 2·(10**num_digits − 1)], then the SFT answer's x uniform among T's
  splits (module docstring)."""

  name = "sum_split"
  size_options = ("num_digits",)
  many_answers = True  # every x in [max(0, T − 10**d + 1), min(T, 10**d − 1)]

  def __init__(self, num_digits: int = 3, reverse: bool = True, test_fraction: float = 0.1):
    super().__init__(test_fraction)
    if not 1 <= num_digits <= 9:
      raise ValueError(f"num_digits must be in [1, 9], got {num_digits}")
    self.num_digits = int(num_digits)
    self.reverse = bool(reverse)
    self._hi = 10**self.num_digits - 1  # largest addend
    self._answer_re = re.compile(rf"([0-9]{{1,{self.num_digits}}})\+([0-9]{{1,{self.num_digits}}})")

  def _write(self, value: int, width: int) -> str:
    text = f"{value:0{width}d}"
    return text[::-1] if self.reverse else text

  def _read(self, digits: str) -> int:
    return int(digits[::-1] if self.reverse else digits)

  def num_answers(self, target: int) -> int:
    """How many (x, y) pairs of addends sum to ``target``."""
    return max(0, min(target, 2 * self._hi - target) + 1)

  def sample(self, rng: np.random.Generator) -> Example:
    target = int(rng.integers(0, 2 * self._hi + 1))
    x = int(rng.integers(max(0, target - self._hi), min(target, self._hi) + 1))
    d = self.num_digits
    return Example(prompt=self._write(target, d + 1) + "=",
                   answer=f"{self._write(x, d)}+{self._write(target - x, d)}",
                   meta={"target": target, "x": x})

  def canonical(self, example: Example) -> str:
    return f"{example.meta['target']}={example.meta['x']}"

  def split_key(self, example: Example) -> str:
    return str(example.meta["target"])

  def count_split_sizes(self) -> dict[str, int] | None:
    """Each split's number of instances, the (T, x) pairs of the split's targets, where the options
    give at most ``MAX_COUNTED_KEYS`` targets; None beyond (module docstring)."""
    if 2 * self._hi + 1 > MAX_COUNTED_KEYS:
      return None
    counts = {"train": 0, "test": 0}
    for target in range(2 * self._hi + 1):
      counts[split_of(str(target), self.test_fraction)] += self.num_answers(target)
    return counts

  def enlarge_hint(self) -> str:
    """More digits give more instances (up to 9)."""
    if self.num_digits >= 9:
      return super().enlarge_hint()
    return f"raise task.options.num_digits (now {self.num_digits}) for more distinct instances"

  def verify(self, example: Example, completion: str) -> VerifyResult:
    text = completion.strip()
    if len(text) > 2 * self.num_digits + 1:
      return malformed(f"answer too long ({len(text)} characters)")
    m = self._answer_re.fullmatch(text)
    if m is None:
      return malformed(f"answer is not two numbers of at most {self.num_digits} digits "
                       "joined by '+'")
    x, y = self._read(m.group(1)), self._read(m.group(2))
    target = int(example.meta["target"])
    correct = x + y == target
    info = {"x": x, "y": y, "target": target}
    if not correct:
      info["reason"] = f"{x}+{y} is {x + y}, not {target}"
    return VerifyResult(reward=float(correct), correct=correct, parsed=f"{x}+{y}", info=info)
