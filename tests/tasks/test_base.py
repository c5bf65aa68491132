"""Task registry, make_task errors, split assignment."""

import inspect
import json
import re

import pytest

from dllm_rl.tasks import TASKS, CharTokenizer, Example, Task, VerifyResult, make_task
from dllm_rl.tasks.base import split_of


def test_builtin_tasks_registered():
  assert {"arithmetic", "countdown", "sudoku"} <= set(TASKS.names())
  for name in ("arithmetic", "countdown", "sudoku"):
    task = make_task(name)
    assert isinstance(task, Task) and task.name == name



def _generated(name):
  """The registered task ``name`` with its default options; None for one that needs files
  (``train_file`` / ``test_file``: the JSONL and code tasks, tested in their own files)."""
  try:
    return make_task(name)
  except ValueError as err:
    if "needs option" in str(err):
      return None
    raise


@pytest.mark.parametrize("name", TASKS.names())
def test_every_generated_task_keeps_the_task_contract(name):
  """Runs every registered task that builds with its default options, a new one included
  (README "Adding a component"): ``name`` is its registry name (messages use it), both splits
  give distinct examples, each SFT answer verifies as correct with a VerifyResult, text the
  verifier cannot parse is graded as wrong, never raised on, and the text is
  CharTokenizer's where ``char_text`` says so."""
  task = _generated(name)
  if task is None:
    pytest.skip(f"task {name!r} reads files")
  assert task.name == name
  tok = CharTokenizer()
  for split in ("train", "test"):
    examples = task.generate(split, 4, 0)
    assert len({task.canonical(ex) for ex in examples}) == 4
    for ex in examples:
      result = task.verify(ex, ex.answer)
      assert isinstance(result, VerifyResult) and result.correct, (split, ex, result)
      json.dumps(dict(ex.meta))
      if task.char_text:
        assert tok.decode(tok.encode(ex.prompt + ex.answer)) == ex.prompt + ex.answer
      for junk in ("", "?", ex.answer + ex.answer):
        graded = task.verify(ex, junk)
        assert isinstance(graded, VerifyResult) and not graded.correct
  params = inspect.signature(type(task)).parameters
  assert set(task.size_options) <= set(params), "size_options must name constructor options"


def test_an_exhausted_split_gives_up_after_stall_draws_not_the_whole_budget():
  """1-digit addition has ~50 training instances at test_fraction 0.5: asked for 2000 by a task
  that does not count them (``split_size`` None), generation stops ``stall_draws()`` (5,000)
  draws after the last new one, not after ``max_draws(2000)`` (81,000); the message names the
  task, the count found and why, without claiming more than it knows (rarer instances could be
  left)."""
  from dllm_rl.tasks.arithmetic import ArithmeticTask

  class Counted(ArithmeticTask):
    draws = 0

    def sample(self, rng):
      Counted.draws += 1
      return super().sample(rng)

    def split_size(self, split):
      return None

  task = Counted(num_digits=1, test_fraction=0.5)
  assert task.stall_draws() == 5_000 and task.max_draws(2000) == 81_000
  with pytest.raises(ValueError, match=r"task 'arithmetic': found only (\d+) distinct 'train' "
                     r"instances of the 2000 requested \(none new in the last 5000 of \d+ draws:"
                     r" its options give no more, or only ones too rare to find\)$") as err:
    task.generate("train", 2000, 0)
  found = int(err.value.args[0].split("found only ")[1].split()[0])
  assert 35 < found < 65 and 5_000 < Counted.draws < 6_000
  assert Counted.draws == int(str(err.value).split(" of ")[2].split()[0])
  assert Task.enlarge_hint(task) == ("change task.options.num_digits or task.options.ops for"
                                     " more distinct instances")


def test_a_counted_split_whose_last_instances_are_too_rare_says_how_many_are_left():
  """2-digit addition at test_fraction 0.5 draws each of its 10**4 instances one draw in
  10**4, rarer than ``stall_draws`` (5,000) supports: asked for all 4,981 training ones, it
  gives up with a few left, and says how many of the count (``split_size``) are left, not
  that the options give no more (the old message, false here)."""
  task = make_task("arithmetic", num_digits=2, test_fraction=0.5)
  size = task.split_size("train")
  assert size == 4981 and task.stall_draws() == 5_000
  with pytest.raises(ValueError, match=rf"found only (\d+) distinct 'train' instances of the"
                     rf" {size} requested \(none new in the last 5000 of \d+ draws: the other"
                     rf" (\d+) of its {size} are too rare to find\)$") as err:
    task.generate("train", size, 0)
  found, left = (int(x) for x in re.search(r"only (\d+) .* other (\d+) ", str(err.value)).groups())
  assert found + left == size and 0 < left < 20


def test_a_split_larger_than_its_counted_size_fails_before_any_draw():
  """A task that counts a split's instances (``split_size``) is not drawn from for more than
  that: the error names the count and the request; up to the count it draws as before."""
  from dllm_rl.tasks.arithmetic import ArithmeticTask

  class Counted(ArithmeticTask):
    draws = 0

    def sample(self, rng):
      Counted.draws += 1
      return super().sample(rng)

    def split_size(self, split):
      return 50

  with pytest.raises(ValueError, match=r"task 'arithmetic': its options give only 50 distinct"
                     r" 'test' instances, fewer than the 51 requested"):
    Counted(num_digits=1, test_fraction=0.5).generate("test", 51, 0)
  assert Counted.draws == 0
  assert Counted(num_digits=1, test_fraction=0.5).generate("test", 20, 0) == ArithmeticTask(
      num_digits=1, test_fraction=0.5).generate("test", 20, 0)


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


class _NoVerify(Task):
  """A new task that forgot ``verify``."""
  name = "no_verify"

  def sample(self, rng):
    return Example(prompt="1", answer="1")

  def canonical(self, example):
    return example.prompt


def test_a_task_without_verify_is_named_under_task_name(monkeypatch):
  """A task class that leaves out a method of the contract is its task.name's problem (as a
  verify returning no VerifyResult is), said before anything is built; it was reported as
  ``config.task.options: Can't instantiate abstract class ...``, its options' fault."""
  from dllm_rl.config import ConfigError, base_config
  from dllm_rl.planning.planner import validated
  from dllm_rl.train.validate import validate

  monkeypatch.setitem(TASKS._items, "no_verify", _NoVerify)
  config = base_config()
  config.task.name = "no_verify"
  for check in (validate, validated):  # the run's validation and the planner's
    with pytest.raises(ConfigError) as err:
      check(config)
    assert [(e.key, e.message) for e in getattr(err.value, "errors", [err.value])] == [
        ("task.name", "'no_verify': _NoVerify (tests.tasks.test_base) does not implement"
         " verify; a task subclasses dllm_rl.tasks.base.Task and implements sample, canonical"
         " and verify")]
  from dllm_rl.tasks import contract_problem
  assert contract_problem("arithmetic") is None
