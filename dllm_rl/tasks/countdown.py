"""Countdown: combine the given numbers with + - * / to hit a target.

Prompt: the numbers comma-separated, '>', the target, '=': ``"3,5,7>22="``.
Answer: an expression that uses every number exactly once, with minimal
parentheses and no spaces, e.g. ``"3*5+7"``. Division must be exact in the
reference answer; a completion is scored by value only (exact rationals), so any
expression over the same multiset of numbers that equals the target is correct.
Completions are parsed by ``safe_arith`` (bounded, never eval), so hostile text
just scores 0.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np

from dllm_rl.tasks.base import TASKS, Example, Task, VerifyResult, malformed
from dllm_rl.tasks.safe_arith import ATOM_PREC, PREC, ParseError, join, parse_expression


def combine(lhs: tuple[Fraction, str, int], op: str,
            rhs: tuple[Fraction, str, int]) -> tuple[Fraction, str, int] | None:
  """(value, text, precedence) of ``lhs op rhs``; None for inexact/zero division.

  Parentheses are added only where needed under left-to-right evaluation with
  the usual precedence (``safe_arith.join``: the right operand of '-' or '/' keeps them at
  equal precedence), so the text is its own canonical form.
  """
  (a, at, ap), (b, bt, bp) = lhs, rhs
  if op == "+":
    value = a + b
  elif op == "-":
    value = a - b
  elif op == "*":
    value = a * b
  else:
    if b == 0 or (a / b).denominator != 1:
      return None
    value = a / b
  return value, join(at, ap, op, bt, bp), PREC[op]


@TASKS.register("countdown")
class CountdownTask(Task):
  """``num_numbers`` numbers in [1, max_number], positive integer target ≤ max_target."""

  name = "countdown"
  size_options = ("num_numbers", "max_number", "max_target")
  many_answers = True  # every expression that uses the numbers once and hits the target

  def __init__(self, num_numbers: int = 3, max_number: int = 20, max_target: int = 100,
               test_fraction: float = 0.1):
    super().__init__(test_fraction)
    if num_numbers not in (3, 4):
      raise ValueError(f"num_numbers must be 3 or 4, got {num_numbers}")
    if not 1 <= max_number <= 10**6:
      raise ValueError(f"max_number must be in [1, 10**6], got {max_number}")
    if not 1 <= max_target <= 10**9:
      raise ValueError(f"max_target must be in [1, 10**9], got {max_target}")
    self.num_numbers = int(num_numbers)
    self.max_number = int(max_number)
    self.max_target = int(max_target)

  def sample(self, rng: np.random.Generator) -> Example | None:
    numbers = [int(x) for x in rng.integers(1, self.max_number + 1, size=self.num_numbers)]
    items = [(Fraction(x), str(x), ATOM_PREC) for x in numbers]
    while len(items) > 1:
      i, j = (int(k) for k in rng.choice(len(items), size=2, replace=False))
      # Random op order; '/' is skipped when the division is not exact.
      for op in rng.permutation(list("+-*/")):
        node = combine(items[i], str(op), items[j])
        if node is not None:
          break
      items = [it for k, it in enumerate(items) if k not in (i, j)] + [node]
    value, expr, _ = items[0]
    if value.denominator != 1 or not 1 <= value <= self.max_target:
      return None
    target = int(value)
    prompt = ",".join(map(str, numbers)) + f">{target}="
    return Example(prompt=prompt, answer=expr, meta={"numbers": numbers, "target": target})

  def canonical(self, example: Example) -> str:
    """Sorted numbers and target: reorderings of the numbers are the same instance."""
    nums = sorted(example.meta["numbers"])
    return ",".join(map(str, nums)) + f">{example.meta['target']}"

  def verify(self, example: Example, completion: str) -> VerifyResult:
    return grade_expression(completion.strip(), example.meta["numbers"], example.meta["target"])


def grade_expression(text: str, numbers, target) -> VerifyResult:
  """Reward 1 iff ``text`` parses (safe parser, never eval), uses each of ``numbers``
  exactly once and equals ``target``; otherwise 0 with the reason in ``info``. ``parsed`` is
  the expression's canonical text (``safe_arith``: no whitespace, no redundant parentheses), so
  spacing or parentheses that change nothing never make two answers distinct; ``1+2`` and
  ``2+1`` are different expressions and stay distinct."""
  try:
    value, literals, canonical = parse_expression(text)
  except ParseError as e:
    return malformed(f"parse error: {e}")
  numbers = [int(x) for x in numbers]
  info: dict = {"value": str(value), "target": int(target), "literals": literals}
  if Counter(literals) != Counter(numbers):
    info["reason"] = (f"must use each of {sorted(numbers)} exactly once, "
                      f"used {sorted(literals)}")
  elif value != target:
    info["reason"] = "wrong value"
  correct = "reason" not in info
  return VerifyResult(reward=float(correct), correct=correct, parsed=canonical,
                      info=info)
