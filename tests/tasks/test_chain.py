"""Chain addition with a scratchpad: the generator, any-order grading, hostile completions."""

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm_rl.tasks import CharTokenizer, make_task
from dllm_rl.tasks.chain import chain_answer, grade_chain


def test_the_docstring_example():
  assert chain_answer([347, 205, 918, 66], 3) == "743+502=2550,2550+819=0741,0741+660=6351"
  assert grade_chain("743+502=2550,2550+819=0741,0741+660=6351", [347, 205, 918, 66]).correct


def test_generated_examples_are_long_distinct_and_correct():
  task = make_task("chain", num_numbers=4, num_digits=3)
  train, test = task.generate("train", 500, 0), task.generate("test", 100, 0)
  assert train == task.generate("train", 500, 0)
  assert not {task.canonical(e) for e in train} & {task.canonical(e) for e in test}
  tok = CharTokenizer()
  for ex in train + test:
    ops = ex.meta["operands"]
    assert ex.prompt == "+".join(f"{x:03d}"[::-1] for x in ops) + "="
    assert len(ex.prompt) == 16 and len(ex.answer) == 40  # ≥ 32 scored tokens
    assert ex.meta["total"] == sum(ops)
    tok.encode(ex.prompt + ex.answer)
    assert task.verify(ex, ex.answer).correct


def test_every_order_of_the_operands_is_a_distinct_correct_answer():
  ops = [347, 205, 918, 66]
  answers = {chain_answer(list(p), 3) for p in itertools.permutations(ops)}
  assert len(answers) == 24
  assert all(grade_chain(a, ops).correct for a in answers)
  # Padding is optional: numbers are read by value (reversed digits).
  assert grade_chain("743+502=255,255+819=0741,0741+66=6351", ops).correct


def test_the_parsed_answer_is_the_order_so_paddings_of_one_order_are_one_answer():
  # distinct_correct counts distinct parsed answers, i.e. distinct orders
  ops = [347, 205, 918, 66]
  padded = chain_answer(ops, 3)
  texts = (padded, "743+502=255,255+819=0741,0741+66=6351",
           "7430+502=2550,2550+819=0741,0741+66=6351")
  assert all(grade_chain(t, ops).correct for t in texts)
  assert {grade_chain(t, ops, num_digits=3).parsed for t in texts} == {padded}
  assert {grade_chain(t, ops).parsed for t in texts} == {"743+502=255,255+819=0741,0741+66=6351"}
  task = make_task("chain", num_numbers=4, num_digits=3)
  ex = task.generate("train", 1, 0)[0]
  assert task.verify(ex, ex.answer).parsed == ex.answer


@pytest.mark.parametrize("text, reason", [
    ("743+502=2550,2550+819=0741", "must add each"),               # one operand missing
    ("743+502=2550,2550+819=0741,0741+660=6352", "is not"),        # wrong last sum
    ("743+502=2550,2551+819=0751,0751+660=6451", "previous sum"),  # chain broken
    ("743+502=2550,2550+819=0741,0741+819=8832", "must add each"),  # an operand twice
    ("743+502=2550,,0741+660=6351", "not 'S+X=T'"),
    ("6351", "not 'S+X=T'"),
    ("", "not 'S+X=T'"),
])
def test_wrong_chains_score_zero_with_the_reason(text, reason):
  result = grade_chain(text, [347, 205, 918, 66])
  assert result.reward == 0.0 and not result.correct
  assert reason in (result.info.get("reason") or result.info.get("error") or str(result.info))


@settings(derandomize=True, database=None, deadline=None, max_examples=200,
          suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(alphabet="0123456789+=,x -", max_size=80))
def test_any_text_is_graded_never_raises(text):
  result = grade_chain(text, [347, 205, 918, 66])
  assert result.reward in (0.0, 1.0)


def test_bad_options_are_refused():
  with pytest.raises(ValueError, match="num_numbers"):
    make_task("chain", num_numbers=1)
  with pytest.raises(ValueError, match="unknown option"):
    make_task("chain", num_operands=4)


def test_rotated_and_random_answer_orders_write_many_correct_orders():
  task = make_task("chain", num_numbers=6, num_digits=1, answer_order="random")
  train = task.generate("train", 400, 0)
  assert train == task.generate("train", 400, 0)
  first_ops = []
  for ex in train:
    assert task.verify(ex, ex.answer).correct
    first_ops.append([int(ex.answer[0]), int(ex.answer[2])] == ex.meta["operands"][:2])
  # The prompt's own first two operands open about 1 in 30 answers, not all of them.
  assert 0 < sum(first_ops) < 0.15 * len(train)
  rotations = make_task("chain", num_numbers=6, num_digits=1, answer_order="rotation")
  starts = set()
  for ex in rotations.generate("train", 200, 0):
    ops = ex.meta["operands"]
    shift = next(s for s in range(6) if chain_answer(ops[s:] + ops[:s], 1) == ex.answer)
    starts.add(shift)
    assert rotations.verify(ex, ex.answer).correct
  assert starts == set(range(6))  # every rotation occurs
  two = make_task("chain", num_numbers=6, num_digits=1, answer_order="prompt_or_reverse")
  orders = []
  for ex in two.generate("train", 200, 0):
    ops = ex.meta["operands"]
    assert ex.answer in (chain_answer(ops, 1), chain_answer(ops[::-1], 1))
    assert two.verify(ex, ex.answer).correct
    orders.append(ex.answer == chain_answer(ops, 1))
  assert 0.35 < sum(orders) / len(orders) < 0.65  # about half in each order
  with pytest.raises(ValueError, match="answer_order"):
    make_task("chain", answer_order="sorted")
