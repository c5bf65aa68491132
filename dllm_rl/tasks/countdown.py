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

import itertools
import math
from collections import Counter
from fractions import Fraction
from typing import Iterator, Union

import numpy as np

from dllm_rl.tasks.base import TASKS, Example, Task, VerifyResult, malformed, split_of
from dllm_rl.tasks.safe_arith import ATOM_PREC, PREC, ParseError, join, parse_expression

Value = Union[int, Fraction]
_OPS = ("+", "-", "*", "/")  # rng.permutation(4) indexes them
# Options with at most this many multisets of numbers (by num_numbers) have their instances
# counted, in a second at most (3 numbers up to 38, 4 up to 13): a split asked for more than it
# has fails at once, not after the hundreds of thousands of draws that find its rarest ones.
COUNT_LIMIT = {3: 10_000, 4: 2_000}
# At most this many distinct positive values (targets) come from one multiset of num_numbers
# numbers (``instance_keys``' ``values``): two values u, v give at most six (u+v, u*v, u-v,
# v-u, u/v, v/u), of which at most four are positive (u-v and v-u are opposites; u/v and v/u
# are both exact only when |u| = |v|, and then equal). 3 numbers: 3 pairs to combine first,
# 6 results each, then 4 positive at most: 72; 4 numbers: 6 pairs, 6 results, then 72 each.
MAX_TARGETS = {3: 3 * 6 * 4, 4: 6 * 6 * 3 * 6 * 4}


def combine(lhs: tuple[Value, str, int], op: str,
            rhs: tuple[Value, str, int]) -> tuple[Value, str, int] | None:
  """(value, text, precedence) of ``lhs op rhs``; None for inexact/zero division.

  Values are integers (``int``, or integral ``Fraction``: every value ``sample`` builds is an
  integer, division being exact). Parentheses are added only where needed under
  left-to-right evaluation with the usual precedence (``safe_arith.join``: the right operand
  of '-' or '/' keeps them at equal precedence), so the text is its own canonical form.
  """
  (a, at, ap), (b, bt, bp) = lhs, rhs
  if op == "+":
    value = a + b
  elif op == "-":
    value = a - b
  elif op == "*":
    value = a * b
  else:
    if b == 0 or a % b:
      return None
    value = a // b
  return value, join(at, ap, op, bt, bp), PREC[op]


def two_distinct(rng: np.random.Generator, m: int) -> tuple[int, int]:
  """Two distinct indices in [0, m), m >= 2: the pair ``rng.choice(m, size=2, replace=False)``
  gives, from the same draws (numpy 2's Floyd sampling: one in [0, m-2], none when m = 2, one
  in [0, m-1], taken as m-1 when it repeats the first; then the pair's shuffle, one draw in
  [0, 1]), at half its cost (no array set-up)."""
  a = int(rng.integers(m - 1)) if m > 2 else 0
  b = int(rng.integers(m))
  if b == a:
    b = m - 1
  return (a, b) if rng.integers(2) else (b, a)


def instance_key(numbers, target: int) -> str:
  """The canonical string of an instance: its numbers sorted, '>', the target."""
  return ",".join(map(str, sorted(numbers))) + f">{target}"


def _results(a: int, b: int) -> tuple[int, ...]:
  """``a op b`` for the ops ``combine`` accepts (division only when exact)."""
  exact = b != 0 and a % b == 0
  return (a + b, a - b, a * b, a // b) if exact else (a + b, a - b, a * b)


def instance_keys(num_numbers: int, max_number: int, max_target: int) -> Iterator[str]:
  """The canonical strings (``instance_key``) of every instance ``sample`` can draw: a
  multiset of ``num_numbers`` numbers in [1, max_number] with a target in [1, max_target]
  that some expression over the numbers (each once; + - * and exact /, any order and grouping)
  equals. ``sample`` reaches each: it combines any two items with any op that succeeds."""
  memo: dict[tuple[int, ...], set[int]] = {}

  def values(items: tuple[int, ...]) -> set[int]:
    if len(items) == 1:
      return set(items)
    if items not in memo:
      out: set[int] = set()
      for i, j in itertools.permutations(range(len(items)), 2):
        rest = [x for k, x in enumerate(items) if k != i and k != j]
        for v in _results(items[i], items[j]):
          out |= values(tuple(sorted(rest + [v])))
      memo[items] = out
    return memo[items]

  for numbers in itertools.combinations_with_replacement(range(1, max_number + 1), num_numbers):
    for target in sorted(values(numbers)):
      if 1 <= target <= max_target:
        yield instance_key(numbers, target)


def count_instances(num_numbers: int, max_number: int, max_target: int,
                    test_fraction: float) -> dict[str, int]:
  """How many of ``instance_keys`` fall in each split (``split_of``)."""
  counts = {"train": 0, "test": 0}
  for key in instance_keys(num_numbers, max_number, max_target):
    counts[split_of(key, test_fraction)] += 1
  return counts


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
    numbers = rng.integers(1, self.max_number + 1, size=self.num_numbers).tolist()
    items = [(x, str(x), ATOM_PREC) for x in numbers]
    while len(items) > 1:
      i, j = two_distinct(rng, len(items))
      # Random op order; '/' is skipped when the division is not exact ('+' never fails).
      # rng.permutation(4) draws as rng.permutation(list("+-*/")) did: one shuffle of 4.
      for o in rng.permutation(4).tolist():
        node = combine(items[i], _OPS[o], items[j])
        if node is not None:
          break
      items = [it for k, it in enumerate(items) if k not in (i, j)] + [node]
    value, expr, _ = items[0]
    if not 1 <= value <= self.max_target:
      return None
    prompt = ",".join(map(str, numbers)) + f">{value}="
    return Example(prompt=prompt, answer=expr, meta={"numbers": numbers, "target": value})

  def canonical(self, example: Example) -> str:
    """Sorted numbers and target: reorderings of the numbers are the same instance."""
    return instance_key(example.meta["numbers"], example.meta["target"])

  def count_split_sizes(self) -> dict[str, int] | None:
    """Each split's number of instances, counted (``count_instances``) when the options have at most
    ``COUNT_LIMIT`` multisets of numbers: those with few enough instances for a config's sizes to
    exceed them."""
    multisets = math.comb(self.max_number + self.num_numbers - 1, self.num_numbers)
    if multisets > COUNT_LIMIT[self.num_numbers]:
      return None
    return count_instances(self.num_numbers, self.max_number, self.max_target,
                           self.test_fraction)

  def split_size_bound(self) -> int:
    """A bound on the instances of both splits together, for options too large to count:
    each multiset of numbers with at most min(max_target, ``MAX_TARGETS``) targets. At the
    largest counted sizes it is 4-10x the count for 3 numbers in [1, 38] and 1.2-30x for 4 in
    [1, 13] (max_target 10 to unbounded), so it stops only a request far too large; one within
    it is left to the draws (``stall_draws``)."""
    multisets = math.comb(self.max_number + self.num_numbers - 1, self.num_numbers)
    return multisets * min(self.max_target, MAX_TARGETS[self.num_numbers])

  def enlarge_hint(self) -> str:
    """The options that give more instances, with their values: a larger max_number, a larger
    max_target (while below the largest value the numbers reach), 4 numbers (from 3)."""
    largest = max(self.max_number ** self.num_numbers, self.num_numbers * self.max_number)
    larger = [f"task.options.max_number (now {self.max_number})"]
    if self.max_target < largest:
      larger.append(f"task.options.max_target (now {self.max_target})")
    four = " or set task.options.num_numbers=4 (now 3)" if self.num_numbers == 3 else ""
    return f"raise {' or '.join(larger)}{four} for more distinct instances"

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
