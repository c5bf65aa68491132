"""README.md's commands, as users copy them: ``python -m dllm_rl...``, the ``dllm-rl*`` console
scripts and ``launch/*.sh``, in fenced blocks (backslash continuations joined) and inline code.
Every module, flag, ``--config.KEY=VALUE`` (the study's ``--set=KEY=VALUE`` too), registry name,
task option, config file and repository path they name must exist, and every value must parse
as its flag's or key's type, so that a renamed flag or key fails here instead of in a shell.

Nothing is run. The argparse CLIs' parsers are built by their own ``main`` and stopped at
``parse_args``; the absl ones' flags (``dllm_rl.main``, ``plan``, ``study``) are read from their
``flags.DEFINE_*`` calls, since importing those modules into one process defines their shared
flags twice. Placeholders (``DIR``, ``N``, ``<flags>``, ``...``, ``[optional]`` brackets) are
skipped; a key given with a placeholder value must still exist.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import importlib.util
import os
import re
import shlex
import tomllib
from typing import NamedTuple

import pytest

from dllm_rl.config.defaults import get_config as default_config
from dllm_rl.config.overrides import apply_overrides, value_at
from dllm_rl.config.schema import load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
ABSL_OWN = {"help", "helpfull", "helpshort", "h", "?"}  # cli.HELP
_MARK = re.compile(r"(?:\bpython3?|/python3?) -m dllm_rl\b|(?<![\w/.-])dllm-rl(?:-\w+)?\s"
                   r"|launch/\w+\.sh")
# DIR, N, R.md, <flags>, ...; "name" in "Adding a component" (--config.rl.loss=name)
_PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*(?:\.[a-z]+)?|<[^>]*>|\.\.\.|\*|name")
_CHAIN = ("&&", "||", "|", ";")
# A config file or folder the command reads; outputs named beside them are checked too.
_REPO_PATH = re.compile(r"^(?:configs|tests|launch|docs|dllm_rl)/[\w./-]+$")
REGISTRY_KEYS = {"rl.loss": ("dllm_rl.rl.losses", "LOSSES"),
                 "rl.advantage": ("dllm_rl.rl.advantages", "ADVANTAGES"),
                 "estimator.name": ("dllm_rl.diffusion.estimators", "ESTIMATORS"),
                 "sampler.remasking": ("dllm_rl.sampling.remasking", "REMASKING"),
                 "task.name": ("dllm_rl.tasks.base", "TASKS")}
# The README's own example of bad overrides (section "Config errors"): these problems, no other.
DELIBERATE = {"--config.rl.nosuch=1": ["config.rl.nosuch: unknown key",
                                       "config.rl.lr: expected float, got 'abc'"]}


class Command(NamedTuple):
  line: int       # README line the command starts on
  module: str     # "dllm_rl.main", or "launch/gpu_check.sh"
  args: list      # the words after the module / script, placeholders left in
  env: dict       # VAR=value words before it


def _is_placeholder(word: str) -> bool:
  return bool(_PLACEHOLDER.fullmatch(word))


def code_texts(text: str) -> list[tuple[int, str]]:
  """(line, text) of each fenced-block line (a trailing ``\\`` joins the next) and of each
  inline code span (a span may wrap across the lines of a paragraph, a bullet or a row)."""
  out, fenced, para, start = [], False, [], 0
  lines = text.split("\n")

  def spans():
    joined = "\n".join(para)
    for m in re.finditer(r"(`+)(.+?)\1", joined, re.S):
      out.append((start + joined[:m.start()].count("\n"), " ".join(m.group(2).split())))

  pending = None
  for i, line in enumerate(lines, 1):
    if line.lstrip().startswith("```"):
      spans()
      para, fenced = [], not fenced
      continue
    if fenced:
      body = line.strip()
      pending = (pending[0], pending[1] + " " + body) if pending else (i, body)
      if body.endswith("\\"):
        pending = (pending[0], pending[1][:-1].rstrip())
      else:
        out.append(pending)
        pending = None
      continue
    if not line.strip() or re.match(r"\s*(?:[*-] |\d+\. |\||#)", line):
      spans()
      para = []
    if line.strip():
      start = start if para else i
      para.append(line)
  spans()
  return out


@functools.cache
def _scripts() -> dict[str, str]:
  """console script → the module ``python -m`` runs (pyproject.toml)."""
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    scripts = tomllib.load(f)["project"]["scripts"]
  return {name: re.sub(r"\.(__main__|cli)$", "", target.split(":")[0])
          for name, target in scripts.items()}


def _words(text: str) -> list[str]:
  try:
    return shlex.split(text, comments=True)
  except ValueError:  # prose around the command with an odd quote
    return text.split()


def parse_command(line: int, text: str) -> Command | None:
  """The command in ``text`` (None: none, or output such as ``error: ...``); a word list
  ending at ``&&`` / ``|`` / ``;``, brackets of optional parts dropped."""
  if not _MARK.search(text) or re.match(r"(error|warning|note|usage):", text):
    return None
  words = _words(text.removeprefix("$ "))
  for i, w in enumerate(words):
    module, rest = None, words[i + 1:]
    if re.fullmatch(r"(python3?|\S*/python3?)", w) and rest[:1] == ["-m"]:
      module, rest = (rest[1:2] or [""])[0], rest[2:]
    elif w in _scripts() or re.fullmatch(r"launch/\w+\.sh", w):
      module = _scripts().get(w, w)
    if module and re.fullmatch(r"dllm_rl(\.\w+)*|launch/\w+\.sh", module):
      break  # (python3 -m venv ... && python -m dllm_rl.main ...: the second; not dllm_rl...)
  else:
    return None
  before = words[:i]
  env = dict(v.split("=", 1) for v in before if re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", v))
  if len(env) + before.count("bash") < len(before) and before[-1] not in _CHAIN:
    return None  # prose or a layout line that names a module, not a command
  args = []
  for w in rest:
    if w in _CHAIN or w.startswith((">", "2>")):
      break
    w = w.strip("[]")
    if w and w != "...":
      args.append(w)
  return Command(line, module, args, env)


def readme_commands(text: str) -> list[Command]:
  """Every command of the README text, and a run of ``--config...`` words alone (the
  Baselines table's flags of ``python -m dllm_rl.main --workdir=DIR <flags>``)."""
  found = []
  for line, code in code_texts(text):
    cmd = parse_command(line, code)
    words = code.split()
    if cmd is None and words and all(re.match(r"--config[.=]\S*=", w) for w in words):
      cmd = Command(line, "dllm_rl.main", words, {})
    if cmd is not None:
      found.append(cmd)
  return found


# -- the CLIs' flags -------------------------------------------------------------------------

def _source(module: str) -> tuple[str, str]:
  """(name, text) of the module that holds the code ``python -m module`` runs: the module, or
  for a package the one its ``__main__`` imports ``run`` from (else the ``__main__`` itself)."""
  spec = importlib.util.find_spec(module)
  assert spec is not None and spec.origin, f"no module {module}"
  if spec.submodule_search_locations:
    module += ".__main__"
    spec = importlib.util.find_spec(module)
  with open(spec.origin) as f:
    text = f.read()
  delegate = re.search(r"^from (dllm_rl\S*) import run$", text, re.M)
  return _source(delegate.group(1)) if delegate else (module, text)


@functools.cache
def absl_flags(module: str) -> dict[str, tuple[str, tuple]]:
  """``{name: (kind, enum values)}`` of the module's ``flags.DEFINE_<kind>("name", ...)``."""
  found = {}
  for node in ast.walk(ast.parse(_source(module)[1])):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr.startswith("DEFINE_") and node.args
        and isinstance(node.args[0], ast.Constant)):
      kind = node.func.attr.removeprefix("DEFINE_")
      enum = ()
      if kind == "enum" and len(node.args) > 2 and isinstance(node.args[2], (ast.List, ast.Tuple)):
        enum = tuple(e.value for e in node.args[2].elts if isinstance(e, ast.Constant))
      found[node.args[0].value] = (kind, enum)
  assert found, f"{module}: no flags.DEFINE_* call found"
  return found


def absl_problems(module: str, args: list[str]) -> tuple[list[str], dict, list]:
  """(problems, {flag: value}, positional args) of absl flags (``--config.*`` / ``--set=``
  excluded by the caller)."""
  defined, problems, values, positional = absl_flags(module), [], {}, []
  parsers = {"integer": int, "float": float}
  skip = False
  for i, arg in enumerate(args):
    if skip or not arg.startswith("-"):
      if not skip and not _is_placeholder(arg):
        positional.append(arg)
      skip = False
      continue
    name, eq, value = arg.lstrip("-").partition("=")
    if name in ABSL_OWN:
      continue
    kind = defined.get(name, ("",))[0]
    if kind == "" and name.startswith("no") and defined.get(name[2:], ("",))[0] == "bool":
      name, kind, eq, value = name[2:], "bool", "=", "false"
    if not kind:
      problems.append(f"--{name}: no such flag of {module} ({', '.join(sorted(defined))})")
      continue
    if not eq and kind != "bool":
      if i + 1 < len(args) and not args[i + 1].startswith("-"):
        value, skip = args[i + 1], True
      else:
        problems.append(f"--{name}: needs a value")
        continue
    values[name] = value if eq or kind != "bool" else "true"
    if _is_placeholder(value) or not value:
      continue
    try:
      if kind in parsers:
        parsers[kind](value)
      elif kind == "bool" and value.lower() not in ("true", "false", "1", "0"):
        raise ValueError
      elif kind == "enum" and value not in defined[name][1]:
        raise ValueError
    except ValueError:
      problems.append(f"--{name}={value}: not a valid {kind}")
  return problems, values, positional


class _Parsed(Exception):
  pass


@functools.cache
def argparse_parser(module: str) -> argparse.ArgumentParser:
  """The parser ``main`` of ``module`` builds, caught at its ``parse_args`` (nothing runs)."""
  name, text = _source(module)
  assert "ArgumentParser" in text, f"{module}: no argparse parser"
  mod = importlib.import_module(name)
  if hasattr(mod, "_parser"):
    return mod._parser()
  real = argparse.ArgumentParser.parse_args
  caught = []

  def catch(self, args=None, namespace=None):
    caught.append(self)
    raise _Parsed

  argparse.ArgumentParser.parse_args = catch
  try:
    mod.main([])
  except _Parsed:
    pass
  finally:
    argparse.ArgumentParser.parse_args = real
  assert caught, f"{module}.main([]) parsed no arguments"
  return caught[0]


class _Choices(list):
  """A flag's choices, and any placeholder."""

  def __contains__(self, item):
    return _is_placeholder(str(item)) or list.__contains__(self, item)


def _lenient(parser: argparse.ArgumentParser) -> None:
  """Placeholders pass every flag's type and choices, an argument may be left out (a mention
  such as ``dllm-rl-data prepare`` names a subcommand, not a whole command line), and a flag
  must be spelt in full, not abbreviated (nested subparsers included)."""
  parser.allow_abbrev = False
  for group in parser._mutually_exclusive_groups:
    group.required = False
  for action in parser._actions:
    action.required = False
    if isinstance(action, argparse._SubParsersAction):
      for sub in action.choices.values():
        _lenient(sub)
      continue
    if not action.option_strings and action.nargs is None:
      action.nargs = "?"
    if action.type is not None and not getattr(action.type, "lenient", False):
      orig = action.type
      action.type = lambda v, orig=orig: v if _is_placeholder(v) else orig(v)
      action.type.lenient = True
    if action.choices is not None and not isinstance(action.choices, _Choices):
      action.choices = _Choices(action.choices)


def argparse_problems(module: str, args: list[str]) -> list[str]:
  """argparse's complaints about ``args`` (unknown or abbreviated flags, bad values)."""
  parser = argparse_parser(module)
  _lenient(parser)
  problems = []

  def error(message):
    problems.append(message)
    raise _Parsed

  parser.error = error
  for action in parser._actions:
    if isinstance(action, argparse._SubParsersAction):
      for sub in action.choices.values():
        sub.error = error
  try:
    parser.parse_args(args)
  except _Parsed:
    pass
  return problems


def custom_problems(module: str, args: list[str]) -> list[str]:
  """A CLI that reads ``argv`` by hand: each ``--flag`` must appear in its source."""
  text = _source(module)[1]
  return [f"{a}: not read by {module}" for a in args if a.startswith("-")
          and f'"{a.split("=")[0]}' not in text]


def launch_problems(script: str, args: list[str], env: dict) -> tuple[list[str], list[str]]:
  """(problems, the words after ``--``) of a launch script: its ``--flag)`` cases and the
  variables the launch scripts read."""
  path = os.path.join(ROOT, script)
  if not os.path.isfile(path):
    return [f"{script}: no such script"], []
  with open(path) as f:
    text = f.read()
  shared = ""
  for name in os.listdir(os.path.join(ROOT, "launch")):
    if name.endswith(".sh"):
      with open(os.path.join(ROOT, "launch", name)) as f:
        shared += f.read()
  problems = [f"{name}=: read by no launch script" for name in env
              if not re.search(rf"\b{name}\b", shared)]
  cases = set(re.findall(r"^\s*(--[\w-]+)\)", text, re.M))
  rest = args[args.index("--") + 1:] if "--" in args else []
  for i, arg in enumerate(args[:len(args) - len(rest)]):
    if arg.startswith("-") and arg not in cases | {"--", "-h", "--help"}:
      problems.append(f"{arg}: no such option of {script} ({', '.join(sorted(cases))})")
  return problems, rest


# -- configs ---------------------------------------------------------------------------------

@functools.cache
def _config_file(path: str):
  return load_config_file(os.path.join(ROOT, path))


def base_config(module: str, flags: dict):
  """The config the command's overrides apply to (a fresh copy), or a problem string."""
  if module == "dllm_rl.study":
    from dllm_rl.config import testbeds
    try:
      return testbeds.testbed(testbeds.resolve(flags.get("testbed"), flags.get("scale")))
    except ValueError as err:
      return str(err)
  path = flags.get("config")
  if path is None or _is_placeholder(os.path.basename(path).split(".")[0]):
    return default_config()
  try:
    return _config_file(path).copy_and_resolve_references()
  except Exception as err:  # noqa: BLE001 - a broken or missing file: the problem
    return f"--config={path}: {type(err).__name__}: {err}"


def override_problems(config, overrides: list[tuple[str, str]]) -> list[str]:
  """Unknown keys, unparsable values, unknown registry names and task options."""
  if hasattr(config, "get_config"):  # a testbed
    config = config.get_config()
  resolved = []
  for key, text in overrides:
    if _is_placeholder(text):
      try:
        value = value_at(config, key)
        text = str(value).lower() if isinstance(value, bool) else str(value)
      except (KeyError, AttributeError, TypeError):
        pass
    resolved.append((key, text))
  problems = [str(e) for e in apply_overrides(config, resolved)]
  given = dict(resolved)
  for key, (module, name) in REGISTRY_KEYS.items():
    if key in given and not _is_placeholder(given[key]):
      registry = getattr(importlib.import_module(module), name)
      if given[key] not in registry:
        problems.append(f"{key}: {registry.unknown_message(given[key])}")
  if any(k.startswith("task.") for k in given):
    import dllm_rl.tasks  # noqa: F401  (registers the tasks)
    from dllm_rl.tasks.base import check_options
    try:
      check_options(config.task.name, config.task.options)
    except ValueError as err:
      problems.append(f"task.options: {err}")
  return problems


def plan_problems(flags: dict) -> list[str]:
  """``--topology`` parses; ``--programs`` are programs the planner builds."""
  from dllm_rl.parallel import topology
  found, name = [], flags.get("topology", "")
  if name and not _is_placeholder(name):
    try:
      (topology.cpu_device_count(name) is not None or topology.gpu_topology_name(name)
       or topology.tpu_topology_name(name))
    except ValueError as err:
      found.append(f"--topology: {err}")
  with open(os.path.join(ROOT, "dllm_rl", "planning", "programs.py")) as f:
    known = set(re.findall(r'Program\("(\w+)"', f.read()))
  return found + [f"--programs: no program {p!r} ({', '.join(sorted(known))})"
                  for p in flags.get("programs", "").split(",") if p and p not in known]


def study_arm_problems(names: list[str], flags: dict) -> list[str]:
  """``--arms`` patterns each match an arm of the named studies on the testbed."""
  from dllm_rl.config import testbeds
  from dllm_rl.study import arms
  if not flags.get("arms") or any(n not in arms.STUDIES for n in names if n != "all"):
    return []
  try:
    bed = testbeds.testbed(testbeds.resolve(flags.get("testbed"), flags.get("scale")))
  except ValueError:
    return []  # base_config names it
  studies = arms.STUDIES.names() if "all" in names else names
  problem = arms.unmatched(studies, flags["arms"].split(","), bed.get_config())
  return [f"--arms: {problem}"] if problem else []


def branch_problems(args: list[str]) -> list[str]:
  """``study.branch --variant=NAME:KEY=VALUE,...``: keys of the study's config."""
  overrides = []
  for arg in args:
    if arg.startswith("--variant="):
      for pair in arg.split(":", 1)[-1].split(","):
        key, _, value = pair.partition("=")
        overrides.append((key, value))
  return override_problems(default_config(), overrides) if overrides else []


# -- one command -----------------------------------------------------------------------------

def problems(cmd: Command) -> list[str]:
  """Every problem of one README command (empty: it parses)."""
  if cmd.module.startswith("launch/"):
    found, rest = launch_problems(cmd.module, cmd.args, cmd.env)
    if not rest:
      return found
    script = os.path.join(ROOT, cmd.module)
    with open(script) as f:
      default = re.search(r"^CONFIG=\$\{\w+:-(configs/\S+\.py)\}", f.read(), re.M)
    head = cmd.args[:len(cmd.args) - len(rest)]
    given = head[head.index("--config") + 1] if "--config" in head[:-1] else None
    config = given or (default.group(1) if default else None)
    args = ([f"--config={config}"] if config else []) + rest
    return found + problems(Command(cmd.line, "dllm_rl.main", args, {}))
  if importlib.util.find_spec(cmd.module) is None:
    return [f"{cmd.module}: no such module"]
  aliases = ("--set=",) if cmd.module == "dllm_rl.study" else ()
  overrides, rest = [], []
  for arg in cmd.args:
    prefix = next((p for p in ("--config.", *aliases) if arg.startswith(p)), None)
    if prefix is None:
      rest.append(arg)
      continue
    key, _, value = arg[len(prefix):].partition("=")
    if not any(re.fullmatch(r"[A-Z_]+|<[^>]*>|\*|.", k) for k in key.split(".")):  # KEY, a.b
      overrides.append((key, value))
  found, flags, source = [], {}, _source(cmd.module)[1]
  if "flags.DEFINE_" in source:  # never imported here (the docstring says why)
    found, flags, positional = absl_problems(cmd.module, rest)
    if cmd.module == "dllm_rl.study":
      from dllm_rl.study.arms import STUDIES
      names = [n for p in positional for n in p.split(",")]
      found += [f"study {n!r}: {STUDIES.unknown_message(n)}" for n in names
                if n != "all" and n not in STUDIES and not _is_placeholder(n)]
      found += study_arm_problems(names, flags)
    elif positional:
      found.append(f"{cmd.module} takes no positional arguments: {positional}")
    if cmd.module == "dllm_rl.plan":
      found += plan_problems(flags)
  elif "ArgumentParser" in source:
    found = argparse_problems(cmd.module, rest)
    if cmd.module == "dllm_rl.study.branch":
      found += branch_problems(rest)
  else:
    found = custom_problems(cmd.module, rest)
  if overrides or "config" in flags or cmd.module == "dllm_rl.study":
    config = base_config(cmd.module, flags)
    found += [config] if isinstance(config, str) else override_problems(config, overrides)
  for arg in cmd.args:
    path = arg.split("=", 1)[-1]
    if re.search(r"\b[A-Z]{2,}\b", path):  # configs/NAME.py
      continue
    if _REPO_PATH.match(path.split(":")[0]) and not os.path.exists(
        os.path.join(ROOT, path.split(":")[0])):
      found.append(f"{path}: no such file or folder in the repository")
  return found


@functools.cache
def _readme() -> list[Command]:
  with open(README) as f:
    return readme_commands(f.read())


def test_the_readme_has_the_commands_this_checks():
  modules = {c.module for c in _readme()}
  assert {"dllm_rl.main", "dllm_rl.plan", "dllm_rl.study", "dllm_rl.convert", "dllm_rl.data",
          "launch/tpu_pod.sh", "launch/gpu_lease.sh"} <= modules, modules
  assert len(_readme()) > 60


@pytest.mark.parametrize("module", sorted({c.module for c in _readme()}))
def test_every_readme_command_names_existing_flags_keys_and_files(module):
  bad = {}
  for cmd in (c for c in _readme() if c.module == module):
    found = problems(cmd)
    deliberate = next((v for k, v in DELIBERATE.items() if k in cmd.args), None)
    if deliberate is not None:
      assert found == deliberate, (cmd.line, found)
    elif found:
      bad[f"README.md:{cmd.line}: {' '.join([module, *cmd.args])}"] = found
  assert not bad, "\n".join(f"{k}\n  " + "\n  ".join(v) for k, v in bad.items())


@pytest.mark.parametrize("text, expected", [
    ("python -m dllm_rl.main --workdir=D --config.rl.lerning_rate=1e-3",
     "config.rl.lerning_rate: unknown key; did you mean rl.lr"),
    ("python -m dllm_rl.main --workdir=D --config.rl.steps=10.5", "expected int, got '10.5'"),
    ("python -m dllm_rl.main --workdir=D --config.rl.loss=stabeldrl", "rl.loss: unknown"),
    ("python -m dllm_rl.main --wokdir=D", "--wokdir: no such flag of dllm_rl.main"),
    ("python -m dllm_rl.plan --config=configs/llada_tpu.py --topolgy=v5p-64", "--topolgy"),
    ("python -m dllm_rl.plan --config=configs/lada_tpu.py --topology=v5p-64",
     "--config=configs/lada_tpu.py: FileNotFoundError"),
    ("python -m dllm_rl.study all --workdir=D --seeds=five", "--seeds=five: not a valid"),
    ("python -m dllm_rl.study stabilty --workdir=D", "study 'stabilty'"),
    ("python -m dllm_rl.study steprs --workdir=D --set=rl.stepz=3", "config.rl.stepz"),
    ("python -m dllm_rl.benchmarks.staircase --length 256", "unrecognized arguments"),
    ("python -m dllm_rl.benchmarks.faults --kinds 'sigterm rolout'", "invalid choice"),
    ("python -m dllm_rl.convert export --work /r --hf_dir /o", "unrecognized arguments"),
    ("dllm-rl-data prepare gsm8k --output /d", "unrecognized arguments"),
    ("python -m dllm_rl.benchmarks.stair --lengths 256", "no such module"),
    ("python -m dllm_rl.main --config=configs/llada_tpu.py --workdir=D"
     " --config.task.options.train_fle=x.jsonl", "unknown option(s) ['train_fle']"),
    ("bash launch/tpu_pod.sh --name n --zone z --stage-weight W", "--stage-weight: no such"),
    ("bash launch/tpu_pod.sh --name n -- --config.rl.stepz=3", "config.rl.stepz: unknown key"),
    ("GPU_CHECK_PART=moe bash launch/gpu_check.sh OUT", "GPU_CHECK_PART=: read by no launch"),
    ("python -m dllm_rl.study.sizing gpu --quik", "--quik: not read by dllm_rl.study.sizing"),
    ("python -m dllm_rl.plan --config=configs/llada_tpu.py --topology=v5q-64", "--topology"),
    ("python -m dllm_rl.plan --config=configs/tiny_cpu.py --topology=cpu:1 --programs=rl_stp",
     "--programs: no program 'rl_stp'"),
    ("python -m dllm_rl.study stability --workdir=D --arms='grpo@*,stabeldrl@*'",
     "'stabeldrl@*' matches no arm"),
    ("python -m dllm_rl.study.branch D --out=O --at=1 --until=2 --variant=v:rl.l=1e-4",
     "config.rl.l: unknown key"),
    ("python -m dllm_rl.main --config=configs/tiny_cpu.py --workdir=D --config.sampler.steps=4",
     None),
])
def test_a_misspelt_flag_key_file_or_module_is_named(text, expected):
  """The checks fail on the README's kinds of rot, and pass a good command."""
  found = problems(readme_commands(f"```bash\n{text}\n```\n")[0])
  if expected is None:
    assert found == []
  else:
    assert any(expected in p for p in found), found
