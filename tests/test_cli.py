"""One override parser for every entry point: ``main``, ``plan`` and ``study`` report the same
bad ``--config.KEY=VALUE`` overrides with the same lines and exit with status 2, before
anything runs."""

import os
import re
import subprocess
import sys

import pytest

from dllm_rl.planning.planner import json_path_problems

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BAD = ["--config.rl.lr=1e-3", "--config.rl.nosuch=1", "--config.seed=-1", "--config.rl.steps=many"]
EXPECTED = ["error: config.rl.nosuch: unknown key",
            "error: config.rl.steps: expected int, got 'many'",
            "error: config.seed: must be in [0, 2**31), got -1"]


def _command(tool: str, workdir: str) -> list[str]:
  if tool == "main":
    return ["-m", "dllm_rl.main", f"--workdir={workdir}"]
  if tool == "plan":
    return ["-m", "dllm_rl.plan", "--config=configs/tiny_cpu.py", "--topology=cpu:1"]
  return ["-m", "dllm_rl.study", "stability", f"--workdir={workdir}"]


@pytest.mark.parametrize("tool", ["main", "plan", "study"])
def test_bad_overrides_same_lines_and_status_2_for_every_entry_point(tool, tmp_path):
  workdir = str(tmp_path / "w")
  proc = subprocess.run([sys.executable, *_command(tool, workdir), *BAD], cwd=ROOT,
                        capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert [l for l in proc.stderr.splitlines() if l.startswith("error:")] == EXPECTED
  assert not os.path.exists(workdir)


def test_study_keeps_its_older_set_spelling_and_takes_a_list_of_studies(tmp_path):
  workdir = str(tmp_path / "w")
  proc = subprocess.run([sys.executable, "-m", "dllm_rl.study", "stability,steprs",
                         f"--workdir={workdir}", "--set=rl.steps=many"], cwd=ROOT,
                        capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.splitlines()[-1] == "error: config.rl.steps: expected int, got 'many'"


def test_study_names_an_unknown_study_of_a_list(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "dllm_rl.study", "stability,stepr",
                         f"--workdir={tmp_path / 'w'}"], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode != 0 and "'stepr'" in proc.stderr, proc.stderr[-2000:]
  assert not os.path.exists(tmp_path / "w")


@pytest.mark.parametrize("args", [
    ["-m", "dllm_rl.plan", "--config=configs/tiny_cpu.py"],         # no --topology
    ["-m", "dllm_rl.main", "--workdir=W", "extra"],                  # a stray argument
    ["-m", "dllm_rl.study", "stability"],                            # no --workdir
    ["-m", "dllm_rl.study", "stabilty", "--workdir=W"]])             # an unknown study
def test_a_usage_error_exits_2_as_a_config_error_does(args, tmp_path):
  """Status 2 and one ``error:`` line, as a flag error gives: absl printed its usage text
  first (the module's docstring and every flag's help, 36 lines for dllm_rl.main)."""
  proc = subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True,
                        timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT))
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  assert len([line for line in proc.stderr.splitlines() if line.startswith("error: ")]) == 1
  assert not re.search(r"^\s+--\w+: ", proc.stderr, re.M), proc.stderr  # no flag help
  assert not os.path.exists(tmp_path / "W")


@pytest.mark.parametrize("flag", ["-h", "--help", "--helpfull"])
def test_help_prints_the_usage_and_exits_0(flag, capsys):
  """``-h`` / ``--help`` / ``--helpfull`` on the absl entry points (main, plan, study share
  this parser) print the usage on stdout and exit 0, as the argparse ones (convert, data) do;
  absl alone exits 1 (a failed run's status) and calls -h an unknown flag (status 2)."""
  from dllm_rl.config import cli
  with pytest.raises(SystemExit) as stop:
    cli.flags_parser([])(["dllm-rl", "--config.rl.lr=1e-3", flag])
  assert stop.value.code == 0
  assert capsys.readouterr().out  # the usage (the __main__ module's docstring and flags)


def test_plan_flags_are_checked_before_the_compile(tmp_path):
  """A --json path that cannot be written, a non-positive memory, cpu:0 or --slices of a topology
  that is no TPU slice are found before the plan compiles (minutes at 8B), all at once with the
  config's problems, exit 2."""
  (tmp_path / "a_file").write_text("")
  proc = subprocess.run([sys.executable, "-m", "dllm_rl.plan", "--config=configs/tiny_cpu.py",
                         "--topology=cpu:0", "--device_memory_gib=-5", "--slices=2",
                         f"--json={tmp_path}/a_file/plan.json", "--config.rl.steps=many"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert [l for l in proc.stderr.splitlines() if l.startswith("error:")] == [
      "error: config.rl.steps: expected int, got 'many'",  # the config's and the flags' at once
      "error: --device_memory_gib: must be positive, got -5.0",
      "error: --topology: cpu:N needs N >= 1 devices, got cpu:0",
      "error: --slices: 2: must be >= 1, and 1 unless --topology is a TPU slice (multislice),"
      " got cpu:0",
      f"error: --json: {tmp_path}/a_file is not an existing folder"]
  assert json_path_problems(str(tmp_path)) and not json_path_problems(f"{tmp_path}/plan.json")


def test_plan_caps_the_slices():
  """The bound launch/tpu_pod.sh --slices keeps too: 10^8 slices would be described device by
  device before the compile."""
  proc = subprocess.run([sys.executable, "-m", "dllm_rl.plan", "--config=configs/tiny_cpu.py",
                         "--topology=v5p-8", "--slices=100000000"], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 2 and proc.stderr.splitlines()[-1] == (
      "error: --slices: 100000000: at most 1024 (dllm_rl.parallel.topology.MAX_SLICES)"), \
      proc.stderr[-2000:]


_AS_TYPED = pytest.mark.parametrize("argv0, typed", [
    ("/venv/bin/dllm-rl-study", "dllm-rl-study"),  # pip's launcher: argv[0] is the script
    (os.path.join(ROOT, "dllm_rl", "study", "__main__.py"), "python -m dllm_rl.study")],
    ids=["console_script", "python_m"])


def _launch_study(argv0: str, args: list[str], cwd, stub: str = "") -> subprocess.CompletedProcess:
  """The study's entry point run as its launcher runs it (``sys.argv[0]`` = ``argv0``: the
  script, as pip writes it, or the module's file, as ``-m`` sets it), ``stub`` run first."""
  launcher = (f"import sys; sys.argv[0] = {argv0!r}; import dllm_rl.study.__main__ as m;"
              f" {stub} m.run()")
  return subprocess.run([sys.executable, "-c", launcher, *args], cwd=cwd,
                        capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT))


@_AS_TYPED
def test_study_records_its_command_as_typed(argv0, typed, tmp_path):
  """The report's "Generated by" command is the one the user ran: under the console script
  it read ``python -m dllm_rl.study ...`` too. Run as the launcher runs it (``sys.argv[0]``
  the script, as pip writes it, or the module's file, as ``-m`` sets it), with the study
  itself stubbed to print the command it was given (nothing trains)."""
  args = ["steprs", f"--workdir={tmp_path / 'w'}", "--seeds=2"]
  proc = _launch_study(argv0, args, tmp_path, "m.study = lambda *a: print('COMMAND', a[6]);")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.splitlines()[-1] == f"COMMAND {typed} {' '.join(args)}"


@_AS_TYPED
def test_the_study_usage_names_the_program_as_typed(argv0, typed, tmp_path):
  """Without a study NAME the usage line names the program the user ran: under the console
  script it said ``python -m dllm_rl.study`` too. Exit status 2, nothing run."""
  proc = _launch_study(argv0, [], tmp_path)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert f"error: usage: {typed} NAME --workdir=DIR; NAME: " in proc.stderr, proc.stderr
  assert os.listdir(tmp_path) == []


def test_a_config_files_import_of_a_module_beside_it_names_pythonpath(tmp_path):
  """README "Out-of-tree components": a config file's folder is not on the import path, so
  ``import my_algo`` of a module beside it fails; the error says so (a module not beside it,
  or another error, gets no hint)."""
  from dllm_rl.config.cli import import_hint
  (tmp_path / "my_algo.py").write_text("")
  config = str(tmp_path / "my_config.py")
  beside = ModuleNotFoundError("No module named 'my_algo'", name="my_algo")
  assert import_hint(beside, config) == (
      " (my_algo is beside the config file, but a config file's folder is not on the import"
      f" path: run with PYTHONPATH={tmp_path})")
  assert import_hint(beside, config + ":tiny") == import_hint(beside, config)
  assert import_hint(ModuleNotFoundError("x", name="elsewhere"), config) == ""
  assert import_hint(ValueError("my_algo"), config) == ""


def test_no_pythonpath_hint_when_the_config_folder_is_on_the_path(tmp_path, monkeypatch):
  """With the folder on the import path already (PYTHONPATH given, or the working directory
  under ``python -m``), a module beside the config file that fails to import a submodule of
  its own is not blamed on the path: no hint."""
  from dllm_rl.config.cli import import_hint
  (tmp_path / "my_algo").mkdir()
  config = str(tmp_path / "my_config.py")
  missing = ModuleNotFoundError("No module named 'my_algo.helpers'", name="my_algo.helpers")
  assert import_hint(missing, config).startswith(" (my_algo is beside the config file")
  monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
  assert import_hint(missing, config) == ""
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", ["", *sys.path[1:]])
  assert import_hint(missing, config) == ""
