"""safe_arith: exact values, literals, canonical text, and bounded rejection of everything
else."""

import random
import re
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
  v, lits, canonical = parsed  # unpacks like a tuple
  assert (v, lits, canonical) == (parsed.value, parsed.literals, parsed.canonical)


@pytest.mark.parametrize("texts,canonical", [
    (["(1+2)*3", "((1+2))*3", "(1+2)*(3)", " ( 1 + 2 ) *\n3"], "(1+2)*3"),
    (["1+(2+3)", "1+2+3", "(1+2)+3", "((1)+2)+(3)"], "1+2+3"),
    (["2+1"], "2+1"),  # the literals' order is the expression's: not 1+2
    (["3*(1+2)"], "3*(1+2)"),
    (["8+(4-2)"], "8+4-2"),
    (["8-(4*2)", "(8)-4*2"], "8-4*2"),
    (["8-(4-2)"], "8-(4-2)"),
    (["8-(4+2)"], "8-(4+2)"),
    (["(8-4)-2"], "8-4-2"),
    (["8*(4/2)", "(8*4)/2"], "8*4/2"),  # exact rationals: the same value, 0 divisors alike
    (["(8/4)*2"], "8/4*2"),
    (["8*(4*2)", "(8*4)*2"], "8*4*2"),
    (["8/(4*2)"], "8/(4*2)"),  # not 8/4/2: another operation, though the same function
    (["8/(4/2)"], "8/(4/2)"),
    (["(8+4)/2"], "(8+4)/2"),
    (["8/(4+2)"], "8/(4+2)"),
    (["(8*4)+(2/1)"], "8*4+2/1"),
    (["((((7))))"], "7"),
])
def test_canonical_text_drops_redundant_parentheses_only(texts, canonical):
  for text in texts:
    assert parse_expression(text).canonical == canonical, text
  assert parse_expression(canonical).canonical == canonical


_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, None: 3}


def _tree(rng: random.Random, leaves: int):
  """A random expression tree with ``leaves`` leaves: None for a leaf, else (op, lhs, rhs)."""
  if leaves == 1:
    return None
  k = rng.randint(1, leaves - 1)
  return (rng.choice("+-*/"), _tree(rng, k), _tree(rng, leaves - k))


def _leaves(tree) -> int:
  return 1 if tree is None else _leaves(tree[1]) + _leaves(tree[2])


def _render(rng: random.Random, tree, literals: list[int]) -> str:
  """``tree`` as text with ``literals`` (consumed in order): the parentheses its grouping
  needs under left-to-right evaluation, and random redundant ones (nested, spaced)."""
  if tree is None:
    text = str(literals.pop(0))
  else:
    op, lhs, rhs = tree
    left, right = _render(rng, lhs, literals), _render(rng, rhs, literals)
    op_prec = _PREC[op]
    left = f"({left})" if _PREC[lhs and lhs[0]] < op_prec else left
    right = f"({right})" if _PREC[rhs and rhs[0]] <= op_prec else right
    text = left + rng.choice(["", " "]) + op + right
  while rng.random() < 0.25:
    text = f"({text})"
  return text


def _outcome(text: str):
  """(value, literals) of ``text``, or "division by zero"."""
  try:
    parsed = parse_expression(text)
  except ParseError as e:
    return "division by zero" if "division by zero" in str(e) else str(e)
  return parsed.value, parsed.literals


def _template(text: str) -> str:
  """``text`` with its literals replaced by ``{}``: ``.format`` writes other ones."""
  return re.sub(r"\d+", "{}", text)


def test_canonical_text_is_the_same_function_a_fixed_point_and_minimal():
  """Random trees written with random redundant parentheses: the canonical text has the same
  literals in the same order and is the same function of them (the same value, division by
  zero for the same literals, which substitutions with zeros probe), is its own canonical
  form, is never longer than the input, and is another function when any one pair of its
  parentheses is dropped (the fewest)."""
  rng = random.Random(0)
  checked, changed = 0, 0
  while checked < 400:
    tree = _tree(rng, rng.randint(1, 6))
    n = _leaves(tree)
    text = _render(rng, tree, [rng.randint(1, 10**6) for _ in range(n)])
    if len(text) > safe_arith.MAX_CHARS:
      continue
    parsed = parse_expression(text)
    canonical = parsed.canonical
    assert parse_expression(canonical) == parsed, text  # value, literals, and a fixed point
    assert " " not in canonical and len(canonical) <= len(text.replace(" ", ""))
    changed += canonical != text
    template = _template(canonical)
    for _ in range(4):  # other literals, zeros included: the same function
      other = [rng.randint(0, 3) for _ in range(n)]
      expected = _outcome(_render(rng, tree, list(other)))
      assert _outcome(template.format(*other)) == expected, (text, canonical, other)
    for start in [i for i, ch in enumerate(canonical) if ch == "("]:  # each pair is needed
      depth, end = 1, start + 1
      while depth:
        depth += {"(": 1, ")": -1}.get(canonical[end], 0)
        end += 1
      dropped = _template(canonical[:start] + canonical[start + 1:end - 1] + canonical[end:])
      probes = [[rng.randint(1, 10**6) for _ in range(n)] for _ in range(3)]
      assert any(_outcome(dropped.format(*p)) != _outcome(template.format(*p))
                 for p in probes), (canonical, start)
    checked += 1
  assert changed > 200  # most inputs had parentheses or spaces to drop


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
  start = time.thread_time()  # CPU time: a loaded box's waits for a CPU are not counted
  for text in hostile:
    with pytest.raises(ParseError):
      parse_expression(text)
  assert time.thread_time() - start < 3.0  # catches super-linear blow-ups, not speed


def test_large_but_legal_expression_is_fast():
  text = "*".join(["999999999"] * 20)  # 199 characters
  start = time.thread_time()  # CPU time: a loaded box's waits for a CPU are not counted
  assert parse_expression(text).value == 999999999**20
  assert time.thread_time() - start < 3.0  # catches super-linear blow-ups, not speed


def test_never_uses_eval():
  import inspect
  source = inspect.getsource(safe_arith)
  for name in ("eval(", "exec(", "compile("):
    assert name not in source
