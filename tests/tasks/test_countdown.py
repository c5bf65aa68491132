"""Countdown: generator invariants, exact-once usage, hostile completions."""

import hashlib
import time
from collections import Counter

import numpy as np
import pytest

from dllm_rl.tasks import CharTokenizer, make_task
from dllm_rl.tasks.countdown import combine
from dllm_rl.tasks.base import Example, split_of
from dllm_rl.tasks.safe_arith import parse_expression


def _ex(numbers, target):
  prompt = ",".join(map(str, numbers)) + f">{target}="
  return Example(prompt=prompt, answer="", meta={"numbers": numbers, "target": target})


@pytest.mark.parametrize("num_numbers", [3, 4])
def test_generated_examples(num_numbers):
  task = make_task("countdown", num_numbers=num_numbers)
  train = task.generate("train", 2000, 0)
  test = task.generate("test", 200, 0)
  assert train == task.generate("train", 2000, 0)
  assert not {task.canonical(e) for e in train} & {task.canonical(e) for e in test}
  assert len({task.canonical(e) for e in train}) == 2000
  tok = CharTokenizer()
  for ex in train + test:
    nums, target = ex.meta["numbers"], ex.meta["target"]
    assert len(nums) == num_numbers and all(1 <= x <= 20 for x in nums)
    assert 1 <= target <= 100
    assert ex.prompt == ",".join(map(str, nums)) + f">{target}="
    assert " " not in ex.answer
    value, literals, canonical = parse_expression(ex.answer)
    assert value == target and Counter(literals) == Counter(nums)
    assert canonical == ex.answer  # minimal parentheses: the answer is its own canonical form
    tok.encode(ex.prompt + ex.answer)
    assert task.verify(ex, ex.answer).correct


def test_minimal_parentheses_keep_value():
  a, b, c = ((parse_expression(s).value, s, 3) for s in ("8", "4", "2"))
  for op1 in "+-*/":
    for op2 in "+-*/":
      inner = combine(b, op1, c)
      for node in (combine(a, op2, inner), combine(inner, op2, a)):
        if node is not None:
          assert parse_expression(node[1]).value == node[0]
  assert combine(a, "-", combine(b, "-", c))[1] == "8-(4-2)"
  assert combine(a, "+", combine(b, "-", c))[1] == "8+4-2"
  assert combine(combine(a, "+", b), "*", c)[1] == "(8+4)*2"
  assert combine(a, "/", combine(b, "*", c))[1] == "8/(4*2)"
  assert combine(a, "*", combine(b, "/", c))[1] == "8*4/2"
  assert combine(c, "/", b) is None  # 2/4 is not exact
  assert combine(a, "/", combine(c, "-", c)) is None  # division by zero


def test_verify_right_and_wrong():
  task = make_task("countdown")
  ex = _ex([3, 5, 7], 22)
  for good in ("3*5+7", "7+3*5", "(5*3)+7", " 7 + 5*3 \n"):
    r = task.verify(ex, good)
    assert r.correct and r.reward == 1.0, good
  cases = {
      "3*5+7+0": "exactly once",   # extra number
      "5*5-3": "exactly once",     # reuse, missing 7
      "3*7+1": "exactly once",     # foreign number
      "15+7": "exactly once",      # missing numbers
      "3+5+7": "wrong value",
      "7*3+5/5": "exactly once",
  }
  for text, reason in cases.items():
    r = task.verify(ex, text)
    assert not r.correct and r.reward == 0.0 and reason in r.info["reason"], text
  # Duplicates in the given numbers must be used exactly as many times.
  ex2 = _ex([4, 4, 2], 10)
  assert task.verify(ex2, "4+4+2").correct
  assert not task.verify(ex2, "4*2+2").correct
  # Rational intermediates are fine if the value is exact.
  assert task.verify(_ex([1, 3, 9], 3), "1/3*9").correct


def test_parsed_answer_ignores_spacing():
  # distinct_correct counts distinct parsed answers: spacing alone is not a new expression
  task = make_task("countdown")
  ex = _ex([3, 5, 7], 22)
  parsed = {task.verify(ex, text).parsed for text in ("3*5+7", " 3 * 5 + 7 ", "3*5 +\n7")}
  assert parsed == {"3*5+7"}


def test_answers_differing_only_in_redundant_parentheses_count_once():
  """distinct_correct (and diversity) count distinct parsed answers: the canonical text, so
  parentheses that change nothing are not a new expression; another order of the numbers is."""
  from dllm_rl.tasks.countdown import grade_expression
  from dllm_rl.tasks.verifiers import countdown_reward
  from dllm_rl.train.evaluation import distinct_correct
  rows = [["(1+2)*3", "((1+2))*3", "(1+2)*(3)", " ( 1 + 2 ) * 3", "3*(1+2)", "1+2*3"],
          ["1+(2+3)", "1+2+3", "(1+2)+3", "((1)+2)+(3)", "3+2+1", "1+2*3"]]
  targets = [9, 6]
  results = [[grade_expression(t, [1, 2, 3], target) for t in row]
             for row, target in zip(rows, targets)]
  parsed = [[r.parsed for r in row] for row in results]
  correct = [[r.correct for r in row] for row in results]
  assert correct == [[True] * 5 + [False]] * 2
  assert parsed[0][:5] == ["(1+2)*3"] * 4 + ["3*(1+2)"] and parsed[1][:4] == ["1+2+3"] * 4
  assert distinct_correct(parsed, correct) == 2.0  # (1+2)*3, 3*(1+2) | 1+2+3, 3+2+1
  assert [len(set(row)) for row in parsed] == [3, 3]  # diversity: the wrong 1+2*3 too
  assert countdown_reward("<answer>((1+2))*(3) = 9</answer>", [1, 2, 3], 9).parsed == "(1+2)*3"


def test_hostile_completions_score_zero_quickly():
  task = make_task("countdown")
  ex = _ex([3, 5, 7], 22)
  hostile = [
      "__import__('os').system('ls')",
      "1" * 10000,
      "(" * 5000,
      "(" * 40 + "3*5+7" + ")" * 40,
      "2**99999",
      "3**5**7",
      "-3+5*7",
      "3*5+7; import os",
      "",
      "3/0+5+7",
      "open('/etc/passwd').read()",
  ]
  start = time.thread_time()  # CPU time: a loaded box's waits for a CPU are not counted
  for text in hostile:
    r = task.verify(ex, text)
    assert (r.reward, r.correct, r.parsed) == (0.0, False, None), text
    assert r.info["reason"].startswith("parse error")
  assert time.thread_time() - start < 3.0  # catches super-linear blow-ups, not speed


def test_validation():
  for n in (2, 5):
    with pytest.raises(ValueError, match="num_numbers"):
      make_task("countdown", num_numbers=n)
  with pytest.raises(ValueError, match="max_number"):
    make_task("countdown", max_number=0)


TESTBED = {"num_numbers": 4, "max_number": 10, "max_target": 100}  # testbeds.py: countdown


@pytest.mark.parametrize("options, train, test, stream", [
    (TESTBED, [("9,7,6,3>7=", "7-(6+3-9)"), ("7,3,7,8>84=", "7+7*(3+8)"),
               ("9,6,4,4>1=", "9-4*(6-4)")],
     [("8,7,8,1>49=", "8*7-(8-1)"), ("5,6,10,6>2=", "10*6/(5*6)"), ("9,3,6,1>45=", "3*(9+6/1)")],
     ("7d30b45159534c58", 318087527)),
    ({}, [("18,13,11>42=", "13+11+18"), ("17,4,2>34=", "4*17/2"), ("1,14,11>26=", "11+14+1")],
     [("8,2,15>9=", "15-8+2"), ("7,17,5>15=", "5-7+17"), ("16,19,11>14=", "11-(16-19)")],
     ("0619fe7cffe1d093", 101077817)),
])
def test_generated_instances_stay_the_same(options, train, test, stream):
  """The countdown testbed's and the defaults' first instances (train seed 0, test seed 1, as
  build_context draws them) and a digest of 2,000 draws with the generator's next number
  (the same randomness used up), as the sampler gave them before it was made faster."""
  task = make_task("countdown", **options)
  assert [(e.prompt, e.answer) for e in task.generate("train", 3, 0)] == train
  assert [(e.prompt, e.answer) for e in task.generate("test", 3, 1)] == test
  rng = np.random.default_rng(0)
  drawn = (task.sample(rng) for _ in range(2000))
  text = "\n".join(f"{ex.prompt}{ex.answer}" if ex else "-" for ex in drawn)
  assert (hashlib.sha256(text.encode()).hexdigest()[:16], int(rng.integers(10**9))) == stream


def test_two_distinct_draws_as_rng_choice():
  """The pair and the generator's state after it are rng.choice(m, 2, replace=False)'s."""
  from dllm_rl.tasks.countdown import two_distinct
  for seed in range(20):
    ours, numpy_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    for m in [2, 3, 4, 5, 9] * 40:
      assert two_distinct(ours, m) == tuple(numpy_rng.choice(m, size=2, replace=False).tolist())
    assert ours.bit_generator.state == numpy_rng.bit_generator.state


@pytest.mark.parametrize("options", [(3, 4, 30), (4, 2, 100)])
def test_counted_instances_are_those_sample_draws(options):
  """instance_keys lists exactly what 6,000 draws find (all of them, at these sizes), and
  count_instances splits them as generate does."""
  from dllm_rl.tasks.countdown import count_instances, instance_keys
  task = make_task("countdown", num_numbers=options[0], max_number=options[1],
                   max_target=options[2], test_fraction=0.5)
  rng = np.random.default_rng(0)
  drawn = {task.canonical(ex) for ex in (task.sample(rng) for _ in range(6000)) if ex}
  keys = list(instance_keys(*options))
  assert len(keys) == len(set(keys)) and set(keys) == drawn
  counts = count_instances(*options, test_fraction=0.5)
  assert counts == {s: sum(split_of(k, 0.5) == s for k in keys) for s in ("train", "test")}
  assert {s: task.split_size(s) for s in counts} == counts


def test_a_split_larger_than_the_options_give_fails_before_drawing():
  """The defaults (3 numbers in [1, 20], target <= 100) have 14,593 training instances: the
  main run's 20,000 + 256 fail before any draw (were 814k draws, ~2 min: the rarest instances
  trickle in), and the hint names the options that give more, with their values."""
  from dllm_rl.tasks.countdown import CountdownTask

  class Counted(CountdownTask):
    draws = 0

    def sample(self, rng):
      Counted.draws += 1
      return super().sample(rng)

  task = Counted()
  with pytest.raises(ValueError, match="task 'countdown': its options give only 14593 distinct"
                     " 'train' instances, fewer than the 20256 requested"):
    task.generate("train", 20256, 0)
  assert Counted.draws == 0 and len(task.generate("test", 256, 1)) == 256
  assert task.enlarge_hint() == (
      "raise task.options.max_number (now 20) or task.options.max_target (now 100) or set"
      " task.options.num_numbers=4 (now 3) for more distinct instances")
  hint = make_task("countdown", num_numbers=4, max_number=2, max_target=16).enlarge_hint()
  assert hint == "raise task.options.max_number (now 2) for more distinct instances"  # 2**4


@pytest.mark.parametrize("options, bound", [((3, 39, 5), 10660 * 5),
                                            ((4, 14, 10**4), 2380 * 2592)])
def test_a_request_above_the_bound_of_uncounted_options_fails_before_drawing(options, bound):
  """Options with too many multisets to count (split_size None) left a request past the split's
  end to the draws, stopped only by stall_draws (seconds to minutes): one above a sound bound
  on both splits' instances (each multiset reaches at most min(max_target, MAX_TARGETS)
  targets) now fails before any draw; the bound holds where the count is known."""
  from dllm_rl.tasks.countdown import MAX_TARGETS, CountdownTask, count_instances

  class Undrawn(CountdownTask):
    def sample(self, rng):
      raise AssertionError("drew")

  task = Undrawn(*options)
  assert task.split_size("train") is None and task.split_size_bound() == bound
  for split in ("train", "test"):
    with pytest.raises(ValueError, match=f"task 'countdown': its options give at most {bound}"
                       f" distinct instances in both splits together, fewer than the"
                       f" {bound + 1} '{split}' instances requested"):
      task.generate(split, bound + 1, 0)
  with pytest.raises(AssertionError, match="drew"):  # within the bound: drawn
    task.generate("train", bound, 0)
  assert MAX_TARGETS == {3: 72, 4: 2592}
  for counted in ((3, 20, 100), (3, 12, 4), (4, 8, 60), (4, 5, 10**6)):  # sound where known
    small = CountdownTask(*counted)
    assert sum(count_instances(*counted, 0.1).values()) <= small.split_size_bound()
