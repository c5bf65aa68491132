"""The committed reports (the GPU leases' raw ones in their folders too), the claims page and
the README render as tables on GitHub: no row has more or fewer cells than its table's
delimiter row (a ``|`` inside a cell, such as ``|log ρ̂|``, must be escaped)."""

import glob
import os

import pytest

from tests.helpers import malformed_table_rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)) + [
    os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CHANGELOG.md")]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_table_row_has_its_tables_cell_count(path):
  with open(path, encoding="utf-8") as fh:
    assert malformed_table_rows(fh.read()) == []


def test_the_checker_finds_an_unescaped_pipe():
  table = "| arm | what |\n| --- | --- |\n| a | Σ|A| |\n| b | Σ\\|A\\| |\n"
  assert malformed_table_rows(table) == ["| a | Σ|A| |"]


def _links(text: str) -> list[str]:
  """The relative targets of a markdown text's ``[text](target)`` links, anchors dropped."""
  import re
  return [m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+)\)", text)
          if not re.match(r"[a-z]+://|#", m)]


def test_every_guide_is_linked_from_the_readme_and_every_link_resolves():
  """The README is the front page: each guide in docs/ (the study reports, linked from
  docs/study.md and docs/claims.md, aside) is in its "Documentation" table, and no relative
  link of the README or a guide points at a file that is not there."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
    readme = fh.read()
  guides = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))
                  if not os.path.basename(p).startswith("results"))
  assert len(guides) >= 8
  assert [g for g in guides if g not in _links(readme)] == []
  for doc in ["README.md", *guides]:
    with open(os.path.join(ROOT, doc), encoding="utf-8") as fh:
      base = os.path.dirname(os.path.join(ROOT, doc))
      missing = [t for t in _links(fh.read()) if t and not os.path.exists(os.path.join(base, t))]
    assert missing == [], doc


def test_the_study_guides_testbed_table_lists_every_testbed_with_its_run_lengths():
  """docs/study.md's "Testbeds" table has a row per registered testbed (``--testbed``), and its
  "full study" and ``--quick`` columns (RL steps / eval every / seeds) are the registry's
  (``dllm_rl/config/testbeds.py``): the lengths a reader plans a study by."""
  import re

  from dllm_rl.config import testbeds
  with open(os.path.join(ROOT, "docs", "study.md"), encoding="utf-8") as fh:
    text = fh.read()
  header = next(line for line in text.split("\n") if line.startswith("| testbed | task |"))
  after = text.split(header + "\n", 1)[1].split("\n")[1:]  # the delimiter row dropped
  rows = after[:next(i for i, r in enumerate(after) if not r.startswith("|"))]
  lengths = lambda cell: tuple(int(n) for n in re.findall(r"\d+", cell))
  table = {}
  for row in rows:
    cells = [c.strip() for c in row.strip().strip("|").split(" | ")]
    name = re.match(r"`([^`]+)`", cells[0]).group(1)
    table[name] = (lengths(cells[-2]), lengths(cells[-1]))
  assert table == {n: (testbeds.testbed(n).full, testbeds.testbed(n).quick)
                   for n in testbeds.TESTBEDS.names()}
