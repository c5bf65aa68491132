"""Chain addition with a scratchpad: add k numbers one at a time, writing every partial sum.

Prompt: the k operands zero-padded to ``num_digits`` and written least-significant digit
first (the arithmetic task's ``reverse_operands``), joined by '+', then '=': 347 + 205 + 918
+ 66 → ``"743+502+819+660="``. Answer (the SFT target): k − 1 steps ``S+X=T`` separated by
',', each ``T = S + X``, where the first step adds two operands, every later step adds one
more operand to the previous step's sum, and every number is written reversed (sums
zero-padded to ``num_digits + 1``): ``"743+502=2550,2550+819=0741,0741+660=6351"`` (the total
1536 is the last sum). With 4 three-digit numbers the answer is 40 characters, so a
completion carries ≥ 32 scored tokens: the harder study testbed (issue 18,
``dllm_rl/config/testbeds.py: chain``).

Many correct answers: the operands may be added in any order (k! orders). The SFT answer
uses the prompt's order (``answer_order="prompt"``), a rotation of it drawn per example
(``"rotation"``: start at a random operand, then follow the prompt cyclically; k orders,
``dllm_rl/config/testbeds.py: chain_orders``), the prompt's order or its reverse drawn per
example (``"prompt_or_reverse"``: 2 orders, each step copying a neighbouring operand of the
prompt, as the prompt's order does) or a random order per example (``"random"``); with 6
one-digit numbers none of the last three warm-ups left validation accuracy 0 in 3000 steps,
and ``"prompt_or_reverse"`` reached 0.297 at step 4000 of an 8000-step schedule on one
machine (a 2-core AMD EPYC) but was still at 0 at step 4700 of the same run on another (a
2-core Intel Xeon; docs/study.md "Testbeds"). A completion is correct iff it is a
well-formed chain whose steps are all correct sums, whose first sum and added numbers use the
prompt's operands exactly once each, and whose last sum is the total.
``distinct_correct`` then counts the distinct orders a policy finds (StepRS's exploration
measure). Numbers are read by value, so zero padding is optional in a completion.

Instances are the multisets of operands (C(10**num_digits + num_numbers - 1, num_numbers)), a
multiset as likely as its orders are many: num_numbers equal operands one draw in
10**(num_digits * num_numbers). Each split's are counted (``split_size``) where the options
give at most ``MAX_COUNTED_KEYS`` multisets (6 one-digit numbers: 5,005); beyond (the defaults, 4
three-digit numbers: 4.2e10) they are not, and a request past a split's end is stopped by
``Task.stall_draws``.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from typing import Iterator

import numpy as np

from dllm_rl.tasks.base import (MAX_COUNTED_KEYS, TASKS, Example, Task, VerifyResult, count_splits,
                                malformed)

_STEP_RE = re.compile(r"([0-9]+)\+([0-9]+)=([0-9]+)")


def _rev(value: int, width: int) -> str:
  """``value`` zero-padded to ``width`` digits, least-significant digit first."""
  return f"{value:0{width}d}"[::-1]


def _value(reversed_digits: str) -> int:
  return int(reversed_digits[::-1])


def _step_text(i: int, s: int, x: int, t: int, num_digits: int) -> str:
  """Step ``i`` (from 0) of a scratchpad, ``s+x=t`` with reversed digits: the first sum ``s``
  (an operand) and ``x`` padded to ``num_digits``, the running sums to one digit more."""
  width = num_digits + 1
  return f"{_rev(s, num_digits if i == 0 else width)}+{_rev(x, num_digits)}={_rev(t, width)}"


def instance_key(operands) -> str:
  """The canonical string of an instance: its operands sorted, joined by '+'."""
  return "+".join(map(str, sorted(operands)))


def instance_keys(num_numbers: int, num_digits: int) -> Iterator[str]:
  """The canonical strings of every instance ``sample`` can draw: each multiset of
  ``num_numbers`` operands in [0, 10**num_digits), once."""
  for operands in itertools.combinations_with_replacement(range(10**num_digits), num_numbers):
    yield instance_key(operands)


def chain_answer(operands: list[int], num_digits: int) -> str:
  """The scratchpad that adds ``operands`` in the given order (module docstring)."""
  steps, total = [], operands[0]
  for i, x in enumerate(operands[1:]):
    steps.append(_step_text(i, total, x, total + x, num_digits))
    total += x
  return ",".join(steps)


@TASKS.register("chain")
class ChainTask(Task):
  """``num_numbers`` operands uniform in [0, 10**num_digits), added one at a time; the
  reference answer adds them in the prompt's order, a rotation of it, the prompt's order or
  its reverse, or a random order (``answer_order``)."""

  name = "chain"
  size_options = ("num_numbers", "num_digits")
  many_answers = True  # any order of the operands

  ANSWER_ORDERS = ("prompt", "rotation", "prompt_or_reverse", "random")

  def __init__(self, num_numbers: int = 4, num_digits: int = 3, answer_order: str = "prompt",
               test_fraction: float = 0.1):
    super().__init__(test_fraction)
    if answer_order not in self.ANSWER_ORDERS:
      raise ValueError(f"answer_order must be one of {self.ANSWER_ORDERS}, got {answer_order!r}")
    self.answer_order = answer_order
    if not 2 <= num_numbers <= 9:
      raise ValueError(f"num_numbers must be in [2, 9], got {num_numbers}")
    if not 1 <= num_digits <= 9:
      raise ValueError(f"num_digits must be in [1, 9], got {num_digits}")
    self.num_numbers = int(num_numbers)
    self.num_digits = int(num_digits)
    # Longest well-formed answer with generous padding; longer text is rejected unparsed.
    self._max_chars = 4 * (self.num_numbers - 1) * (self.num_digits + 3)

  def sample(self, rng: np.random.Generator) -> Example:
    operands = [int(x) for x in rng.integers(0, 10**self.num_digits, size=self.num_numbers)]
    prompt = "+".join(_rev(x, self.num_digits) for x in operands) + "="
    order = operands
    if self.answer_order == "rotation":
      shift = int(rng.integers(self.num_numbers))
      order = operands[shift:] + operands[:shift]
    elif self.answer_order == "prompt_or_reverse":
      order = operands[::-1] if rng.integers(2) else operands
    elif self.answer_order == "random":
      order = [operands[i] for i in rng.permutation(self.num_numbers)]
    return Example(prompt=prompt, answer=chain_answer(order, self.num_digits),
                   meta={"operands": operands, "total": sum(operands)})

  def canonical(self, example: Example) -> str:
    """Sorted operands: reorderings of the operands are the same instance."""
    return instance_key(example.meta["operands"])

  def count_split_sizes(self) -> dict[str, int] | None:
    """Each split's number of instances, counted (``instance_keys``) where the options give at most
    ``MAX_COUNTED_KEYS`` multisets; None beyond (module docstring)."""
    multisets = math.comb(10**self.num_digits + self.num_numbers - 1, self.num_numbers)
    if multisets > MAX_COUNTED_KEYS:
      return None
    return count_splits(instance_keys(self.num_numbers, self.num_digits), self.test_fraction)

  def enlarge_hint(self) -> str:
    """The options that give more instances, with their values (each up to 9)."""
    larger = [f"task.options.{option} (now {value})" for option, value in
              (("num_numbers", self.num_numbers), ("num_digits", self.num_digits)) if value < 9]
    if not larger:
      return super().enlarge_hint()
    return f"raise {' or '.join(larger)} for more distinct instances"

  def verify(self, example: Example, completion: str) -> VerifyResult:
    return grade_chain(completion.strip(), example.meta["operands"], self._max_chars,
                       self.num_digits)


def grade_chain(text: str, operands, max_chars: int = 4096, num_digits: int = 0) -> VerifyResult:
  """Reward 1 iff ``text`` is a correct scratchpad for ``operands`` in some order (module
  docstring); otherwise 0 with the first problem in ``info["reason"]``. ``parsed`` is the chain
  by value, written as :func:`chain_answer` pads it to ``num_digits`` (0: unpadded), so that
  two paddings of one order are one answer."""
  if len(text) > max_chars:
    return malformed(f"answer too long ({len(text)} characters)")
  operands = [int(x) for x in operands]
  steps = text.split(",")
  parsed = [_STEP_RE.fullmatch(s) for s in steps]
  if not all(parsed):
    bad = next(i for i, m in enumerate(parsed) if m is None)
    return malformed(f"step {bad + 1} is not 'S+X=T' with reversed digits: {steps[bad]!r}")
  values = [tuple(_value(g) for g in m.groups()) for m in parsed]
  info: dict = {"steps": len(values), "total": sum(operands)}
  used = [values[0][0]] + [x for _, x, _ in values]
  for i, (s, x, t) in enumerate(values):
    if i > 0 and s != values[i - 1][2]:
      info["reason"] = f"step {i + 1} starts from {s}, not the previous sum {values[i - 1][2]}"
    elif t != s + x:
      info["reason"] = f"step {i + 1}: {s}+{x} is not {t}"
    if "reason" in info:
      break
  if "reason" not in info and Counter(used) != Counter(operands):
    info["reason"] = f"must add each of {sorted(operands)} once, added {sorted(used)}"
  correct = "reason" not in info
  answer = ",".join(_step_text(i, s, x, t, num_digits) for i, (s, x, t) in enumerate(values))
  return VerifyResult(reward=float(correct), correct=correct, parsed=answer, info=info)
