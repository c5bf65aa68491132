"""4×4 sudoku (2×2 boxes) with a unique solution.

Prompt: the 16 cells row-major, '0' for a blank, then '=':
``"1423204000020214="``. Answer: the 16-digit solution, ``"1423234141323214"``.
Reward 1 iff the completion (whitespace stripped) is 16 digits 1–4 forming a valid
sudoku that keeps every given; ``info["cell_accuracy"]`` is the fraction of blank
cells equal to the stored solution (a dense diagnostic, not the reward).

Generation cost grows with ``num_holes`` (unique puzzles get rare): about
0.1 ms per puzzle at 6 holes, about 3 ms at 12.

Instances are the uniquely solvable puzzles (``count_puzzles``: 4,608 with 1 hole, most with
8, 2,961,024; 25,728 with 12), each one draw in at least 288 times its grid's number of unique
hole patterns. Each split's are counted (``split_size``) where there are at most
``MAX_COUNTED_KEYS`` (1-3 and 11-12 holes); with 4-10 holes (522,624 puzzles or more, 0.5-3 s to
hash at every run's start) they are not, and a request past a split's end is stopped by
``Task.stall_draws``.
"""

from __future__ import annotations

import functools
import itertools
import re
from typing import Iterator

import numpy as np

from dllm_rl.tasks.base import (MAX_COUNTED_KEYS, TASKS, Example, Task, VerifyResult, count_splits,
                                malformed)

SIZE = 4
BOX = 2
NUM_CELLS = SIZE * SIZE
# Representatives of the validity-preserving symmetry classes of the 288 full
# grids (orbit sizes 96 and 192 under the transformations in ``random_grid``);
# each is picked with probability proportional to its orbit so every full grid
# is equally likely.
_BASE_GRIDS = (((1, 2, 3, 4), (3, 4, 1, 2), (2, 1, 4, 3), (4, 3, 2, 1)),
               ((1, 2, 3, 4), (3, 4, 1, 2), (2, 3, 4, 1), (4, 1, 2, 3)))
_BASE_WEIGHTS = (96 / 288, 192 / 288)
_CLASS_SIZES = (96, 192)  # the two classes' sizes: _BASE_WEIGHTS * 288
MOST_PUZZLES_HOLES = 8  # the num_holes with the most unique puzzles (``count_puzzles``)
_PATTERN_TRIES = 64
_POPCOUNT = [bin(m).count("1") for m in range(1 << (SIZE + 1))]
_HOLE_COUNTS = np.array([bin(m).count("1") for m in range(1 << NUM_CELLS)])  # per hole mask
_SOLUTION_RE = re.compile(r"[1-4]{16}")
# Units (rows, columns, boxes) as lists of cell indices.
_UNITS = ([[r * SIZE + c for c in range(SIZE)] for r in range(SIZE)] +
          [[r * SIZE + c for r in range(SIZE)] for c in range(SIZE)] +
          [[(br + r) * SIZE + bc + c for r in range(BOX) for c in range(BOX)]
           for br in range(0, SIZE, BOX) for bc in range(0, SIZE, BOX)])


def _line_perm(rng: np.random.Generator) -> list[int]:
  """A permutation of 0..3 that keeps sudoku validity: swap bands, swap within each."""
  bands = [0, 1] if rng.integers(2) == 0 else [1, 0]
  out = []
  for band in bands:
    inner = [0, 1] if rng.integers(2) == 0 else [1, 0]
    out += [band * BOX + i for i in inner]
  return out


def random_grid(rng: np.random.Generator) -> list[int]:
  """A uniformly random valid full grid, row-major, digits 1..4.

  Base grid, then digit relabelling, row swaps within bands and band swaps,
  the same for columns and stacks, and an optional transpose.
  """
  base = _BASE_GRIDS[int(rng.choice(len(_BASE_GRIDS), p=_BASE_WEIGHTS))]
  relabel = [0] + [int(d) + 1 for d in rng.permutation(SIZE)]
  rows, cols = _line_perm(rng), _line_perm(rng)
  transpose = bool(rng.integers(2))
  grid = []
  for r in range(SIZE):
    for c in range(SIZE):
      rr, cc = rows[r], cols[c]
      if transpose:
        rr, cc = cc, rr
      grid.append(relabel[base[rr][cc]])
  return grid


def is_valid_solution(cells: list[int]) -> bool:
  """True iff every row, column and box holds 1..4 exactly once."""
  return all(sorted(cells[i] for i in unit) == [1, 2, 3, 4] for unit in _UNITS)


def count_solutions(cells: list[int], limit: int = 2) -> int:
  """Number of completions of ``cells`` (0 = blank), counting up to ``limit``.

  Bitmask backtracking (bit d set = digit d used in a row/column/box) that
  branches on the blank with the fewest candidates.
  """
  rows, cols, boxes = [0] * SIZE, [0] * SIZE, [0] * SIZE
  blanks = []
  for i, v in enumerate(cells):
    r, c = divmod(i, SIZE)
    b = (r // BOX) * BOX + c // BOX
    if v == 0:
      blanks.append((r, c, b))
      continue
    bit = 1 << v
    if (rows[r] | cols[c] | boxes[b]) & bit:
      return 0  # Givens already clash.
    rows[r] |= bit
    cols[c] |= bit
    boxes[b] |= bit
  full = sum(1 << d for d in range(1, SIZE + 1))

  def search(todo: list[tuple[int, int, int]]) -> int:
    if not todo:
      return 1
    k, free, best = 0, 0, SIZE + 1
    for j, (r, c, b) in enumerate(todo):
      f = full & ~(rows[r] | cols[c] | boxes[b])
      if _POPCOUNT[f] < best:
        k, free, best = j, f, _POPCOUNT[f]
        if best <= 1:
          break
    if best == 0:
      return 0
    r, c, b = todo[k]
    rest = todo[:k] + todo[k + 1:]
    found = 0
    for d in range(1, SIZE + 1):
      bit = 1 << d
      if not free & bit:
        continue
      rows[r] |= bit
      cols[c] |= bit
      boxes[b] |= bit
      found += search(rest)
      rows[r] &= ~bit
      cols[c] &= ~bit
      boxes[b] &= ~bit
      if found >= limit:
        break
    return found

  return search(blanks)


@functools.lru_cache(maxsize=1)
def all_grids() -> tuple[tuple[int, ...], ...]:
  """The 288 valid full grids, row-major, digits 1..4 (row by row, each row a permutation
  that clashes with no row above it in a column or box)."""
  grids: list[tuple[int, ...]] = [()]
  for _ in range(SIZE):
    grids = [g + row for g in grids for row in itertools.permutations(range(1, SIZE + 1))
             if _no_clash(g + row)]
  return tuple(grids)


def _no_clash(cells: tuple[int, ...]) -> bool:
  """Whether the first rows ``cells`` hold no digit twice in a column or box."""
  for unit in _UNITS:
    filled = [cells[i] for i in unit if i < len(cells)]
    if len(set(filled)) < len(filled):
      return False
  return True


def _ambiguous(grids: np.ndarray) -> np.ndarray:
  """bool [len(grids), 2**16]: [i, m] iff another valid grid equals ``grids[i]`` outside the
  blanks of hole mask m (bit c: cell c blank), i.e. that puzzle has a second solution. Each
  other grid marks the mask of the cells where they differ, then every superset of a marked
  mask is marked (more blanks keep the second solution)."""
  every = np.array(all_grids(), dtype=np.int8)
  bits = np.int64(1) << np.arange(NUM_CELLS, dtype=np.int64)
  differ = ((grids[:, None, :] != every[None, :, :]) * bits).sum(-1)  # [len(grids), 288]
  out = np.zeros((len(grids), 1 << NUM_CELLS), dtype=bool)
  out[np.repeat(np.arange(len(grids)), len(every)), differ.ravel()] = True
  out[:, 0] = False  # marked by the grid itself only (grids differ somewhere)
  for b in range(NUM_CELLS):
    view = out.reshape(len(grids), -1, 2, 1 << b)  # [..., 1, :]: the masks with bit b
    view[:, :, 1] |= view[:, :, 0]
  return out


@functools.lru_cache(maxsize=None)
def count_puzzles(num_holes: int) -> int:
  """How many uniquely solvable puzzles have ``num_holes`` blanks: the two base grids' unique
  hole patterns, weighted by their classes' sizes (96, 192). Every grid of a class has as many:
  a symmetry of ``random_grid`` maps a grid's puzzle with blanks H to its image's puzzle with
  the blanks moved alike, and a second solution to a second solution."""
  base = np.array(_BASE_GRIDS, dtype=np.int8).reshape(len(_BASE_GRIDS), NUM_CELLS)
  unique = ~_ambiguous(base)[:, _HOLE_COUNTS == num_holes]
  return int(sum(size * int(row.sum()) for size, row in zip(_CLASS_SIZES, unique)))


def puzzle_keys(num_holes: int) -> Iterator[str]:
  """Every puzzle ``sample`` can draw with ``num_holes`` blanks, each once (row-major, '0' for
  a blank): each valid grid with each hole pattern that leaves it the only solution (a
  puzzle's one solution names its grid, so no two are equal)."""
  grids = np.array(all_grids(), dtype=np.int8)
  masks = np.flatnonzero(_HOLE_COUNTS == num_holes)
  holes = ((masks[:, None] >> np.arange(NUM_CELLS)) & 1).astype(bool)  # [patterns, 16]
  unique = ~_ambiguous(grids)[:, masks]  # [288, patterns]
  for grid, keep in zip(grids, unique):
    text = np.where(holes[keep], ord("0"), grid + ord("0")).astype(np.uint8).tobytes()
    for start in range(0, len(text), NUM_CELLS):
      yield text[start:start + NUM_CELLS].decode("ascii")


@TASKS.register("sudoku")
class SudokuTask(Task):
  """Uniquely solvable 4×4 sudoku with ``num_holes`` blanks (1..12)."""

  name = "sudoku"
  size_options = ("num_holes",)

  def __init__(self, num_holes: int = 6, test_fraction: float = 0.1):
    super().__init__(test_fraction)
    if not 1 <= num_holes <= 12:
      raise ValueError(f"num_holes must be in [1, 12], got {num_holes}")
    self.num_holes = int(num_holes)

  def sample(self, rng: np.random.Generator) -> Example | None:
    """A random full grid, then up to ``_PATTERN_TRIES`` uniformly random hole
    patterns until one leaves a unique solution (None if none does)."""
    solution = random_grid(rng)
    for _ in range(_PATTERN_TRIES):
      holes = rng.choice(NUM_CELLS, size=self.num_holes, replace=False)
      puzzle = list(solution)
      for i in holes:
        puzzle[int(i)] = 0
      # Givens using fewer than 3 digits can never be unique (swap 2 unused digits).
      if len(set(puzzle) - {0}) >= SIZE - 1 and count_solutions(puzzle, limit=2) == 1:
        break
    else:
      return None
    puzzle_s = "".join(map(str, puzzle))
    solution_s = "".join(map(str, solution))
    return Example(prompt=puzzle_s + "=", answer=solution_s,
                   meta={"puzzle": puzzle_s, "solution": solution_s})

  def canonical(self, example: Example) -> str:
    return example.meta["puzzle"]

  def count_split_sizes(self) -> dict[str, int] | None:
    """Each split's number of instances, counted (``puzzle_keys``) where ``count_puzzles`` is at
    most ``MAX_COUNTED_KEYS`` (1-3 and 11-12 holes); None beyond (module docstring)."""
    if count_puzzles(self.num_holes) > MAX_COUNTED_KEYS:
      return None
    return count_splits(puzzle_keys(self.num_holes), self.test_fraction)

  def enlarge_hint(self) -> str:
    """Unique puzzles grow in number up to ``MOST_PUZZLES_HOLES`` holes, then shrink: the way
    to move num_holes, with its value."""
    if self.num_holes == MOST_PUZZLES_HOLES:
      return super().enlarge_hint()
    way = "raise" if self.num_holes < MOST_PUZZLES_HOLES else "lower"
    return (f"{way} task.options.num_holes (now {self.num_holes}; {MOST_PUZZLES_HOLES} give the"
            " most puzzles) for more distinct instances")

  def verify(self, example: Example, completion: str) -> VerifyResult:
    text = completion.strip()
    if not _SOLUTION_RE.fullmatch(text):
      return malformed("completion is not exactly 16 digits 1-4",
                       cell_accuracy=0.0, solved=False)
    solved, info = grade_grid(text, example.meta["puzzle"], example.meta["solution"])
    return VerifyResult(reward=float(solved), correct=solved, parsed=text, info=info)


def grade_grid(text: str, puzzle: str, solution: str) -> tuple[bool, dict]:
  """Grade a well-formed 16-digit grid: solved (valid and keeps the givens) and
  ``info`` with ``cell_accuracy`` over the blank cells, ``solved`` and a reason."""
  blanks = [i for i, ch in enumerate(puzzle) if ch == "0"]
  cell_accuracy = sum(text[i] == solution[i] for i in blanks) / max(len(blanks), 1)
  keeps_givens = all(p == "0" or p == t for p, t in zip(puzzle, text))
  valid = is_valid_solution([int(ch) for ch in text])
  solved = keeps_givens and valid
  info = {"cell_accuracy": cell_accuracy, "solved": solved}
  if not keeps_givens:
    info["reason"] = "changes a given cell"
  elif not valid:
    info["reason"] = "not a valid sudoku"
  return solved, info
