"""Task registry, make_task errors, split assignment."""

import json

import pytest

from dllm_rl.tasks import TASKS, Example, Task, VerifyResult, make_task
from dllm_rl.tasks.base import split_of


def test_builtin_tasks_registered():
  assert {"arithmetic", "countdown", "sudoku"} <= set(TASKS.names())
  for name in ("arithmetic", "countdown", "sudoku"):
    task = make_task(name)
    assert isinstance(task, Task) and task.name == name


def test_unknown_name_and_kwargs():
  with pytest.raises(ValueError, match="unknown task 'arithmetik'.*Did you mean 'arithmetic'"):
    make_task("arithmetik")
  with pytest.raises(ValueError, match=r"unknown option\(s\) \['digits'\].*num_digits"):
    make_task("arithmetic", digits=3)


def test_split_of_is_deterministic_and_respects_fraction():
  keys = [f"k{i}" for i in range(20000)]
  splits = [split_of(k, 0.1) for k in keys]
  assert splits == [split_of(k, 0.1) for k in keys]
  frac = splits.count("test") / len(keys)
  assert 0.09 < frac < 0.11
  # Monotone in the fraction: a test instance stays test when the fraction grows.
  assert all(split_of(k, 0.3) == "test" for k, s in zip(keys, splits) if s == "test")


def test_examples_are_frozen_and_meta_json_serialisable():
  for name in ("arithmetic", "countdown", "sudoku"):
    task = make_task(name)
    ex = task.generate("train", 3, 0)[0]
    assert isinstance(ex, Example)
    json.dumps(dict(ex.meta))
    r = task.verify(ex, ex.answer)
    assert isinstance(r, VerifyResult)
    json.dumps(dict(r.info))
    with pytest.raises(AttributeError):
      ex.prompt = "x"


def test_bad_generate_arguments():
  task = make_task("arithmetic")
  with pytest.raises(ValueError, match="split"):
    task.generate("validation", 1, 0)
  with pytest.raises(ValueError, match="seed"):
    task.generate("train", 1, -1)
  with pytest.raises(ValueError, match="test_fraction"):
    make_task("arithmetic", test_fraction=1.0)
  assert task.generate("test", 0, 0) == []
