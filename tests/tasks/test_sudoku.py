"""4×4 sudoku: generator invariants (validity, uniqueness, splits) and verifier."""

import numpy as np
import pytest

from dllm_rl.tasks import CharTokenizer, make_task
from dllm_rl.tasks.sudoku import count_solutions, is_valid_solution, random_grid


def _cells(s):
  return [int(ch) for ch in s]


def test_random_grids_valid_and_cover_all_288():
  rng = np.random.default_rng(0)
  grids = {tuple(random_grid(rng)) for _ in range(5000)}
  assert all(is_valid_solution(list(g)) for g in grids)
  assert len(grids) == 288 == count_solutions([0] * 16, limit=10**6)


def test_solver_counts():
  solved = _cells("1234341221434321")
  assert is_valid_solution(solved)
  assert count_solutions(solved) == 1
  clash = list(solved)
  clash[1] = 1
  assert count_solutions(clash) == 0
  assert count_solutions([0] * 16, limit=2) == 2


def test_generated_puzzles_unique_consistent_and_verify():
  task = make_task("sudoku")
  train = task.generate("train", 2000, 0)
  test = task.generate("test", 200, 0)
  tok = CharTokenizer()
  for ex in train[:300] + test:
    puzzle, sol = ex.meta["puzzle"], ex.meta["solution"]
    assert ex.prompt == puzzle + "=" and ex.answer == sol and len(sol) == 16
    assert puzzle.count("0") == 6
    assert all(p in ("0", s) for p, s in zip(puzzle, sol))
    assert is_valid_solution(_cells(sol))
    assert count_solutions(_cells(puzzle), limit=2) == 1
    tok.encode(ex.prompt + ex.answer)
  assert not {e.meta["puzzle"] for e in train} & {e.meta["puzzle"] for e in test}
  assert len({e.meta["puzzle"] for e in train}) == 2000
  for ex in train + test:
    r = task.verify(ex, ex.answer)
    assert r.correct and r.reward == 1.0 and r.info["cell_accuracy"] == 1.0
  assert train == task.generate("train", 2000, 0)


@pytest.mark.parametrize("holes", [1, 12])
def test_extreme_hole_counts(holes):
  task = make_task("sudoku", num_holes=holes)
  for ex in task.generate("train", 20, 1):
    assert ex.meta["puzzle"].count("0") == holes
    assert count_solutions(_cells(ex.meta["puzzle"]), limit=2) == 1
    assert task.verify(ex, ex.answer).correct


def test_verify_wrong_and_malformed():
  task = make_task("sudoku", num_holes=6)
  ex = task.generate("train", 1, 3)[0]
  puzzle, sol = ex.meta["puzzle"], ex.meta["solution"]
  blanks = [i for i, ch in enumerate(puzzle) if ch == "0"]
  # One wrong blank cell: invalid sudoku, accuracy 5/6.
  wrong = list(sol)
  wrong[blanks[0]] = str(int(sol[blanks[0]]) % 4 + 1)
  r = task.verify(ex, "".join(wrong))
  assert not r.correct and r.reward == 0 and not r.info["solved"]
  assert r.info["cell_accuracy"] == pytest.approx(5 / 6)
  # A different valid grid that changes a given: wrong.
  relabelled = "".join(str(int(ch) % 4 + 1) for ch in sol)
  r = task.verify(ex, relabelled)
  assert not r.correct and r.info["reason"] == "changes a given cell"
  for bad in ("", sol[:15], sol + "1", sol.replace(sol[0], "5", 1), "0" + sol[1:],
              " ".join(sol), "__import__('os')", "1" * 10000):
    r = task.verify(ex, bad)
    assert (r.reward, r.correct, r.parsed) == (0.0, False, None)
    assert r.info["cell_accuracy"] == 0.0 and r.info["solved"] is False
  assert task.verify(ex, "\n " + sol + " ").correct


def test_validation():
  for holes in (0, 13):
    with pytest.raises(ValueError, match="num_holes"):
      make_task("sudoku", num_holes=holes)
