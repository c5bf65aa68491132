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
