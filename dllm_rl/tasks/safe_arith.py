"""A small, bounded parser for integer arithmetic (never eval/exec/compile).

Grammar (whitespace between tokens is ignored)::

  expr   := term (("+" | "-") term)*
  term   := factor (("*" | "/") factor)*
  factor := NUMBER | "(" expr ")"
  NUMBER := "0" | [1-9][0-9]{0,8}        (no leading zeros, at most 9 digits)

No unary minus, no "**", no other characters. Evaluation is exact
(``fractions.Fraction``). Input over ``MAX_CHARS`` characters, nesting deeper than
``MAX_DEPTH`` and division by zero raise ``ParseError``; with these bounds every
call is fast (values stay below ~10**200).

Alongside the value the parser writes the expression's canonical text: the literals and
operators in their written order, without whitespace, and with the fewest parentheses that
denote the same function of the literals under exact rational arithmetic (the same value, and
division by zero for the same literals). Parentheses are redundant around a left operand
except a +/- operand of * or /, and around a right operand of + ("a+(b-c)" is "a+b-c"); a
right operand of - or * keeps them iff it is a + or -, one of / iff it is any operation
("a*(b/c)" is "a*b/c", "a/(b*c)" stays). It is a normal form of notation, not of algebra:
"1+2" and "2+1", or "a/(b*c)" and "a/b/c", are different expressions and stay distinct.
"""

from __future__ import annotations

from fractions import Fraction
from typing import NamedTuple

MAX_CHARS = 200
MAX_DEPTH = 32
MAX_LITERAL_DIGITS = 9
# Precedence of an expression's top-level operation in its canonical text (an atom: a literal).
PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
ATOM_PREC = 3
_WHITESPACE = " \t\n\r"
_DIGITS = "0123456789"
_SYMBOLS = "+-*/()"


class ParseError(ValueError):
  """The text is not a well-formed, evaluable expression."""


class Parsed(NamedTuple):
  """Value, integer literals (in reading order) and canonical text (module docstring) of an
  expression."""
  value: Fraction
  literals: list[int]
  canonical: str


def join(lhs: str, lhs_prec: int, op: str, rhs: str, rhs_prec: int) -> str:
  """Canonical text of ``lhs op rhs`` from its operands' canonical texts and precedences
  (``PREC``, ``ATOM_PREC``): each operand parenthesised only where dropping the parentheses
  would change the function (module docstring), as left-to-right evaluation with the usual
  precedence reads it."""
  p = PREC[op]
  left = f"({lhs})" if lhs_prec < p else lhs
  right = f"({rhs})" if rhs_prec < p or (rhs_prec == p and op in "-/") else rhs
  return f"{left}{op}{right}"


class _Node(NamedTuple):
  """A parsed sub-expression: its value, canonical text and top-level precedence."""
  value: Fraction
  text: str
  prec: int


def _tokenize(text: str) -> list[tuple[str, int]]:
  """(token, position) pairs; tokens are literals (digit strings) or one symbol."""
  tokens = []
  i = 0
  while i < len(text):
    ch = text[i]
    if ch in _WHITESPACE:
      i += 1
    elif ch in _DIGITS:
      j = i
      while j < len(text) and text[j] in _DIGITS:
        j += 1
      lit = text[i:j]
      if len(lit) > MAX_LITERAL_DIGITS:
        raise ParseError(f"literal at position {i} has {len(lit)} digits "
                         f"(max {MAX_LITERAL_DIGITS})")
      if len(lit) > 1 and lit[0] == "0":
        raise ParseError(f"literal {lit!r} at position {i} has a leading zero")
      tokens.append((lit, i))
      i = j
    elif ch in _SYMBOLS:
      tokens.append((ch, i))
      i += 1
    else:
      raise ParseError(f"unexpected character {ch!r} at position {i}")
  return tokens


class _Parser:
  """Recursive descent over the token list, evaluating (and writing the canonical text) as it
  goes."""

  def __init__(self, tokens: list[tuple[str, int]], length: int):
    self.tokens = tokens
    self.length = length
    self.pos = 0
    self.literals: list[int] = []

  def peek(self) -> str | None:
    return self.tokens[self.pos][0] if self.pos < len(self.tokens) else None

  def where(self) -> int:
    return self.tokens[self.pos][1] if self.pos < len(self.tokens) else self.length

  def expr(self, depth: int) -> _Node:
    node = self.term(depth)
    while self.peek() in ("+", "-"):
      op = self.tokens[self.pos][0]
      self.pos += 1
      rhs = self.term(depth)
      value = node.value + rhs.value if op == "+" else node.value - rhs.value
      node = _Node(value, join(node.text, node.prec, op, rhs.text, rhs.prec), PREC[op])
    return node

  def term(self, depth: int) -> _Node:
    node = self.factor(depth)
    while self.peek() in ("*", "/"):
      op, at = self.tokens[self.pos]
      self.pos += 1
      rhs = self.factor(depth)
      if op == "*":
        value = node.value * rhs.value
      elif rhs.value == 0:
        raise ParseError(f"division by zero at position {at}")
      else:
        value = node.value / rhs.value
      node = _Node(value, join(node.text, node.prec, op, rhs.text, rhs.prec), PREC[op])
    return node

  def factor(self, depth: int) -> _Node:
    tok = self.peek()
    if tok is None:
      raise ParseError("unexpected end of input")
    if tok == "(":
      if depth >= MAX_DEPTH:
        raise ParseError(f"parentheses nested deeper than {MAX_DEPTH} "
                         f"at position {self.where()}")
      self.pos += 1
      node = self.expr(depth + 1)  # its parentheses are the parent's to keep or drop
      if self.peek() != ")":
        raise ParseError(f"expected ')' at position {self.where()}")
      self.pos += 1
      return node
    if tok[0] in _DIGITS:
      self.pos += 1
      self.literals.append(int(tok))
      return _Node(Fraction(int(tok)), tok, ATOM_PREC)
    raise ParseError(f"unexpected {tok!r} at position {self.where()}")


def parse_expression(text: str) -> Parsed:
  """Evaluates ``text`` exactly and writes its canonical text; ParseError if it is not in the
  grammar above."""
  if not isinstance(text, str):
    raise ParseError(f"expected a string, got {type(text).__name__}")
  if len(text) > MAX_CHARS:
    raise ParseError(f"expression has {len(text)} characters (max {MAX_CHARS})")
  tokens = _tokenize(text)
  if not tokens:
    raise ParseError("empty expression")
  parser = _Parser(tokens, len(text))
  node = parser.expr(depth=0)
  if parser.pos != len(tokens):
    raise ParseError(f"unexpected {parser.peek()!r} at position {parser.where()}")
  return Parsed(value=node.value, literals=parser.literals, canonical=node.text)
