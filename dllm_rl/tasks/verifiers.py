"""Answer checkers for file-backed tasks (GSM8K, MATH, Countdown, 4×4 sudoku).

Every checker is a pure host function of strings that never evaluates the
completion: numbers are read with regular expressions, arithmetic with the
bounded ``safe_arith`` parser, LaTeX with ``math-verify`` (sympy). Completions
longer than ``MAX_COMPLETION_CHARS`` score 0 without being read, and brace
matching is one linear pass, so hostile text is cheap. ``math-verify`` can
still spend unbounded time in sympy, hence
``dllm_rl.tasks.timed_verifier.TimedVerifier``.
"""

from __future__ import annotations

import functools
import re
import threading
from fractions import Fraction
from typing import Sequence

from dllm_rl.tasks.base import VerifyResult, malformed
from dllm_rl.tasks.countdown import grade_expression
from dllm_rl.tasks.safe_arith import ParseError, parse_expression
from dllm_rl.tasks.sudoku import NUM_CELLS, grade_grid

MAX_COMPLETION_CHARS = 65_536
MAX_ANSWER_CHARS = 1_000  # a \boxed{...} body given to math-verify
MAX_NUMBER_DIGITS = 64
# math-verify's own (signal-based, whole seconds) limits, used in the main
# thread only; the hard limit is TimedVerifier's.
MATH_VERIFY_TIMEOUT_S = 1

# A number: optional sign (not right after a word character, '.' or ')'), digit groups joined by
# commas and optional decimals, or a bare decimal part (".5"), then an optional "/denominator",
# itself an optional sign, then digits with optional decimals or a bare decimal part ("1/2.5" is
# 0.4, "1/.5" is 2, "1/-2" is -0.5), its thousands grouped by commas too ("1/2,000" is 0.0005;
# groups of exactly three digits, not followed by a digit or '/': "1/2,3/4" is two fractions,
# "1/2,0001" is 0.5 then 1). The first character picks the branch and every later part is optional,
# so matching never backtracks far; commas that are not thousands separators split the match
# (``_numbers``). A '.' with no digit after it (a full stop, "...") is no number, and a run of
# digits right after a '.' that follows a digit ("1.2.3") starts none. After a full stop glued to a
# letter or after an ellipsis, the digits (or a sign and digits) do start one, led by a digit:
# "apples.5" and "wait...5" are 5, not 0.5 (the second alternative; both lookbehinds are two
# characters wide).
_GROUPED = r"\d{1,3}(?:,\d{3})+"  # digits in comma-separated groups of three
_PLAIN = r"\d+(?:\.\d+)?|\.\d+"  # digits with optional decimals, or a bare decimal part
_DENOMINATOR = rf"(?:/-?(?:{_GROUPED}(?![\d/])(?:\.\d+)?|{_PLAIN}))?"
_NUMBER_RE = re.compile(r"(?:(?<![\w.)])|(?<=[^\W\d_]\.|\.\.)(?=-?\d))"
                        r"-?(?:\d+(?:,\d+)*(?:\.\d+)?|\.\d+)" + _DENOMINATOR)
_THOUSANDS_RE = re.compile(rf"-?{_GROUPED}(?:\.\d+)?")  # a numerator with commas
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_RE = re.compile(r"(?<!\\)[{}]")
# \frac{a}{b}, after an optional whole part ("2\frac{1}{2}" is the mixed number 2.5) or a
# minus sign where '-' is one ("-\frac{1}{2}"); a and b may carry a sign ("\frac{1}{-2}").
_FRAC_RE = re.compile(r"(?:(?<![\w.])(-?\d+)\s*|(?<![\w.)])(-))?"
                      r"\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*(-?[\d.,]+)\s*\}")
# One numerator or denominator of a \frac: a sign, then digits (grouped by commas in threes or
# not at all) with optional decimals, or a bare decimal part.
_FRAC_PART_RE = re.compile(rf"-?(?:{_GROUPED}(?:\.\d+)?|{_PLAIN})")
# Thousands separators between a digit and a group of exactly three digits, read as commas:
# LaTeX's ("1{,}000", "1\\,000", MATH's "1,\\!000") and the typographic spaces (no-break
# U+00A0, figure U+2007, thin U+2009, narrow no-break U+202F: "1", any of them, "000" is 1000).
# A plain space is not one: "scores 5 120 340" is three numbers (see ``gsm8k_answer``).
_GROUP_SEPARATOR_RE = re.compile(
    r"(?<=\d)(?:\{,\}|\\,|,\\!|[\u00a0\u2007\u2009\u202f])(?=\d{3}(?!\d))")
# Minus signs other than '-', read as '-' (so as a sign exactly where '-' is one): the minus
# sign U+2212, the small and fullwidth hyphen-minus U+FE63 / U+FF0D, and the en dash U+2013,
# the usual typographic stand-in for a minus. The em dash, figure dash and hyphens U+2010 /
# U+2011 are never minus signs and stay as they are.
_MINUS_SIGNS = str.maketrans(dict.fromkeys("\u2212\ufe63\uff0d\u2013", "-"))
_LATEX_NOISE_RE = re.compile(r"\\text\s*\{[^{}]*\}|\\mathrm\s*\{[^{}]*\}|\\[$%,;!]|\{,\}"
                             r"|\\left|\\right")
_SUDOKU_SEPARATORS_RE = re.compile(r"[\s|,]")


# --- shared extraction ------------------------------------------------------

def last_boxed(text: str) -> str | None:
  """Body of the last ``\\boxed{...}`` (or ``\\fbox{...}``) whose braces balance;
  escaped braces ``\\{ \\}`` do not count. One linear pass over the braces."""
  starts = [m.end() - 1 for m in _BOX_RE.finditer(text)]  # index of each '{'
  if not starts:
    return None
  close_of: dict[int, int] = {}
  stack: list[int] = []
  for m in _BRACE_RE.finditer(text, starts[0]):
    if m.group() == "{":
      stack.append(m.start())
    elif stack:
      close_of[stack.pop()] = m.start()
  for start in reversed(starts):
    end = close_of.get(start)
    if end is not None:
      return text[start + 1:end]
  return None


def answer_span(text: str) -> str:
  """Body of the last ``<answer>...</answer>`` (to the end if unclosed); the
  whole text when there is no ``<answer>`` tag."""
  start = text.rfind("<answer>")
  if start < 0:
    return text
  body = text[start + len("<answer>"):]
  end = body.find("</answer>")
  return body if end < 0 else body[:end]


def closed_answer_span(text: str) -> str | None:
  """Body of the last closed ``<answer>...</answer>`` pair, as
  ``re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)[-1]`` finds it (d1's
  ``extract_solution`` / ``extract_answer_sudoku``), in one linear pass; None without one."""
  last, pos = None, 0
  while True:
    start = text.find("<answer>", pos)
    if start < 0:
      return last
    end = text.find("</answer>", start + len("<answer>"))
    if end < 0:
      return last
    last, pos = text[start + len("<answer>"):end], end + len("</answer>")


# --- GSM8K ------------------------------------------------------------------

def _to_fraction(number: str) -> Fraction | None:
  digits = sum(ch.isdigit() for ch in number)
  if digits > MAX_NUMBER_DIGITS:
    return None
  numerator, _, denominator = number.replace(",", "").partition("/")
  try:  # "0.5/2" is 0.25: Fraction's own parser takes no decimal over a denominator
    return Fraction(numerator) / Fraction(denominator or 1)
  except (ValueError, ZeroDivisionError):
    return None


def _canonical(value: Fraction) -> str:
  """"3" for 3, "0.25" for 1/4 (terminating decimals), "1/3" otherwise."""
  if value.denominator == 1:
    return str(value.numerator)
  den = value.denominator
  for p in (2, 5):
    while den % p == 0:
      den //= p
  if den != 1:
    return f"{value.numerator}/{value.denominator}"
  scale = 0
  while (value * 10**scale).denominator != 1:
    scale += 1
  text = f"{abs(value.numerator) * 10**scale // value.denominator:0{scale + 1}d}"
  sign = "-" if value < 0 else ""
  return f"{sign}{text[:-scale]}.{text[-scale:]}"


def _numbers(text: str) -> list[Fraction]:
  """Values of the numbers in ``text``, in order ("1,234" is one, "1,2345" two)."""
  pieces = []
  for m in _NUMBER_RE.finditer(text):
    number = m.group()
    numerator = number.partition("/")[0]  # a denominator's commas are groups of three
    if "," in numerator and not _THOUSANDS_RE.fullmatch(numerator):
      pieces.extend(number.split(","))
    else:
      pieces.append(number)
  return [v for v in map(_to_fraction, pieces) if v is not None]


def _frac_text(m: re.Match) -> str:
  """A ``_FRAC_RE`` match as a number ``_numbers`` reads, set apart by spaces (so a letter or
  digit glued to it does not join it: "x\\frac{1}{2}" is 0.5): "-a/b" or "a/b" with the
  signs of a, b and a leading minus combined and the commas dropped, or a mixed number's
  value. A part that is not one number ("3,5"), or a mixed number whose fraction does not
  parse or is negative, is left as written (the whole part first)."""
  whole, minus, num, den = m.groups()
  if not (_FRAC_PART_RE.fullmatch(num) and _FRAC_PART_RE.fullmatch(den)):
    return f" {whole} {num}/{den} " if whole else f" {minus or ''}{num}/{den} "
  negative = ((minus is not None) + num.startswith("-") + den.startswith("-")) % 2 == 1
  fraction = ("-" if negative else "") + f"{num.lstrip('-')}/{den.lstrip('-')}".replace(",", "")
  if whole is None:
    return f" {fraction} "
  w, part = _to_fraction(whole), _to_fraction(fraction)
  if w is None or part is None or part < 0:
    return f" {whole} {fraction} "
  return f" {_canonical(w - part if whole.startswith('-') else w + part)} "


def _gsm8k_value(text: str) -> Fraction | None:
  """The last ``#### x``, else the last balanced ``\\boxed{x}``, else the last number."""
  if len(text) > MAX_COMPLETION_CHARS:
    return None
  text = _GROUP_SEPARATOR_RE.sub(",", text.translate(_MINUS_SIGNS))
  text = _FRAC_RE.sub(_frac_text, text)
  marker = text.rfind("####")
  if marker >= 0:
    line = text[marker + 4:].split("\n", 1)[0]
    found = _numbers(line.replace("$", " "))
    if found:
      return found[0]
  boxed = last_boxed(text)
  if boxed is not None:
    found = _numbers(_LATEX_NOISE_RE.sub(" ", boxed).replace("$", " "))
    if found:
      return found[0]
  found = _numbers(text)
  return found[-1] if found else None


def gsm8k_answer(text: str) -> str | None:
  """Normalised final answer of a GSM8K-style text, or None.

  In order: the first number after the last ``####``; the first number in the
  last ``\\boxed{...}``; the last number in the text. ``\\frac{a}{b}`` (``\\dfrac``,
  ``\\tfrac``) is the number a/b wherever it stands, its signs combined and apart from a letter
  glued to it: ``\\frac{1}{-2.5}`` is -0.4, ``-\\frac{1}{-2}`` 0.5, ``x\\frac{1}{2}`` 0.5, the
  mixed number ``2\\frac{1}{2}`` 2.5, "is $\\frac{3}{4}$." 0.75. Commas (LaTeX's ``{,}``,
  ``\\,`` and ``,\\!`` between digit groups too), ``$``, units and trailing periods are
  dropped and the value is written canonically ("3.0" → "3", "1/2" and "0.50" → "0.5").

  Typographic forms read as their ASCII ones. A no-break, figure, thin or narrow no-break
  space (U+00A0, U+2007, U+2009, U+202F) before a group of exactly three digits is a thousands
  separator ("1", U+202F, "000" → 1000). The minus sign U+2212, the en dash U+2013 and the
  small / fullwidth hyphen-minus U+FE63 / U+FF0D are a sign where '-' is one: right before
  the digits, not after a letter, digit, '.' or ')' (U+2212 then "5" → -5; "5", U+2013, "10"
  is the range 5 and 10; a dash with a space after it is no sign; the em dash never is). A
  decimal may lack its leading zero (".5" → 0.5, "-.5" → -0.5), while a full stop or an
  ellipsis is no number ("is 5." → 5). Nor is either a decimal point when glued to a number
  after a letter or a '.': "apples.5" and "so it is...5" are 5, as d1's GSM8K evaluation
  reads them (its last-number regex takes the digits after any '.'; lm-eval-harness's
  flexible-extract keeps the strings ".5" and "...5", which equal no GSM8K answer as written),
  while "1.2.3" is 1.2 and "costs $3.So he has" holds 3. A fraction's numerator and
  denominator may be decimals: ".5/2" and "0.5/2" are 0.25, as "1/2" is 0.5, and "1/2.5",
  "1/.5" and ``\\frac{1}{2.5}`` are 0.4, 2 and 0.4. A denominator groups thousands as a
  numerator does: "1/2,000" and ``\\frac{1}{1{,}000}`` are 0.0005 and 0.001 (a list of
  fractions stays apart: "1/2,3/4" is 0.5 and 0.75), and may carry a sign: "1/-2" is -0.5,
  "-1/-2" 0.5. A plain
  space is no thousands separator: "3 000" is two numbers (the last one 0), since English
  text writes separate numbers that way ("scores 5 120 340", "3 100-metre races") and groups
  thousands with commas, as GSM8K's answers do; so a comma is never a decimal point either:
  "3,5" is the numbers 3 and 5 (→ 5), "3,500" is 3500.
  """
  value = _gsm8k_value(text)
  return None if value is None else _canonical(value)


def gsm8k_result(completion: str, reference: str) -> VerifyResult:
  """Reward 1 iff the completion's GSM8K answer equals the reference's (exact
  rational comparison); ``reference`` is a full worked answer or the number."""
  target = _gsm8k_value(reference)
  if target is None:
    raise ValueError(f"reference {reference[:60]!r} has no numeric answer")
  if len(completion) > MAX_COMPLETION_CHARS:
    return malformed(f"completion too long ({len(completion)} characters)")
  value = _gsm8k_value(completion)
  if value is None:
    return malformed("no number found")
  correct = value == target
  info = {"target": _canonical(target)}
  if not correct:
    info["reason"] = "wrong value"
  return VerifyResult(float(correct), correct, _canonical(value), info)


def gsm8k_correct(completion: str, reference: str) -> bool:
  return gsm8k_result(completion, reference).correct


# --- d1's GSM8K and MATH rewards, as run ----------------------------------------
#
# d1 (dllm-reasoning/d1 @837888f, diffu-grpo/diffu_grpo_train.py) trains GSM8K on the sum of
# five functions of diffu-grpo/reward_func.py and MATH on two; transcribed here on the decoded
# completion, Python's own re / str semantics included.

_D1_STRICT_RE = re.compile(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$")
_D1_SOFT_RE = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>")


def d1_xml_answer(text: str) -> str:
  """d1's ``extract_xml_answer``: after the last ``<answer>``, up to the next ``</answer>``."""
  return text.split("<answer>")[-1].split("</answer>")[0].strip()


def d1_xml_count(text: str) -> float:
  """d1's ``count_xml`` (``xmlcount_reward_func``): 0.125 per tag line found once, less
  0.001 per character after the closing answer tag."""
  count = 0.0
  if text.count("<reasoning>\n") == 1:
    count += 0.125
  if text.count("\n</reasoning>\n") == 1:
    count += 0.125
  if text.count("\n<answer>\n") == 1:
    count += 0.125
    count -= len(text.split("\n</answer>\n")[-1]) * 0.001
  if text.count("\n</answer>") == 1:
    count += 0.125
    count -= (len(text.split("\n</answer>")[-1]) - 1) * 0.001
  return count


def d1_gsm8k_reward(completion: str, answer: str) -> float:
  """d1's GSM8K reward: ``xmlcount`` + ``soft_format`` 0.5 + ``strict_format`` 0.5 +
  ``int`` 0.5 (the extracted answer is digits) + ``correctness`` 2.0 (it equals ``answer``,
  the text after ``####``, character for character); at most 4.0."""
  extracted = d1_xml_answer(completion)
  return (d1_xml_count(completion) + 0.5 * bool(_D1_SOFT_RE.match(completion))
          + 0.5 * bool(_D1_STRICT_RE.match(completion)) + 0.5 * extracted.isdigit()
          + 2.0 * (extracted == answer))


def d1_math_format_reward(completion: str) -> float:
  """d1's ``boxed_and_answer_tags_format_reward``: 0.5 × ``boxed_in_answer``
  (math500_utils.py), which is 1 when the completion holds ``<answer>``, plus 1 when its span
  holds ``"\\boxed"``, else 0.5. That literal is a backspace and "oxed" in d1's source (not a
  raw string), which no completion holds: as run, 0.25 or 0.75."""
  parts = completion.split("<answer>")
  span = parts[1].split("</answer>")[0] if len(parts) > 1 else completion
  return 0.5 * (float(len(parts) > 1) + (1.0 if "\x08oxed" in span else 0.5))


# --- MATH (math-verify) -----------------------------------------------------

@functools.lru_cache(maxsize=4096)
def _parse_gold(reference: str, timeout: int | None):
  """math-verify's parse of ``reference``; a timeout raises (and so is not cached)."""
  from math_verify import parse
  text = reference if "\\boxed" in reference else "\\boxed{" + reference + "}"
  return parse(text, parsing_timeout=timeout, raise_on_error=True)


def math_result(completion: str, reference: str) -> VerifyResult:
  """Reward 1 iff math-verify finds the completion's answer equivalent to
  ``reference`` (a bare LaTeX answer or a solution with ``\\boxed``).

  The answer is the body of the last balanced ``\\boxed{}``; without one,
  math-verify's own extraction runs on the whole completion. ``parsed`` is math-verify's
  string of the answer, the reference's for a correct one (math-verify writes equal answers
  apart: "1,000" and "1000", "x=3" and "3"), so every correct answer is one answer.

  math-verify's own parsing timeout gives reward 0 with the reason "math-verify timeout" (on
  the answer) or "math-verify timeout on the reference" (a slow moment, not cached: the next
  call parses the reference again). Both are parsed with ``raise_on_error=True``, since
  otherwise math-verify logs a warning that quotes the whole text it was given (up to
  ``MAX_COMPLETION_CHARS``) and returns no answer, which the cache would keep.
  """
  from math_verify import parse, verify
  from math_verify.errors import TimeoutException

  if len(completion) > MAX_COMPLETION_CHARS:
    return malformed(f"completion too long ({len(completion)} characters)")
  boxed = last_boxed(completion)
  if boxed is not None and len(boxed) > MAX_ANSWER_CHARS:
    return malformed(f"boxed answer too long ({len(boxed)} characters)")
  # math-verify's signal.alarm timeouts only work in the main thread.
  timeout = (MATH_VERIFY_TIMEOUT_S
             if threading.current_thread() is threading.main_thread() else None)
  try:
    gold = _parse_gold(reference, timeout)
  except TimeoutException:
    return malformed("math-verify timeout on the reference")
  except Exception as err:
    raise ValueError(f"math-verify cannot parse the reference {reference[:60]!r}") from err
  if not gold:
    raise ValueError(f"math-verify finds no answer in the reference {reference[:60]!r}")
  try:
    pred = parse(completion if boxed is None else "\\boxed{" + boxed + "}",
                 parsing_timeout=timeout, raise_on_error=True)
    if not pred:
      return malformed("no answer found")
    correct = bool(verify(gold, pred, timeout_seconds=timeout))
  except TimeoutException:  # a BaseException; its message holds the whole text
    return malformed("math-verify timeout")
  except Exception as err:  # sympy/antlr failures on odd input score 0
    return malformed(f"math-verify error: {type(err).__name__}")
  info = {"target": str(gold[-1])}
  if not correct:
    info["reason"] = "not equivalent"
  return VerifyResult(float(correct), correct, str((gold if correct else pred)[-1]), info)


def math_correct(completion: str, reference: str) -> bool:
  return math_result(completion, reference).correct


# --- Countdown --------------------------------------------------------------

def countdown_reward(completion: str, numbers: Sequence[int], target: int) -> VerifyResult:
  """Reward 1 iff the expression uses each of ``numbers`` exactly once and
  equals ``target``. The expression is the ``<answer>`` body if tagged, else
  the whole text; a trailing ``= value`` is ignored (the value is recomputed).
  """
  if len(completion) > MAX_COMPLETION_CHARS:
    return malformed(f"completion too long ({len(completion)} characters)")
  return grade_expression(answer_span(completion).split("=", 1)[0].strip(), numbers, target)


# d1's (TinyZero's) countdown.py: the characters its evaluate_equation lets through to eval,
# the integers its validate_equation reads, and compute_score's tolerance (exact here).
_D1_EQUATION_RE = re.compile(r"^[\d+\-*/().\s]+$")
_D1_INTEGER_RE = re.compile(r"\d+")
_D1_TOLERANCE = Fraction(1, 10**5)


def _line_break_outside_parentheses(equation: str) -> bool:
  """Whether ``equation`` breaks a line (``\\n`` or ``\\r``) outside parentheses, where
  Python's ``eval`` (d1's ``evaluate_equation``) raises SyntaxError; inside them it joins
  the lines, as the ``safe_arith`` parser does everywhere."""
  depth = 0
  for ch in equation:
    depth += (ch == "(") - (ch == ")")
    if ch in "\n\r" and depth <= 0:
      return True
  return False


def d1_countdown_result(completion: str, numbers: Sequence[int], target: int,
                        format_score: float = 0.1) -> VerifyResult:
  """d1's and StableDRL's Countdown reward (TinyZero's ``compute_score``, d1's
  diffu-grpo/reward_func.py @837888f ``countdown_reward_func``), on the stripped body of the
  last closed ``<answer>...</answer>`` (:func:`closed_answer_span`): no such span, 0; the
  integers in it (the regex ``\\d+``, so a trailing ``=22`` adds 22) not exactly
  ``numbers`` as a multiset, ``format_score``; a character other than a digit,
  ``+ - * / ( ) .`` or whitespace, ``format_score``; else 1.0 iff its value is within 1e-5 of
  ``target``, ``format_score`` otherwise (one that does not evaluate too).

  d1 evaluates with ``eval``; here the bounded ``safe_arith`` parser, exact fractions and an
  exact ``|value - target| < 1e-5``: binary ``+ - * /`` and parentheses, as the prompt and the
  ``verifier`` reward allow. What ``eval`` would also take scores ``format_score`` here: a
  unary sign (``-3+5+7``), ``**``, ``//``, a decimal point, an expression over
  ``safe_arith.MAX_CHARS`` characters. What ``eval`` refuses scores it too: a line break
  outside parentheses (``3+5\\n+7``). Never malformed (``parsed`` is "" without a span, as
  d1 counts every completion); a completion over ``MAX_COMPLETION_CHARS`` scores 0 unread.
  """
  def scored(reward: float, parsed: str, reason: str | None) -> VerifyResult:
    info = {"target": int(target), "d1_reward": reward}
    if reason:
      info["reason"] = reason
    return VerifyResult(reward, reward == 1.0, parsed, info)

  if len(completion) > MAX_COMPLETION_CHARS:
    return scored(0.0, "", f"completion too long ({len(completion)} characters)")
  span = closed_answer_span(completion)
  if span is None:
    return scored(0.0, "", "no closed <answer>...</answer>")
  equation = span.strip()
  try:  # int() refuses over 4300 digits, as d1's validate_equation does (its except: False)
    used = sorted(int(n) for n in _D1_INTEGER_RE.findall(equation))
  except ValueError:
    used = None
  if used != sorted(int(x) for x in numbers):
    return scored(format_score, equation, f"must use each of {sorted(numbers)} exactly once"
                  f" (d1 reads the integers {used})")
  if not _D1_EQUATION_RE.match(equation):
    return scored(format_score, equation, "characters other than digits, + - * / ( ) . and"
                  " whitespace")
  if _line_break_outside_parentheses(equation):  # eval's SyntaxError (its except: format)
    return scored(format_score, equation, "a line break outside parentheses (d1's eval reads"
                  " the expression as one line)")
  try:
    value, _, canonical = parse_expression(equation)
  except ParseError as err:
    return scored(format_score, equation, f"parse error: {err}")
  if abs(value - int(target)) >= _D1_TOLERANCE:
    return scored(format_score, canonical, f"wrong value {value}")
  return scored(1.0, canonical, None)


# --- 4×4 sudoku -------------------------------------------------------------

def sudoku_result(completion: str, puzzle: str, solution: str,
                  reward: str = "solved") -> VerifyResult:
  """Scores a 4×4 grid: the ``<answer>`` body (else the whole text) without
  whitespace, '|' and ',' must be 16 digits 1-4.

  ``info["cell_accuracy"]``: fraction of blank cells equal to ``solution``;
  ``info["solved"]``: valid sudoku that keeps every given. The reward is
  ``solved`` (0/1) or, with ``reward="cell_accuracy"``, the accuracy. With
  ``cell_accuracy`` an answer that is not 16 digits 1-4 still earns partial credit as d1's
  ``sudoku_reward_func`` gives it: its digits (any, separators and other characters
  dropped), padded with "0" or cut to 16, against the blank cells (no digits: 0).
  """
  if reward not in ("solved", "cell_accuracy"):
    raise ValueError(f"reward must be 'solved' or 'cell_accuracy', got {reward!r}")
  if len(completion) > MAX_COMPLETION_CHARS:
    return malformed(f"completion too long ({len(completion)} characters)",
                     cell_accuracy=0.0, solved=False)
  span = answer_span(completion)
  text = _SUDOKU_SEPARATORS_RE.sub("", span)
  if len(text) != NUM_CELLS or any(ch not in "1234" for ch in text):
    reason = "answer is not exactly 16 digits 1-4"
    digits = "".join(ch for ch in span if ch.isdigit())
    if reward == "solved" or not digits:
      return malformed(reason, cell_accuracy=0.0, solved=False)
    grid = (digits + "0" * NUM_CELLS)[:NUM_CELLS]
    blanks = [i for i, ch in enumerate(puzzle) if ch == "0"]
    accuracy = sum(grid[i] == solution[i] for i in blanks) / max(len(blanks), 1)
    return VerifyResult(accuracy, False, grid, {"cell_accuracy": accuracy, "solved": False,
                                                "reason": reason + " (partial credit as d1)"})
  solved, info = grade_grid(text, puzzle, solution)
  score = float(solved) if reward == "solved" else info["cell_accuracy"]
  return VerifyResult(score, solved, text, info)
