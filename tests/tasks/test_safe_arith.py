"""safe_arith: exact values, literals, and bounded rejection of everything else."""

import time
from fractions import Fraction

import pytest

from dllm_rl.tasks import safe_arith
from dllm_rl.tasks.safe_arith import ParseError, parse_expression


@pytest.mark.parametrize("text,value,literals", [
    ("0", 0, [0]),
    ("1+2*3", 7, [1, 2, 3]),
    ("(1+2)*3", 9, [1, 2, 3]),
    ("10-4-3", 3, [10, 4, 3]),       # left associative
    ("10-(4-3)", 9, [10, 4, 3]),
    ("8/4/2", 1, [8, 4, 2]),
    ("7/2", Fraction(7, 2), [7, 2]),
    ("1/3*3", 1, [1, 3, 3]),
    (" 2 *\n( 3+4 ) ", 14, [2, 3, 4]),
    ("3-5", -2, [3, 5]),
    ("999999999*999999999", 999999999**2, [999999999, 999999999]),
])
def test_values_and_literals(text, value, literals):
  parsed = parse_expression(text)
  assert parsed.value == value and isinstance(parsed.value, Fraction)
  assert parsed.literals == literals
  v, lits = parsed  # unpacks like a tuple
  assert (v, lits) == (parsed.value, parsed.literals)


@pytest.mark.parametrize("text,match", [
    ("", "empty"),
    ("   ", "empty"),
    ("-3+4", "unexpected '-'"),          # no unary minus
    ("2*-3", "unexpected '-'"),
    ("2**3", r"unexpected '\*'"),
    ("1+", "end of input"),
    ("(1+2", r"expected '\)'"),
    ("1+2)", r"unexpected '\)'"),
    ("1 2", "unexpected '2'"),
    ("()", r"unexpected '\)'"),
    ("1/0", "division by zero"),
    ("1/(2-2)", "division by zero"),
    ("1.5", r"character '\.'"),
    ("x+1", "character 'x'"),
    ("1234567890", "10 digits"),
    ("007", "leading zero"),
    ("1" * 201, "201 characters"),
    ("(" * 33 + "1" + ")" * 33, "nested deeper"),
])
def test_errors(text, match):
  with pytest.raises(ParseError, match=match):
    parse_expression(text)


def test_max_nesting_is_allowed():
  depth = safe_arith.MAX_DEPTH
  assert parse_expression("(" * depth + "1" + ")" * depth).value == 1


def test_hostile_inputs_are_rejected_quickly():
  hostile = [
      "__import__('os').system('ls')",
      "1" * 10000,
      "(" * 10000,
      "(" * 100 + "1" + ")" * 100,
      "2**99999",
      "9" * 9 + "**" + "9" * 9,
      "lambda: 0",
      "1+" * 99 + "1" + "\x00",
      "[1]*10**9",
  ]
  start = time.perf_counter()
  for text in hostile:
    with pytest.raises(ParseError):
      parse_expression(text)
  assert time.perf_counter() - start < 3.0  # catches super-linear blow-ups, not speed


def test_large_but_legal_expression_is_fast():
  text = "*".join(["999999999"] * 20)  # 199 characters
  start = time.perf_counter()
  assert parse_expression(text).value == 999999999**20
  assert time.perf_counter() - start < 3.0  # catches super-linear blow-ups, not speed


def test_never_uses_eval():
  import inspect
  source = inspect.getsource(safe_arith)
  for name in ("eval(", "exec(", "compile("):
    assert name not in source
