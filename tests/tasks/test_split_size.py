"""The generated tasks' split counts (``Task.split_size``): each is what ``sample`` reaches, a
request past it fails before any draw naming the options to change, and the shipped configs
ask for no more than their tasks have."""

import itertools

import numpy as np
import pytest

from dllm_rl.tasks import arithmetic, chain, make_task, sudoku
from dllm_rl.tasks.base import split_of


def _reached(task, max_draws: int, stop: int) -> dict[str, str]:
  """The canonical strings ``task.sample`` draws from seed 0 (each with its split), until
  ``stop`` are found or after ``max_draws`` draws."""
  rng = np.random.default_rng(0)
  seen: dict[str, str] = {}
  for _ in range(max_draws):
    ex = task.sample(rng)
    if ex is not None:
      seen.setdefault(task.canonical(ex), split_of(task.split_key(ex), task.test_fraction))
    if len(seen) == stop:
      break
  return seen


@pytest.mark.parametrize("name, options, max_draws", [
    ("arithmetic", {"num_digits": 1, "ops": "+-*"}, 20_000),  # 300, all found in 2,218 draws
    ("arithmetic", {"num_digits": 1, "test_fraction": 0.5}, 20_000),
    ("chain", {"num_numbers": 3, "num_digits": 1}, 30_000),  # 220, found in 3,626 draws
    ("chain", {"num_numbers": 2, "num_digits": 1, "test_fraction": 0.5}, 20_000),
    ("sum_split", {"num_digits": 1}, 20_000),  # 100 pairs, found in 551 draws
    ("sum_split", {"num_digits": 1, "test_fraction": 0.5}, 20_000),
    ("sudoku", {"num_holes": 1}, 150_000),  # 4,608 puzzles, found in 35,448 draws
])
def test_each_split_count_is_what_sample_reaches(name, options, max_draws):
  """At small options, draws until every instance the count holds is found (each rarest one
  is then drawn ~10 times over the draws allowed): the instances reached, split as
  ``generate`` splits them, are as many as ``split_size`` says, and, where the task lists
  its instances, those listed."""
  task = make_task(name, **options)
  sizes = {split: task.split_size(split) for split in ("train", "test")}
  assert None not in sizes.values()
  seen = _reached(task, max_draws, sum(sizes.values()))
  assert {s: list(seen.values()).count(s) for s in sizes} == sizes
  listed = {"arithmetic": lambda: arithmetic.instance_keys(task.num_digits, task.ops),
            "chain": lambda: chain.instance_keys(task.num_numbers, task.num_digits),
            "sudoku": lambda: sudoku.puzzle_keys(task.num_holes),
            "sum_split": lambda: seen}[name]()  # sum split lists none: counts from targets
  listed = list(listed)
  assert len(listed) == len(set(listed)) and set(listed) == set(seen)


@pytest.mark.parametrize("name, options, counted", [
    ("arithmetic", {"num_digits": 2, "ops": "+-*"}, True),  # 30,000
    ("arithmetic", {}, False),  # 10**6
    ("chain", {"num_numbers": 6, "num_digits": 1}, True),  # 5,005
    ("chain", {}, False),  # 4.2e10
    ("sum_split", {}, True),  # 1,999 targets (10**6 pairs)
    ("sum_split", {"num_digits": 6}, False),  # 1,999,999 targets
    ("sudoku", {"num_holes": 12}, True),  # 25,728
    ("sudoku", {}, False),  # 2,204,928
])
def test_which_options_are_counted(name, options, counted):
  """Counted up to ``MAX_COUNTED_KEYS`` split keys; the counts sum to the instances there are."""
  task = make_task(name, **options)
  sizes = [task.split_size(split) for split in ("train", "test")]
  assert (None not in sizes) == counted and (sizes == [None, None]) != counted
  if not counted:
    return
  total = {"arithmetic": 30000, "chain": 5005, "sum_split": 10**6, "sudoku": 25728}[name]
  assert sum(sizes) == total


@pytest.mark.parametrize("name, options, hint", [
    ("arithmetic", {"num_digits": 1}, "raise task.options.num_digits (now 1) or add '-' or '*'"
     " to task.options.ops (now '+') for more distinct instances"),
    ("arithmetic", {"num_digits": 2, "ops": "*-+"}, "raise task.options.num_digits (now 2) for"
     " more distinct instances"),
    ("chain", {"num_numbers": 2, "num_digits": 1}, "raise task.options.num_numbers (now 2) or"
     " task.options.num_digits (now 1) for more distinct instances"),
    ("chain", {"num_numbers": 9, "num_digits": 1}, "raise task.options.num_digits (now 1) for"
     " more distinct instances"),
    ("sum_split", {"num_digits": 1}, "raise task.options.num_digits (now 1) for more distinct"
     " instances"),
    ("sudoku", {"num_holes": 2}, "raise task.options.num_holes (now 2; 8 give the most"
     " puzzles) for more distinct instances"),
    ("sudoku", {"num_holes": 12}, "lower task.options.num_holes (now 12; 8 give the most"
     " puzzles) for more distinct instances"),
])
def test_a_request_past_a_counted_split_fails_before_any_draw(name, options, hint,
                                                              monkeypatch):
  """One more than a split holds: a ValueError with the count and the request, no draw (was
  21,000 draws past the last new instance, or, for the rarest, a claim that the options gave
  no more), and the hint that context.py appends names the options to change, with their
  values; the count itself is drawn as before."""
  task = make_task(name, **options)
  draws = []
  sample = type(task).sample
  monkeypatch.setattr(type(task), "sample", lambda self, rng: draws.append(1) or sample(self,
                                                                                        rng))
  size = task.split_size("test")
  with pytest.raises(ValueError, match=rf"task '{name}': its options give only {size} distinct"
                     rf" 'test' instances, fewer than the {size + 1} requested$"):
    task.generate("test", size + 1, 0)
  assert not draws and task.enlarge_hint() == hint
  if size <= 400:
    assert len(task.generate("test", size, 0)) == size


def _shipped():
  """(label, config) for the embedded default and every study testbed."""
  from dllm_rl.config import defaults, testbeds
  yield "defaults", defaults.get_config()
  for name in testbeds.TESTBEDS.names():
    yield name, testbeds.TESTBEDS.get(name).get_config()


def test_no_shipped_config_asks_for_more_than_its_task_has():
  """The embedded default and each testbed: where the task counts its splits (all but the
  default's 3-digit addition, 10**6 instances), train + validation and test fit them (chain:
  4,064 of 4,509 training multisets, the GPU profile's 4,128; sum split: 6,256 of 9,092
  training pairs; Countdown: 20,064 of 31,256)."""
  counted = []
  for label, c in _shipped():
    task = make_task(c.task.name, **c.task.options.to_dict())
    train, test = task.split_size("train"), task.split_size("test")
    if train is None:
      continue
    counted.append(label)
    assert c.task.train_size + c.task.val_size <= train, (label, train)
    assert c.task.test_size <= test, (label, test)
  assert {"countdown", "chain", "chain_orders", "sum_split", "gpu"} <= set(counted)


def test_sudoku_counts_by_symmetry_are_those_of_every_grid():
  """``count_puzzles`` (two base grids weighted by their classes) equals the unique puzzles of
  all 288 grids for every hole count, peaks at ``MOST_PUZZLES_HOLES``, and the uniqueness
  it reads agrees with ``count_solutions`` on 3,000 random (grid, holes) pairs."""
  grids = np.array(sudoku.all_grids(), dtype=np.int8)
  assert len(grids) == 288 and len({tuple(g) for g in grids}) == 288
  assert all(sudoku.is_valid_solution(list(g)) for g in grids)
  ambiguous = sudoku._ambiguous(grids)
  holes = np.array([bin(m).count("1") for m in range(1 << 16)])
  counts = [int((~ambiguous[:, holes == h]).sum()) for h in range(1, 13)]
  assert counts == [sudoku.count_puzzles(h) for h in range(1, 13)]
  assert counts[:3] == [4608, 34560, 161280] and counts[-1] == 25728
  assert int(np.argmax(counts)) + 1 == sudoku.MOST_PUZZLES_HOLES
  rng = np.random.default_rng(0)
  for _ in range(3000):
    i, mask = int(rng.integers(288)), int(rng.integers(1, 1 << 16))
    puzzle = [0 if mask >> c & 1 else int(v) for c, v in enumerate(grids[i])]
    assert (sudoku.count_solutions(puzzle) == 1) != ambiguous[i, mask], (i, mask)


def test_sudoku_lists_only_puzzles_it_draws_at_twelve_holes():
  """At 12 holes (too many puzzles to draw them all here) every puzzle drawn is listed, and
  the listed ones are uniquely solvable (a sample of them)."""
  task = make_task("sudoku", num_holes=12)
  listed = set(sudoku.puzzle_keys(12))
  assert len(listed) == 25728
  rng = np.random.default_rng(0)
  drawn = [ex for ex in (task.sample(rng) for _ in range(200)) if ex is not None]
  assert len(drawn) > 100 and all(task.canonical(ex) in listed for ex in drawn)
  for key in itertools.islice(sorted(listed), 0, None, 97):
    assert sudoku.count_solutions([int(ch) for ch in key]) == 1
