"""The package's shape: every top-level unit sits in a layer of the import-linter contract,
the layers hold (lazy imports included), no module is part of an import cycle, and at most 8
modules sit loose at the top of ``dllm_rl/``, and the test files import at most one absl CLI
in-process."""

import ast
import configparser
import os
import re
import subprocess
import sys

import grimp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "dllm_rl")


def _layers() -> list[list[str]]:
  parser = configparser.ConfigParser()
  parser.read(os.path.join(ROOT, ".importlinter"))
  text = parser["importlinter:contract:layers"]["layers"]
  return [[m.strip() for m in line.split("|")] for line in text.strip().splitlines()]


def _top_level_units() -> set[str]:
  units = set()
  for name in os.listdir(PACKAGE):
    path = os.path.join(PACKAGE, name)
    if name.endswith(".py") and name != "__init__.py":
      units.add(f"dllm_rl.{name[:-3]}")
    elif os.path.isfile(os.path.join(path, "__init__.py")):
      units.add(f"dllm_rl.{name}")
  return units


def test_every_top_level_unit_is_in_one_layer():
  listed = [m for layer in _layers() for m in layer]
  assert len(listed) == len(set(listed)), "a unit is listed twice"
  assert set(listed) == _top_level_units()


def test_at_most_eight_loose_top_level_modules():
  loose = [n for n in os.listdir(PACKAGE) if n.endswith(".py") and n != "__init__.py"]
  assert len(loose) <= 8, sorted(loose)


def test_layers_contract_holds():
  proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "lint-imports"),
                         "--no-cache"], cwd=ROOT, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
  assert "1 kept, 0 broken" in proc.stdout


def _strongly_connected(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
  """Tarjan's components of more than one module (or a module importing itself)."""
  index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on_stack.add(v)
    for w in graph.find_modules_directly_imported_by(v) & modules:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1 or v in graph.find_modules_directly_imported_by(v):
        out.append(sorted(comp))

  for v in sorted(modules):
    if v not in index:
      visit(v)
  return out


def test_no_module_import_cycle():
  sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
  graph = grimp.build_graph("dllm_rl", cache_dir=None)
  # A package's __init__ importing its own submodules (registration) is not a cycle of
  # modules; a submodule importing its package's __init__ would be, and is reported.
  modules = set(graph.modules)
  assert _strongly_connected(graph, modules) == []


def test_measured_slow_list_names_collected_tests(request):
  """Every node id of tests/slow_tests.txt is a test that exists (a renamed test would
  otherwise drop out of the list silently). A session that collected every test file (the
  suite's run) is checked by its own collection; a partial one collects the suite anew."""
  from tests.conftest import COLLECTED
  with open(os.path.join(ROOT, "tests", "slow_tests.txt")) as fh:
    listed = {l.strip() for l in fh if l.strip() and not l.startswith("#")}
  collected = request.config.stash.get(COLLECTED, set())
  files = {os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, "/")
           for d, _, names in os.walk(os.path.join(ROOT, "tests"))
           for f in names if f.startswith("test_") and f.endswith(".py")}
  if not files <= {nodeid.split("::")[0] for nodeid in collected}:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p",
                           "no:cacheprovider", "tests"], cwd=ROOT, capture_output=True,
                          text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    collected = {l.strip() for l in proc.stdout.splitlines() if "::" in l}
  assert listed and not listed - collected, sorted(listed - collected)[:10]


def _absl_flag_modules() -> set[str]:
  """dllm_rl modules that define absl flags at import (the CLIs run with absl.app)."""
  found = set()
  for dirpath, _, names in os.walk(PACKAGE):
    for name in names:
      if name.endswith(".py"):
        path = os.path.join(dirpath, name)
        with open(path, encoding="utf-8") as fh:
          if re.search(r"\bflags\.DEFINE_|config_flags\.DEFINE", fh.read()):
            rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
            found.add(rel)
  return found


def _imported_modules(tree: ast.AST) -> set[str]:
  out = set()
  for node in ast.walk(tree):  # function-level imports too: they run in the worker's process
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      out.add(node.module)
      out.update(f"{node.module}.{a.name}" for a in node.names)
  return out


def test_at_most_one_absl_cli_is_imported_in_the_test_processes():
  """absl flags are process-global: two CLI modules that define the same flag (dllm_rl.main's
  and dllm_rl.plan's --config) imported by test files that pytest-xdist's --dist loadfile puts
  in one worker fail every test after the second import (32 test_errors failures once). Test
  files run such CLIs in subprocesses; at most one of them may be imported in-process."""
  clis = _absl_flag_modules()
  assert {"dllm_rl.main", "dllm_rl.plan"} <= clis, sorted(clis)
  users: dict[str, list[str]] = {}
  for dirpath, _, names in os.walk(os.path.join(ROOT, "tests")):
    for name in names:
      if name.endswith(".py"):
        path = os.path.join(dirpath, name)
        with open(path, encoding="utf-8") as fh:
          tree = ast.parse(fh.read())
        for module in _imported_modules(tree) & clis:
          users.setdefault(module, []).append(os.path.relpath(path, ROOT))
  assert len(users) <= 1, users
