"""Arithmetic task: answer convention, splits, verifier."""

import pytest

from dllm_rl.tasks import CharTokenizer, make_task
from dllm_rl.tasks.arithmetic import format_answer, parse_answer
from dllm_rl.tasks.base import Example


def test_answer_convention():
  assert format_answer(579, reverse=True) == "975"
  assert format_answer(780, reverse=True) == "087"
  assert format_answer(-15, reverse=True) == "-51"
  assert format_answer(0, reverse=True) == "0"
  assert format_answer(-15, reverse=False) == "-15"
  for v in (0, 7, 10, 120, -333, -1000, 123456):
    for rev in (True, False):
      assert parse_answer(format_answer(v, rev), rev) == v


def test_determinism_and_formats():
  task = make_task("arithmetic", num_digits=3, ops="+-*")
  a = task.generate("train", 300, seed=5)
  assert a == task.generate("train", 300, seed=5)
  assert a != task.generate("train", 300, seed=6)
  tok = CharTokenizer()
  for ex in a:
    m = ex.meta
    assert ex.prompt == f"{m['a']:03d}{m['op']}{m['b']:03d}="  # zero-padded operands
    assert 0 <= m["a"] < 1000 and 0 <= m["b"] < 1000 and m["op"] in "+-*"
    tok.encode(ex.prompt + ex.answer)
  assert {ex.meta["op"] for ex in a} == {"+", "-", "*"}
  unpadded = make_task("arithmetic", num_digits=3, pad_operands=False).generate("train", 50, 0)
  assert all(ex.prompt == f"{ex.meta['a']}+{ex.meta['b']}=" for ex in unpadded)


def test_splits_disjoint_and_own_answers_verify():
  task = make_task("arithmetic", ops="+-*")
  train = task.generate("train", 2000, seed=0)
  test = task.generate("test", 200, seed=0)
  keys_train = {task.canonical(ex) for ex in train}
  keys_test = {task.canonical(ex) for ex in test}
  assert len(keys_train) == 2000 and len(keys_test) == 200
  assert not keys_train & keys_test
  # Another seed's train set still never meets the test set.
  assert not {task.canonical(ex) for ex in task.generate("train", 2000, seed=1)} & keys_test
  for ex in train + test:
    r = task.verify(ex, ex.answer)
    assert r.correct and r.reward == 1.0


def test_verify_right_wrong_malformed():
  task = make_task("arithmetic")
  ex = next(e for e in task.generate("train", 50, 0) if e.meta["value"] >= 10)
  assert task.verify(ex, " " + ex.answer + "\n").correct
  wrong = task.verify(ex, format_answer(ex.meta["value"] + 1, True))
  assert not wrong.correct and wrong.reward == 0 and wrong.info["reason"] == "wrong value"
  # Not reversed → wrong (unless palindromic).
  unrev = str(ex.meta["value"])
  assert task.verify(ex, unrev).correct == (unrev == unrev[::-1])
  for bad in ("", "12a", "1 2", "+12", "--1", "1-", "½", "__import__('os')",
              "9" * 10000, "2**99999"):
    r = task.verify(ex, bad)
    assert (r.reward, r.correct, r.parsed) == (0.0, False, None) and r.info["reason"]


def test_parsed_answer_is_the_value_so_zero_padding_is_one_answer():
  ex = Example("123+456=", "975", {"a": 123, "b": 456, "op": "+", "value": 579})
  assert {make_task("arithmetic").verify(ex, t).parsed for t in ("975", "9750", "97500")} \
      == {"975"}
  plain = make_task("arithmetic", reverse_answer=False)
  assert {plain.verify(ex, t).parsed for t in ("579", "0579")} == {"579"}
  neg = Example("5-20=", "-51", {"a": 5, "b": 20, "op": "-", "value": -15})
  assert {make_task("arithmetic", ops="-").verify(neg, t).parsed for t in ("-51", "-510")} \
      == {"-51"}


def test_negative_results_and_plain_order():
  task = make_task("arithmetic", ops="-", reverse_answer=False)
  exs = task.generate("train", 200, 0)
  neg = [e for e in exs if e.meta["value"] < 0]
  assert neg and all(e.answer == str(e.meta["value"]) for e in exs)
  rtask = make_task("arithmetic", ops="-")
  for e in neg:
    digits = str(-e.meta["value"])[::-1]
    assert rtask.verify(e, "-" + digits).correct
    assert not rtask.verify(e, digits).correct


def test_small_space_exhaustion_and_validation():
  task = make_task("arithmetic", num_digits=1)  # 100 instances in all
  assert len(task.generate("train", 80, 0)) == 80
  with pytest.raises(ValueError, match="only .* distinct"):
    task.generate("train", 101, 0)
  with pytest.raises(ValueError, match="split"):
    task.generate("valid", 1, 0)
  with pytest.raises(ValueError, match="ops"):
    make_task("arithmetic", ops="/")
  with pytest.raises(ValueError, match="num_digits"):
    make_task("arithmetic", num_digits=0)


def test_reverse_operands_align_digit_columns():
  task = make_task("arithmetic", num_digits=3, reverse_operands=True)
  for ex in task.generate("train", 100, seed=0):
    a, b = ex.meta["a"], ex.meta["b"]
    assert ex.prompt == f"{a:03d}"[::-1] + "+" + f"{b:03d}"[::-1] + "="
    assert task.verify(ex, ex.answer).correct
