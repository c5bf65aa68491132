"""Answer checkers: GSM8K number extraction, MATH equivalence (math-verify),
Countdown, 4×4 sudoku; hostile completions; the hard per-call timeout."""

import gc
import logging
import math
import time
from fractions import Fraction

import pytest
from hypothesis import given, settings, strategies as st

from dllm_rl.tasks import timed_verifier as T, verifiers as V

pytest.importorskip("math_verify")


@pytest.mark.parametrize("text, expected", [
    ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72"),
    ("#### 1,234", "1234"),
    ("#### $18.00.", "18"),
    ("#### 5 apples\nthen 7 more", "5"),
    ("the total is \\boxed{18} dollars, not 20", "18"),
    ("\\boxed{\\$1,000}", "1000"),
    ("\\boxed{18 \\text{ dollars}}", "18"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("first \\boxed{3} then \\boxed{4}", "4"),
    ("\\boxed{7} and an unclosed \\boxed{8", "7"),
    ("She pays $1,200 in total.", "1200"),
    ("It costs 3.0 dollars.", "3"),
    ("It is 2.50.", "2.5"),
    ("the ratio is 3/4", "0.75"),
    ("one third is 1/3", "1/3"),
    ("5 - 3 = 2", "2"),
    ("it dropped to -5", "-5"),
    ("50%", "50"),
    ("lists 1, 2, 3", "3"),
    ("1,2345", "2345"),
    ("no digits here", None),
    ("", None),
    # LaTeX thousands separators: one number, not "1" then "000"
    ("\\boxed{1{,}000}", "1000"),
    ("\\boxed{\\$1\\,234{,}567.50}", "1234567.5"),
    ("The total is $1{,}000$.", "1000"),
    ("\\boxed{1,\\!000}", "1000"),
    ("\\boxed{12\\,\\text{cm}}", "12"),
    # a mixed number: 2 and a half, not "21/2"
    ("\\boxed{2\\frac{1}{2}}", "2.5"),
    ("\\boxed{-2\\dfrac{1}{4} \\text{ hours}}", "-2.25"),
])
def test_gsm8k_answer(text, expected):
  assert V.gsm8k_answer(text) == expected


# Forms models emit: minus signs other than '-', thousands separated by typographic spaces, a
# decimal without its leading 0; and the punctuation these must leave alone.
@pytest.mark.parametrize("text, expected", [
    ("it dropped to \u22125", "-5"),
    ("#### \u22125", "-5"),
    ("\\boxed{\u22123.5}", "-3.5"),
    ("\\boxed{\\frac{\u22121}{2}}", "-0.5"),
    ("it is \u20135 degrees", "-5"),  # the en dash as a minus sign
    ("\uff0d7 and \ufe637", "-7"),
    ("pages 5\u201310", "10"),  # a range: no sign after a digit, as with '-'
    ("5\u22123 = 2", "2"),
    ("the answer \u2013 5", "5"),  # a spaced dash is no sign
    ("so\u20145 and \u20147", "7"),  # nor is the em dash
    ("The total is 1\u202f000.", "1000"),
    ("#### 1\u00a0234\u00a0567 dollars", "1234567"),
    ("1\u2009000", "1000"),
    ("\\boxed{12\u2007345.5}", "12345.5"),
    ("12\u202f3456", "3456"),  # not a group of three: two numbers
    ("I have 3 000 left", "0"),  # a plain space separates numbers
    ("It is .5", "0.5"),
    ("#### .5", "0.5"),
    ("-.5", "-0.5"),
    ("\u2212.25 m", "-0.25"),
    ("costs $.50.", "0.5"),
    ("The answer is 5.", "5"),
    ("costs $3.50.", "3.5"),
    ("1.2.3", "1.2"),  # no ".3" after a digit
    ("so 4... and then...", "4"),
])
def test_gsm8k_answer_reads_typographic_numbers(text, expected):
  assert V.gsm8k_answer(text) == expected


# Small-model slips: no space after a full stop or an ellipsis, a decimal over a denominator.
@pytest.mark.parametrize("text, expected", [
    ("so the answer is...5", "5"),  # an ellipsis is no decimal point
    ("#### ...12", "12"),
    ("wait...-5", "-5"),
    ("he has 3 apples.5", "5"),  # a full stop glued to a word: 5, as d1's evaluation reads it
    ("No.7", "7"),
    ("so 2..5", "5"),
    ("apples.5,000 of them", "5000"),
    ("costs $3.So he has 5 left", "5"),  # a sentence end glued to a word stays a full stop
    ("it costs $3.So", "3"),
    ("version 1.2.3", "1.2"),  # still no number right after a digit and '.'
    ("x1.5", None),
    ("answer: .5/2", "0.25"),  # a decimal over a denominator, as "1/2" is 0.5
    ("answer: 0.5/2", "0.25"),
    ("#### -.5/2", "-0.25"),
    ("\\boxed{\\frac{1.5}{3}}", "0.5"),
    ("\\boxed{2\\frac{1.5}{2}}", "2.75"),
    ("1/0 and .5/0", None),
    ("the ratio is 1/2.5", "0.4"),  # a decimal denominator: not 1/2 then ".5"
    ("1/.5", "2"), ("#### 3/1.5 hours", "2"), ("#### -1.5/2.5", "-0.6"),
    ("it is 1,000/2.5", "400"), ("1/2.5.6", "0.4"), ("1/2. Then 3/4.5", "2/3"),
    ("\\boxed{\\frac{1}{2.5}}", "0.4"), ("\\boxed{\\dfrac{1.5}{2.5}}", "0.6"),
    ("\\boxed{\\tfrac{1}{.5}}", "2"), ("\\boxed{2\\frac{1}{2.5}}", "2.4"),
    ("1/0.0", None),
])
def test_gsm8k_answer_reads_glued_stops_and_decimal_fractions(text, expected):
  assert V.gsm8k_answer(text) == expected


# Fractions: a denominator's thousands groups and sign, \frac anywhere in the text (not only
# boxed), apart from a letter glued to it, and the signs of its parts combined.
@pytest.mark.parametrize("text, expected", [
    ("\\boxed{\\frac{1}{1{,}000}}", "0.001"), ("\\boxed{\\frac{1}{-2.5}}", "-0.4"),
    ("it is 1/2,000", "0.0005"), ("#### 1/2,000", "0.0005"), ("\\boxed{1/2,000}", "0.0005"),
    ("2/1,000 of it", "0.002"), ("1,000/2,000", "0.5"), ("\\boxed{\\frac{1,000}{2,000}}", "0.5"),
    ("1/1,000,000", "0.000001"), ("#### 3/1,000.5", "2/667"),
    ("1/2,3/4", "0.75"), ("#### 1/2,345/678", "0.5"),  # lists of fractions stay two
    ("1/2,0001", "1"), ("1/2345,000", "0"),  # not groups of three: the numbers apart, as before
    ("\\boxed{\\frac{-1}{-2}}", "0.5"), ("\\boxed{-\\frac{1}{-2}}", "0.5"),
    ("\\boxed{-\\frac{1}{2}}", "-0.5"), ("\\boxed{5-\\frac{1}{2}}", "5"),
    ("\\boxed{x\\frac{1}{2}}", "0.5"), ("\\boxed{\\frac{1}{2}3}", "0.5"),
    ("\\boxed{2\\frac{1}{2}}", "2.5"), ("\\boxed{2\\frac{1}{-2}}", "2"),
    ("\\boxed{\\frac{3,5}{2}}", "3"),  # "3,5" is no one number: 3 and 5/2, as before
    ("The answer is $\\frac{3}{4}$.", "0.75"), ("#### \\frac{3}{4}", "0.75"),
    ("so x\\frac{1}{2}", "0.5"), ("he ran 2\\frac{1}{2} miles", "2.5"),
    ("\\frac{1}{1{,}000}", "0.001"), ("so it is -\\dfrac{1}{-2.5}", "0.4"),
    ("1/-2", "-0.5"), ("#### -1/-2", "0.5"), ("1/-2,000", "-0.0005"),  # a signed denominator
    ("\\boxed{3/-1.5}", "-2"), ("it is 1/-.5", "-2"), ("1/- 2", "2"), ("5/-x", "5"),
])
def test_gsm8k_answer_reads_fraction_denominators_and_signs(text, expected):
  assert V.gsm8k_answer(text) == expected


# Thousands: commas and typographic spaces group; a plain space separates numbers; a comma is
# never a decimal point ("3,5" is 3 and 5, its last number 5; the first after "####").
@pytest.mark.parametrize("text, expected", [
    ("5\u2009120", "5120"), ("5\u202f120", "5120"),
    ("scores 5\u2009120\u2009340", "5120340"), ("scores 5\u202f120\u202f340", "5120340"),
    ("scores 5 120 340", "340"),
    ("it is 3,5", "5"), ("it is 3,50", "50"), ("#### 3,5", "3"), ("it is 3,500", "3500"),
])
def test_gsm8k_answer_groups_thousands_but_never_reads_a_decimal_comma(text, expected):
  assert V.gsm8k_answer(text) == expected


SEPARATORS = [",", "\u00a0", "\u2007", "\u2009", "\u202f", "{,}", "\\,"]
MINUS_SIGNS = ["-", "\u2212", "\u2013", "\uff0d", "\ufe63"]
PLACES = ["The answer is {}.", "#### {} apples", "\\boxed{{{}}}", "so {}, then 7 more\n#### {}"]


@settings(derandomize=True, database=None, deadline=None, max_examples=150)
@given(n=st.integers(-10**15, 10**15), sep=st.sampled_from(SEPARATORS),
       minus=st.sampled_from(MINUS_SIGNS), place=st.sampled_from(PLACES))
def test_an_integer_in_any_grouping_and_sign_reads_back(n, sep, minus, place):
  digits = str(abs(n))
  head = len(digits) % 3 or 3
  grouped = sep.join([digits[:head]] + [digits[i:i + 3] for i in range(head, len(digits), 3)])
  number = (minus if n < 0 else "") + grouped
  assert V.gsm8k_answer(place.format(number, number)) == str(n)


@settings(derandomize=True, database=None, deadline=None, max_examples=150)
@given(k=st.integers(0, 10**6 - 1), places=st.integers(1, 6), minus=st.sampled_from(MINUS_SIGNS),
       negative=st.booleans(), place=st.sampled_from(PLACES + ["It costs ${}."]))
def test_a_decimal_without_its_leading_zero_reads_back(k, places, minus, negative, place):
  k %= 10**places
  number = (minus if negative else "") + f".{k:0{places}d}"
  expected = Fraction(-k if negative else k, 10**places)
  assert Fraction(V.gsm8k_answer(place.format(number, number))) == expected


def test_gsm8k_correct():
  reference = "She has 3 boxes of 4.\n3*4=<<3*4=12>>12\n#### 12"
  for good in ("#### 12", "The answer is 12.", "\\boxed{12.0}", "so $12", "12 eggs"):
    assert V.gsm8k_correct(good, reference), good
  for bad in ("#### 13", "12 then 13", "\\boxed{1.2}", "", "twelve"):
    assert not V.gsm8k_correct(bad, reference), bad
  assert V.gsm8k_correct("\\boxed{\\frac{1}{2}}", "0.5")
  assert V.gsm8k_correct("#### 0.50", "1/2")
  assert V.gsm8k_correct("#### 1,000,000", "1000000")
  r = V.gsm8k_result("#### 13", reference)
  assert r.reward == 0.0 and r.parsed == "13"
  assert r.info == {"target": "12", "reason": "wrong value"}
  with pytest.raises(ValueError, match="no numeric answer"):
    V.gsm8k_result("1", "no number")


def test_last_boxed():
  assert V.last_boxed("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
  assert V.last_boxed("\\boxed{1} \\fbox{2}") == "2"
  assert V.last_boxed("\\boxed{\\{1, 2\\}}") == "\\{1, 2\\}"
  assert V.last_boxed("\\boxed{1} \\boxed{2") == "1"
  assert V.last_boxed("\\boxed{" + "{" * 1000 + "}" * 1000 + "}") == "{" * 1000 + "}" * 1000
  assert V.last_boxed("nothing") is None


@pytest.mark.parametrize("completion, reference, correct", [
    ("so $\\boxed{\\frac{1}{2}}$", "0.5", True),
    ("so \\boxed{0.5}", "\\frac{1}{2}", True),
    ("so \\boxed{1/2}", "\\frac12", True),
    ("so \\boxed{\\sqrt{2}}", "\\sqrt{2}", True),
    ("so \\boxed{2^{1/2}}", "\\sqrt{2}", True),
    ("so \\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", True),
    ("so \\boxed{x^2+2x+1}", "(x+1)^2", True),
    ("so \\boxed{[1, 2)}", "[1,2)", True),
    ("so \\boxed{\\text{(C)}}", "C", True),
    ("The answer is $\\frac{1}{2}$.", "\\frac{1}{2}", True),
    ("so \\boxed{1.414}", "\\sqrt{2}", False),
    ("so \\boxed{3}", "\\frac{1}{2}", False),
    ("so \\boxed{(1, 2)}", "[1,2)", False),
    ("I do not know", "\\frac{1}{2}", False),
])
def test_math_correct(completion, reference, correct):
  assert V.math_correct(completion, reference) is correct


def test_math_reference_forms():
  solution = "We get $x = \\boxed{\\frac{3}{4}}$."
  assert V.math_correct("\\boxed{0.75}", solution)
  r = V.math_result("\\boxed{0.7}", "\\frac{3}{4}")
  assert r.reward == 0.0 and r.parsed == "0.7" and r.info["reason"] == "not equivalent"
  with pytest.raises(ValueError, match="reference"):
    V.math_result("\\boxed{1}", "\\boxed{}")


TOWER = "x^{" * 300 + "1" + "}" * 300  # math-verify parses it for minutes


@pytest.fixture
def no_gc():
  """Automatic garbage collection off: math-verify's timeout is an exception its SIGALRM
  handler raises in whatever code runs, and raised inside a gc callback (hypothesis installs
  one in this process) it is dropped and the parse runs on for minutes."""
  was_enabled = gc.isenabled()
  gc.disable()
  yield
  if was_enabled:
    gc.enable()


def test_a_math_verify_parsing_timeout_logs_no_completion(caplog, no_gc):
  # math-verify's own 1 s limit (this is the main thread) stops the parse; its warning quoted
  # the whole completion it was given.
  V.math_result("\\boxed{5}", "5")  # the reference's parse, cached, off the clock
  text = "filler words " * 3000 + "$" + TOWER + "$"
  with caplog.at_level(logging.DEBUG, logger="math_verify"):
    r = V.math_result(text, "5")
  assert r.reward == 0.0 and r.info["reason"] == "math-verify timeout", r.info
  assert not [rec for rec in caplog.records if "filler words filler" in rec.getMessage()]


def test_a_math_verify_timeout_on_the_reference_is_not_kept(no_gc):
  # A timeout returned "no answer", which the reference cache kept: every later call raised.
  cached = V._parse_gold.cache_info().currsize
  r = V.math_result("\\boxed{5}", TOWER)
  assert r.reward == 0.0 and r.info["reason"] == "math-verify timeout on the reference"
  assert V._parse_gold.cache_info().currsize == cached  # the next call parses it again


def test_math_correct_answers_in_any_form_parse_as_one_answer():
  # distinct_correct counts distinct parsed answers; math-verify's own strings differ here
  forms = ("\\boxed{1,000}", "\\boxed{1000}", "\\boxed{x=1000}", "so 1000 apples")
  results = [V.math_result(c, "1000") for c in forms]
  assert all(r.correct for r in results) and {r.parsed for r in results} == {"1000"}


def test_countdown_reward():
  nums, target = [3, 5, 7], 22
  for good in ("3*5+7", "<answer>7 + 5*3</answer>", "think... <answer>(5*3)+7 = 22</answer>",
               "<answer>3*5+7"):
    assert V.countdown_reward(good, nums, target).correct, good
  cases = {"5*5-3": "exactly once", "3*5+7+0": "exactly once", "3+5+7": "wrong value",
           "<answer>3*5+7*1</answer>": "exactly once", "3*5+7 is it": "parse error",
           "<answer></answer>": "parse error"}
  for text, reason in cases.items():
    r = V.countdown_reward(text, nums, target)
    assert r.reward == 0.0 and reason in r.info["reason"], text
  # The last <answer> counts.
  assert not V.countdown_reward("<answer>3*5+7</answer><answer>3+5</answer>", nums, target).correct
  assert V.countdown_reward("4+4+2", [4, 4, 2], 10).correct
  assert not V.countdown_reward("4*2+2", [4, 4, 2], 10).correct


def test_sudoku_result():
  solution = "1234341221434321"
  puzzle = "0034341221404301"  # 4 blanks: cells 0, 1, 11, 14
  r = V.sudoku_result("<answer>\n1234\n3412\n2143\n4321\n</answer>", puzzle, solution)
  assert r.correct and r.reward == 1.0 and r.info["cell_accuracy"] == 1.0
  assert V.sudoku_result("1234|3412|2143|4321", puzzle, solution).correct
  wrong = "2134341221434321"  # blanks 0 and 1 swapped: 2 of 4 blanks right, invalid columns
  r = V.sudoku_result(wrong, puzzle, solution)
  assert not r.correct and r.info["cell_accuracy"] == 0.5
  assert r.info["reason"] == "not a valid sudoku"
  r = V.sudoku_result(wrong, puzzle, solution, reward="cell_accuracy")
  assert r.reward == 0.5 and not r.correct
  changed = "1234341221434312"  # last given changed
  assert V.sudoku_result(changed, puzzle, solution).info["reason"] == "changes a given cell"
  for bad in ("123", "12343412214343210", "5234341221434321", ""):
    r = V.sudoku_result(bad, puzzle, solution)
    assert r.reward == 0.0 and r.info["cell_accuracy"] == 0.0 and r.parsed is None


def test_sudoku_cell_accuracy_gives_d1s_partial_credit_to_malformed_grids():
  """d1's sudoku_reward_func (diffu-grpo/reward_func.py @837888f): the answer's digits, padded
  with "0" or cut to 16, scored on the blank cells; the strict 'solved' reward is unchanged."""
  solution, puzzle = "1234341221434321", "0034341221404301"  # blanks: cells 0, 1, 11, 14
  expected = {"123434122143432": 1.0,  # 15 digits: padded
              "12343412214343210": 1.0,  # 17 digits: cut
              "1234341221404301": 0.5,  # two blanks left as 0
              "[1,2,3,4],[3,4,1,2],[2,1,4,3],[4,3,2,1]": 1.0,
              "Row 1: 1234": 0.25,  # "11234" padded: cell 0 right
              "5234341221434321": 0.75}
  for body, accuracy in expected.items():
    text = f"<answer>\n{body}\n</answer>"
    r = V.sudoku_result(text, puzzle, solution, reward="cell_accuracy")
    assert (r.reward, r.info["cell_accuracy"], r.correct) == (accuracy, accuracy, False), body
    assert r.parsed is not None  # not malformed: rl.malformed_reward would replace the credit
    assert V.sudoku_result(text, puzzle, solution).reward == 0.0
  for empty in ("<answer>\n\n</answer>", "no digits"):
    r = V.sudoku_result(empty, puzzle, solution, reward="cell_accuracy")
    assert r.reward == 0.0 and r.parsed is None


def test_closed_answer_span_is_d1s_findall_in_linear_time():
  import random
  import re
  rng = random.Random(0)
  pieces = ["<answer>", "</answer>", "a", "1", "\n", "<answer", "answer>"]
  for _ in range(500):
    text = "".join(rng.choice(pieces) for _ in range(rng.randrange(8)))
    found = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    assert V.closed_answer_span(text) == (found[-1] if found else None), text
  start = time.thread_time()  # CPU time (_cpu_s): no super-linear blow-up
  assert V.closed_answer_span("<answer>" * 100_000) is None
  assert _cpu_s(start) < 1.0


def _cpu_s(start: float) -> float:
  """This thread's CPU seconds since ``start`` (``time.thread_time()``): what a super-linear
  blow-up costs, whatever the load; wall-clock time also counts the waits for a CPU, 33 times
  the CPU time on a 2-core box running 32 busy processes (3.3 s for 0.1 s of work)."""
  return time.thread_time() - start


def _hostile(canary_name):
  # A relative path: the code carries no digits from the temporary directory's name, which a
  # last-number verifier would otherwise parse (e.g. "pytest-5" against the answer 5).
  code = f"__import__('os').system('touch {canary_name}')"
  return [code, f"<answer>{code}</answer>", f"\\boxed{{{code}}}", f"#### {code}",
          "9" * 10**6, "1," * 500_000, "123," * 15_000 + "1234", "\\boxed{" * 9_000,
          "\\boxed{" + "{" * 400 + "1" + "}" * 400 + "}", "(" * 60_000, "$" * 60_000,
          "####" * 15_000, "<answer>" * 8_000]


def test_gsm8k_signs_separators_and_dots_stay_linear():
  for text in ["-." * 30_000 + "5", "\u2212" * 60_000 + "5",
               ".5" * 30_000, "\u202f000" * 16_000, "1\u00a0" * 30_000, "1 000" * 12_000,
               "-.-" * 20_000, "#### " + "\u20131\u2009" * 12_000, "a.-" * 20_000,
               "1/." * 20_000, "/.5" * 20_000, "1/2." * 15_000, "1.5/2.5" * 8_500]:
    start = time.thread_time()
    r = V.gsm8k_result(text, "#### 5")
    assert _cpu_s(start) < 3.0, text[:40]  # no super-linear blow-up
    assert r.reward == 0.0 and not r.correct
  for text in ["." * 60_000 + "5", "a." * 30_000 + "5", "a.." * 20_000 + "5"]:
    start = time.thread_time()
    r = V.gsm8k_result(text, "#### 5")  # an ellipsis or a glued full stop is no decimal point
    assert _cpu_s(start) < 3.0, text[:40]
    assert r.correct, text[:40]


def test_gsm8k_fractions_stay_linear():
  # denominators' thousands groups, \frac with signs, a whole part or a minus before it
  for text in ["1/2,000" * 4_500, "1/2,000," * 4_000, "1/2" + ",000" * 8_000 + "1",
               "\\frac{1}{-2}" * 2_500, "-\\frac{1,000}{-2{,}000}" * 1_300,
               "x\\frac{1}{2}" * 2_500, "1 " * 15_000, "- " * 15_000, "\\frac{" * 5_000,
               "\\frac{" + "1," * 15_000, "1" * 30_000 + "\\frac"]:
    start = time.thread_time()
    r = V.gsm8k_result(text, "#### 5")
    assert _cpu_s(start) < 3.0, text[:40]  # no super-linear blow-up
    assert r.reward == 0.0 and not r.correct


def test_hostile_completions_are_cheap_and_inert(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  canary = tmp_path / "pwned"
  checks = [lambda s: V.gsm8k_result(s, "#### 5"),
            lambda s: V.countdown_reward(s, [1, 2, 3], 6),
            lambda s: V.sudoku_result(s, "0034341221404301", "1234341221434321")]
  for text in _hostile(canary.name):
    for check in checks:
      start = time.thread_time()
      r = check(text)
      assert _cpu_s(start) < 3.0, text[:40]  # no super-linear blow-up
      assert r.reward == 0.0 and not r.correct
  assert not canary.exists()


def test_hostile_math_under_the_hard_timeout(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # the worker inherits it: the canary's relative path lands here
  canary = tmp_path / "pwned"
  with T.TimedVerifier(V.math_result, 5.0, preload=("math_verify",)) as timed:
    for text in _hostile(canary.name) + ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{10^{10^{10}}}"]:
      timed.start()._worker.wait_ready(120.0)  # start-up (a restart's too) is not on the clock
      start = time.monotonic()
      r = timed(text, "5")
      # Wall clock, as the deadline is: no call outlives the 5 s deadline by more than a kill
      # and a restart's spawn, with room for a loaded 2-core CI box (8 s failed there).
      assert time.monotonic() - start < 15.0, text[:40]
      assert r.reward == 0.0 and not r.correct, text[:40]
    assert timed("\\boxed{5}", "5").correct  # still serving after all that
  assert not canary.exists()


def test_timeout_kills_and_restarts():
  timed = T.with_timeout(time.sleep, 0.5)
  assert timed(0) is None  # starts the worker (start-up is not on the clock)
  pid = timed._worker.proc.pid
  start = time.monotonic()
  r = timed(60)
  elapsed = time.monotonic() - start
  assert 0.5 <= elapsed < 5.0  # the deadline, then a kill and a spawn on a loaded CI box
  assert r.reward == 0.0 and not r.correct and r.info["reason"] == "timeout"
  assert timed.timeouts == 1 and timed.restarts == 1
  assert timed(0.01) is None and timed._worker.proc.pid != pid
  old = timed._worker.proc
  timed.close()
  assert old.poll() is not None


def test_timeout_on_a_slow_real_verifier():
  # A normal comparison passes under a generous limit (timing-independent on a loaded CI box).
  with T.TimedVerifier(V.math_result, 30.0, preload=("math_verify",)) as timed:
    assert timed("\\boxed{\\frac{2}{4}}", "0.5").correct
  # math-verify's own 1 s limit would stop this comparison later; the hard limit first.
  with T.TimedVerifier(V.math_result, 0.3, preload=("math_verify",)) as timed:
    timed.start()._worker.wait_ready(120.0)  # importing math_verify is not on the clock
    start = time.monotonic()
    r = timed("\\boxed{9^{9^{9}}}", "5")
    assert r.info["reason"] == "timeout" and time.monotonic() - start < 10.0  # loaded CI box


def test_worker_errors():
  with pytest.raises(TypeError, match="picklable"):
    T.TimedVerifier(lambda s: s, 1.0)
  with pytest.raises(ValueError, match="seconds"):
    T.TimedVerifier(len, 0)
  with T.TimedVerifier(math.sqrt, 2.0, max_memory_mb=1024) as timed:
    assert timed(4.0) == 2.0
    with pytest.raises(T.VerifierError, match="math domain error"):
      timed(-1.0)
    assert timed(9.0) == 3.0
  with T.TimedVerifier(bytearray, 2.0, max_memory_mb=1024) as timed:
    r = timed(4 << 30)  # 4 GiB under a 1 GiB address-space cap
    assert r.reward == 0.0 and "MemoryError" in r.info["reason"]
    assert timed(3) == bytearray(3)
