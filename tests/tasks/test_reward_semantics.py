"""Reward rules no other test pinned, found by mutating the reward path one rule at a time (a
changed rule that left every test passing): each case below is computed by hand from the
official semantics (d1 @837888f ``diffu-grpo/reward_func.py`` for GSM8K, Countdown and
Sudoku; the task docstrings for the generated tasks) and fails when its rule is changed."""

import pytest

from dllm_rl.tasks import make_task
from dllm_rl.tasks import verifiers as V
from dllm_rl.tasks.base import Example
from dllm_rl.tasks.chain import grade_chain
from dllm_rl.tasks.sudoku import is_valid_solution


# --- answer extraction ------------------------------------------------------------------------

def test_an_escaped_brace_neither_opens_nor_closes_a_boxed_answer():
  # "\{" is a literal brace: the box closes at the '}' after 5, so the answer is 5, not the
  # last number of the text (9), which counting "\{" as an opening brace would give.
  assert V.last_boxed("\\boxed{\\{5} and 9") == "\\{5"
  assert V.gsm8k_answer("\\boxed{\\{5} and 9") == "5"


def test_the_answer_span_ends_at_the_first_closing_tag_after_the_last_opening_one():
  # "</answer>" text after the span is not part of it: the expression 3*5+7 alone is graded.
  text = "<answer>3*5+7</answer> that is 22</answer>"
  assert V.answer_span(text) == "3*5+7"
  assert V.countdown_reward(text, [3, 5, 7], 22).correct


def test_a_gsm8k_answer_near_the_reference_is_wrong():
  # Exact rational comparison: no rounding or tolerance.
  for completion in ("#### 3.4", "#### 2.5", "The answer is 2.999"):
    r = V.gsm8k_result(completion, "#### 3")
    assert (r.reward, r.correct) == (0.0, False), completion
  assert V.gsm8k_result("#### 3.0", "#### 3").correct


# --- d1's GSM8K and MATH rewards, as run (xmlcount + soft + strict + int + correctness) ------

R = "<reasoning>\nr\n</reasoning>\n"  # one line of reasoning in d1's tag lines


@pytest.mark.parametrize("completion, reward", [
    (R + "<answer>\n42\n</answer>\n", 0.5 + 0.5 + 0.5 + 2.0),  # 4 tag lines, strict, int, right
    # text after the last tag line: xmlcount loses 0.001 a character twice, strict's '$' fails
    (R + "<answer>\n42\n</answer>\nextra", 0.5 - 0.005 - 0.005 + 0.5 + 2.0),
    # no newline after </answer>: the text after "\n</answer>\n" is the whole text (48
    # characters), the text after "\n</answer>" is empty (-1 character: +0.001)
    (R + "<answer>\n42\n</answer>", 0.5 - 0.048 + 0.001 + 0.5 + 2.0),
    ("<reasoning>r</reasoning><answer>42</answer>", 0.5 + 0.5 + 2.0),  # soft: re.match
    ("x<reasoning>r</reasoning><answer>42</answer>", 0.5 + 2.0),  # not at the start: no soft
    ("<answer>7</answer> <answer>42</answer>", 0.5 + 2.0),  # the last <answer> is read
    ("<answer>1,000</answer>", 0.0),  # not digits, not the text "1000"
])
def test_d1_gsm8k_reward_sums_its_five_terms_as_d1_computes_them(completion, reward):
  answer = "1000" if "1,000" in completion else "42"
  assert V.d1_gsm8k_reward(completion, answer) == pytest.approx(reward, abs=1e-9)


def test_d1_gsm8k_int_reward_is_for_digits_only():
  # "-5".isdigit() is False: a negative answer earns correctness (2.0) but no int reward.
  assert V.d1_gsm8k_reward("<answer>-5</answer>", "-5") == 2.0


def test_d1_math_format_reward_as_run():
  # 0.5 x (1 for an <answer> tag + 0.5: d1's "\boxed" literal is a backspace, never found)
  assert V.d1_math_format_reward("<answer>\\boxed{1}</answer>") == 0.75
  assert V.d1_math_format_reward("\\boxed{1}") == 0.25


# --- Countdown --------------------------------------------------------------------------------

def test_countdown_needs_every_number_not_only_no_number_twice():
  # d1's validate_equation: sorted(numbers in the equation) == sorted(available numbers).
  for text in ("3*5", "15"):
    r = V.countdown_reward(text, [3, 5, 7], 15)
    assert r.reward == 0.0 and "exactly once" in r.info["reason"], text
  task = make_task("countdown")
  ex = Example("3,5,7>15=", "", {"numbers": [3, 5, 7], "target": 15})
  assert not task.verify(ex, "3*5").correct


def test_countdown_value_must_equal_the_target_exactly_not_its_integer_part():
  # 7/2*1 is 3.5 and 7/2+1 is 4.5 (exact rationals; d1: |result - target| < 1e-5).
  assert V.countdown_reward("7/2*1", [7, 2, 1], 3).info["reason"] == "wrong value"
  assert V.countdown_reward("7/2+1", [7, 2, 1], 4).reward == 0.0
  assert V.countdown_reward("7*2/1", [7, 2, 1], 14).correct


@pytest.mark.parametrize("text, numbers, target, score", [
    ("<answer>1/100001</answer>", [1, 100001], 0, 1.0),  # 9.99990e-06 < 1e-5: d1's 1.0
    ("<answer>1/100000</answer>", [1, 100000], 0, 0.1),  # exactly 1e-5: not below it
    ("<answer>3*5+7</answer>", [7, 5, 3], 22, 1.0),  # sorted multisets, any order
    ("<answer>3*5+7.</answer>", [3, 5, 7], 22, 0.1),  # a decimal point: d1 scores 1.0
    ("<answer>-3+5*7-10</answer>", [3, 5, 7, 10], 22, 0.1),  # unary minus: d1 scores 1.0
    ("<answer>3**2+13</answer>", [3, 2, 13], 22, 0.1),  # "**": d1 scores 1.0
    ("<answer>3*5+7</answer><answer>1</answer>", [3, 5, 7], 22, 0.1),  # the last span only
    ("<answer>  </answer>", [3, 5, 7], 22, 0.1),  # an empty span is a span
    ("<answer>3*5\n+7</answer>", [3, 5, 7], 22, 0.1),  # eval: SyntaxError (a line break)
    ("<answer>3*5+\r7</answer>", [3, 5, 7], 22, 0.1),
    ("<answer>(3*5\n+7)</answer>", [3, 5, 7], 22, 1.0),  # joined inside parentheses
    ("<answer>\n3*5+7\n</answer>", [3, 5, 7], 22, 1.0),  # stripped
])
def test_d1_countdown_reward_edges(text, numbers, target, score):
  """d1's compute_score by hand, and where the safe parser parts from d1's eval (its unary
  sign, "**", decimals score the format score here, as the verifier reward rejects them)."""
  r = V.d1_countdown_result(text, numbers, target, 0.1)
  assert (r.reward, r.correct) == (score, score == 1.0), r.info


# --- 4x4 sudoku -------------------------------------------------------------------------------

def test_a_latin_square_that_breaks_a_box_is_not_a_solution():
  # Rows and columns each hold 1-4 once, but the top-left box holds 1, 2, 2, 1. It keeps the
  # givens (rows 1 and 4) of a puzzle whose one solution is 1234/3412/2143/4321.
  latin = "1234214334124321"
  assert not is_valid_solution([int(ch) for ch in latin])
  puzzle, solution = "1234000000004321", "1234341221434321"
  r = V.sudoku_result(latin, puzzle, solution)
  assert (r.reward, r.correct, r.info["reason"]) == (0.0, False, "not a valid sudoku")
  assert r.info["cell_accuracy"] == 0.0  # its rows 2 and 3 are the solution's rows 3 and 2
  assert V.sudoku_result(solution, puzzle, solution).correct


# --- chain addition ---------------------------------------------------------------------------

def test_a_chain_adds_each_operand_as_often_as_the_prompt_has_it():
  # operands 1, 1, 2: adding 2 twice and 1 once uses the same *set* of numbers, a wrong total.
  r = grade_chain("1+2=3,3+2=5", [1, 1, 2])
  assert r.reward == 0.0 and "must add each" in r.info["reason"]
  assert grade_chain("1+2=3,3+1=4", [1, 1, 2]).correct


def test_a_chain_step_with_text_after_it_is_malformed():
  r = grade_chain("1+1=2,2+2=4x", [1, 1, 2])
  assert (r.reward, r.parsed) == (0.0, None)
  assert grade_chain("1+1=2,2+2=4", [1, 1, 2]).correct


# --- sum split --------------------------------------------------------------------------------

@pytest.mark.parametrize("reverse, completion", [(True, "0001+0"), (False, "1000+0")])
def test_a_sum_split_addend_has_at_most_num_digits_digits(reverse, completion):
  # 1000 + 0 is the target 1000, but 1000 is not a 3-digit addend (0 <= x, y < 10**3).
  task = make_task("sum_split", num_digits=3, reverse=reverse)
  ex = Example("0001=" if reverse else "1000=", "", {"target": 1000, "x": 500})
  r = task.verify(ex, completion)
  assert (r.reward, r.correct, r.parsed) == (0.0, False, None)
  assert task.verify(ex, "005+005" if reverse else "500+500").correct


# --- file tasks: a wrong_reward replaces a 0, never partial or format credit ------------------

def test_a_wrong_reward_keeps_partial_credit_and_replaces_only_a_zero(tmp_path):
  path = tmp_path / "sudoku.jsonl"
  path.write_text('{"puzzle": "0034341221404301", "solution": "1234341221434321"}\n')
  task = make_task("sudoku_jsonl", test_file=str(path), reward="cell_accuracy",
                   wrong_reward=-1.0)
  ex = task.generate("test", -1, seed=0)[0]
  assert task.verify(ex, "<answer>1234341221404301</answer>").reward == 0.5  # 2 of 4 blanks
  assert task.verify(ex, "<answer>4444444444444444</answer>").reward == -1.0  # none right
  assert task.verify(ex, "<answer>1234341221434321</answer>").reward == 1.0
