"""Sum split: many correct answers per prompt, splits by target, grading by value."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_rl.tasks import CharTokenizer, make_task


def test_the_docstring_example():
  task = make_task("sum_split", num_digits=3)
  ex = next(e for e in task.generate("train", 20000, 0) if e.meta["target"] == 456)
  assert ex.prompt == "6540="
  x = ex.meta["x"]
  assert ex.answer == f"{x:03d}"[::-1] + "+" + f"{456 - x:03d}"[::-1]
  assert task.verify(ex, "321+333").correct and task.verify(ex, "321+333").parsed == "123+333"


def test_generated_examples_fit_the_default_lengths_and_are_correct():
  task = make_task("sum_split", num_digits=3)
  train = task.generate("train", 3000, 0)
  assert train == task.generate("train", 3000, 0)
  tok = CharTokenizer()
  for ex in train:
    assert len(ex.prompt) == 5 and len(ex.answer) == 7  # + EOS: the default's 8 + 8 tokens
    tok.encode(ex.prompt + ex.answer)
    assert task.verify(ex, ex.answer).correct


def test_a_test_target_is_never_trained_on_with_any_answer():
  task = make_task("sum_split", num_digits=2)
  train, test = task.generate("train", 2000, 0), task.generate("test", 100, 0)
  assert {e.meta["target"] for e in train}.isdisjoint({e.meta["target"] for e in test})
  # Several training answers per target: what makes the start write different answers.
  per_target = {}
  for e in train:
    per_target.setdefault(e.meta["target"], set()).add(e.answer)
  assert max(len(a) for a in per_target.values()) > 5


def test_every_split_of_a_target_is_a_distinct_correct_answer():
  task = make_task("sum_split", num_digits=2)
  ex = task.generate("test", 50, 1)[0]
  t = ex.meta["target"]
  fmt = lambda v: f"{v:02d}"[::-1]  # noqa: E731
  parsed = {task.verify(ex, f"{fmt(x)}+{fmt(t - x)}").parsed
            for x in range(100) if 0 <= t - x <= 99}
  assert len(parsed) == task.num_answers(t) and None not in parsed
  assert task.num_answers(0) == 1 and task.num_answers(99) == 100 and task.num_answers(198) == 1


@pytest.mark.parametrize("completion,reason", [
    ("", "two numbers"), ("12+", "two numbers"), ("1234+1", "too long"), ("12-34", "two numbers"),
    ("a1+23", "two numbers"), ("99+99", "is 198"),
])
def test_malformed_and_wrong_completions_score_zero(completion, reason):
  task = make_task("sum_split", num_digits=2)
  ex = task.generate("train", 1, 0)[0]
  ex = type(ex)(ex.prompt, ex.answer, {**ex.meta, "target": 7})
  result = task.verify(ex, completion)
  assert result.reward == 0.0 and not result.correct and reason in result.info["reason"]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12))
def test_arbitrary_text_never_raises(text):
  task = make_task("sum_split", num_digits=3)
  ex = task.generate("train", 1, 0)[0]
  assert task.verify(ex, text).reward in (0.0, 1.0)


def test_bad_options_name_the_option():
  with pytest.raises(ValueError, match="num_digits"):
    make_task("sum_split", num_digits=0)
