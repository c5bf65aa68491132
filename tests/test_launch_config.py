"""launch/*.sh: the config they are given (FILE:ARG, absolute paths, one that cannot be checked
here) and their numeric settings, checked before anything is created or submitted."""

from __future__ import annotations

import os
import sys

import pytest

from tests.test_launch import REPO, SLURM, TPU, commands, recording_tools, run_script

TPU_ARGS = ["--name", "n", "--zone", "z", "--workdir", "gs://b/r"]


def _tools(tmp_path):
  """An environment whose gcloud and sbatch touch ``called-TOOL`` (gcloud says ACTIVE to a
  queued resource's state read) and whose local Python runs the config check."""
  env = recording_tools(tmp_path, {tool: f"touch '{tmp_path}/called-{tool}'; echo ACTIVE"
                                   for tool in ("gcloud", "sbatch")})
  env.update(DLLM_LOCAL_PYTHON=sys.executable, DLLM_PYTHON=sys.executable)
  return env


def _called(tmp_path) -> list[str]:
  return sorted(p.name for p in tmp_path.glob("called-*"))


def test_tpu_runs_and_checks_a_config_file_with_a_get_config_argument(tmp_path):
  """--config FILE:ARG (get_config("ARG"), as dllm_rl.main reads it): the run goes ahead (before,
  "config file .../configs/wd1.py:tiny not found" outside a dry run), and the check runs on it
  (before, skipped): a typo'd key, or an ARG for a get_config() that takes none, stops it."""
  env = _tools(tmp_path)
  res = run_script(TPU, [*TPU_ARGS, "--config", "configs/wd1.py:tiny"], env, tmp_path)
  assert res.returncode == 0, res.stderr
  (launch,) = commands(res.stdout)
  assert "--config=configs/wd1.py:tiny" in launch[-1] and _called(tmp_path) == ["called-gcloud"]
  res = run_script(TPU, ["--dry-run", *TPU_ARGS, "--config", "configs/wd1.py:tiny", "--",
                         "--config.rl.nosuch=1"], env, tmp_path)
  assert res.returncode == 2 and "error: config.rl.nosuch: unknown key" in res.stderr, res.stderr
  res = run_script(TPU, ["--dry-run", *TPU_ARGS, "--config", "configs/tiny_cpu.py:x"], env,
                   tmp_path)
  assert res.returncode == 2 and "get_config() takes no argument, so ':x' names no variant" in (
      res.stderr), res.stderr
  res = run_script(TPU, [*TPU_ARGS, "--config", "configs/nosuch.py:tiny"], env, tmp_path)
  assert res.returncode == 2 and "configs/nosuch.py not found" in res.stderr, res.stderr


def test_tpu_names_an_absolute_config_path_for_what_it_is(tmp_path):
  """The workers read the config from their copy of the checkout: an absolute path is refused,
  in a dry run too (which printed a command the workers could not run)."""
  res = run_script(TPU, ["--dry-run", *TPU_ARGS, "--config",
                         os.path.join(REPO, "configs", "tiny_cpu.py")], _tools(tmp_path), tmp_path)
  assert res.returncode == 2 and "relative to the checkout" in res.stderr and not res.stdout


@pytest.mark.parametrize("config", ["configs/wd1.py:tiny",
                                    os.path.join(REPO, "configs", "wd1.py:tiny"),
                                    os.path.join(REPO, "configs", "wd1.py")])
def test_slurm_submits_and_checks_file_arg_and_absolute_configs(tmp_path, config):
  """FILE:ARG and absolute paths (the nodes read them on their shared filesystem): submitted
  (before, "not found"), after the check, which stops a typo'd key (before, skipped)."""
  env = _tools(tmp_path)
  res = run_script(SLURM, ["--config", config, "--workdir", "/w", "--", "--config.rl.lr=abc"],
                   env, tmp_path)
  assert res.returncode == 2 and "error: config.rl.lr: expected float" in res.stderr, res.stderr
  assert not _called(tmp_path)
  res = run_script(SLURM, ["--config", config, "--workdir", "/w"], env, tmp_path)
  assert res.returncode == 0 and _called(tmp_path) == ["called-sbatch"], res.stderr
  sbatch = commands(res.stdout)[0]
  assert sbatch[sbatch.index("--config") + 1] == config


def test_a_config_importing_what_the_local_python_lacks_is_left_to_the_workers(tmp_path):
  """A config file importing a package installed on the workers only: the launch goes on, the
  note saying why it was not checked here (before, the check stopped it: status 2)."""
  config = tmp_path / "workers_only.py"
  config.write_text("import a_package_of_the_workers_only  # noqa\n\n"
                    "def get_config():\n  return None\n")
  res = run_script(SLURM, ["--config", str(config), "--workdir", "/w"], _tools(tmp_path),
                   tmp_path)
  assert res.returncode == 0 and _called(tmp_path) == ["called-sbatch"], res.stderr
  assert "checked on the workers only" in res.stderr
  assert "No module named 'a_package_of_the_workers_only'" in res.stderr


@pytest.mark.parametrize("var, value, least", [
    ("TPU_POLL_SECONDS", "x", 0), ("TPU_POLL_TRIES", "abc", 1), ("TPU_POLL_TRIES", "0", 1),
    ("TPU_FAIL_GRACE_SECONDS", "10m", 0), ("TPU_FAIL_GRACE_SECONDS", "08", 0)])
def test_tpu_refuses_a_numeric_setting_that_is_not_a_number(tmp_path, var, value, least):
  """Bash arithmetic read "abc" as an unset variable (0; under set -u a crash mid-run, after the
  slices were created) and "10m" as an error each second, so the grace never ended: each is now
  named before anything is created."""
  env = {**_tools(tmp_path), "TPU_POLL_SECONDS": "0", var: value}
  res = run_script(TPU, ["--create", "--slices", "2", *TPU_ARGS, "--",
                         "--config.mesh.data=2"], env, tmp_path)
  assert res.returncode == 2, (res.stdout, res.stderr)
  assert f"{var}: expected a whole number >= {least}, got '{value}'" in res.stderr
  assert not _called(tmp_path) and not res.stdout


@pytest.mark.parametrize("env, args, message", [
    ({"DLLM_PORT": "abc"}, [], "--port (or DLLM_PORT) must be a port number"),
    ({}, ["--port", "70000"], "--port (or DLLM_PORT) must be a port number"),
    ({"DLLM_NODES": "two"}, [], "--nodes (or DLLM_NODES)"),
    ({"DLLM_CPUS_PER_TASK": "x"}, [], "--cpus-per-task (or DLLM_CPUS_PER_TASK)")])
def test_slurm_names_the_variable_of_a_bad_numeric_setting(tmp_path, env, args, message):
  """A port that is no port number reached every task's coordinator_address after the queue."""
  res = run_script(SLURM, ["--config", "configs/tiny_cpu.py", "--workdir", "/w", *args],
                   {**_tools(tmp_path), **env}, tmp_path)
  assert res.returncode == 2 and message in res.stderr, res.stderr
  assert not _called(tmp_path) and not res.stdout


@pytest.mark.parametrize("script, allocation", [(TPU, False), (SLURM, False), (SLURM, True)])
@pytest.mark.parametrize("dry", [True, False])
@pytest.mark.parametrize("config", ["configs/nosuch.py", "configs/nosuch.py:tiny"])
def test_a_config_file_that_is_not_there_stops_dry_and_real_runs(tmp_path, script, allocation,
                                                                 dry, config):
  """The file of --config FILE or FILE:ARG is named before anything is created, queued or
  started: a dry run skipped the check (and printed commands the workers could not run)."""
  env = recording_tools(tmp_path, {tool: f"touch '{tmp_path}/called-{tool}'; echo ACTIVE"
                                   for tool in ("gcloud", "sbatch", "srun", "scontrol")})
  if allocation:
    env.update(SLURM_JOB_ID="7", SLURM_JOB_NODELIST="g1", SLURM_JOB_NUM_NODES="1")
  args = TPU_ARGS if script == TPU else ["--workdir", "/w"]
  res = run_script(script, [*(["--dry-run"] if dry else []), *args, "--config", config], env,
                   tmp_path)
  assert res.returncode == 2, (res.stdout, res.stderr)
  assert f"config file {REPO}/configs/nosuch.py not found (--config {config})" in res.stderr
  assert not res.stdout and not _called(tmp_path)


def test_a_config_folder_is_named_for_what_it_is(tmp_path):
  res = run_script(SLURM, ["--dry-run", "--config", "configs", "--workdir", "/w"],
                   _tools(tmp_path), tmp_path)
  assert res.returncode == 2 and f"config file {REPO}/configs is a folder" in res.stderr, (
      res.stderr)
  assert not res.stdout


@pytest.mark.parametrize("var, value, message", [
    ("SLURM_CPUS_ON_NODE", "abc", "SLURM_CPUS_ON_NODE (the node's cores; --cpus-per-task"),
    ("SLURM_CPUS_ON_NODE", "08", "SLURM_CPUS_ON_NODE (the node's cores; --cpus-per-task"),
    ("SLURM_JOB_ID", "x1", "SLURM_JOB_ID (the port is 20000 + it % 10000 unless --port)"),
    ("SLURM_JOB_NUM_NODES", "two", "SLURM_JOB_NUM_NODES (the allocation's; --nodes"),
    ("SLURM_GPUS_PER_NODE", "h100:four", "SLURM_GPUS_PER_NODE (the allocation's;"
                                         " --gpus-per-node")])
@pytest.mark.parametrize("dry", [True, False])
def test_slurm_names_a_bad_number_from_the_allocation(tmp_path, var, value, message, dry):
  """The allocation's numbers, read unchecked: "abc" cores crashed the script (an unbound
  variable under set -u), "08" was bad octal; a bad node count was blamed on --nodes (or
  DLLM_NODES), which the user had not given. Each is named, srun never started."""
  env = recording_tools(tmp_path, {tool: f"touch '{tmp_path}/called-{tool}'; echo g1"
                                   for tool in ("srun", "scontrol")})
  env.update({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "g1", "SLURM_JOB_NUM_NODES": "1",
              "SLURM_CPUS_ON_NODE": "96", var: value})
  res = run_script(SLURM, [*(["--dry-run"] if dry else []), "--config", "configs/tiny_cpu.py",
                           "--workdir", "/w"], env, tmp_path)
  assert res.returncode == 2, (res.stdout, res.stderr)
  assert f"{message}" in res.stderr and f"got '{value.split(':')[-1]}'" in res.stderr, (
      res.stderr)
  assert not res.stdout and not _called(tmp_path)
  # a flag (or its DLLM_ variable) given instead, the allocation's value is not read
  fix = {"SLURM_CPUS_ON_NODE": ["--cpus-per-task", "4"], "SLURM_JOB_ID": ["--port", "20001"],
         "SLURM_JOB_NUM_NODES": ["--nodes", "1"], "SLURM_GPUS_PER_NODE": ["--gpus-per-node", "8"]}
  res = run_script(SLURM, ["--dry-run", "--config", "configs/tiny_cpu.py", "--workdir", "/w",
                           *fix[var]], env, tmp_path)
  assert res.returncode == 0, res.stderr


def test_tpu_refuses_a_slice_count_bash_cannot_hold(tmp_path):
  """--slices 99999999999999999999 passed the old check and wrapped in bash arithmetic: the
  loop naming the slices ran on (the script hung before printing anything)."""
  res = run_script(TPU, ["--dry-run", *TPU_ARGS, "--slices", "99999999999999999999"],
                   _tools(tmp_path), tmp_path)
  assert res.returncode == 2, (res.stdout, res.stderr)
  assert ("--slices (or TPU_SLICES): expected a whole number >= 1, got '99999999999999999999'"
          in res.stderr) and not res.stdout


@pytest.mark.parametrize("script, args", [
    (TPU, ["--dry-run", *TPU_ARGS]),
    (SLURM, ["--dry-run", "--config", "configs/llada_gpu.py", "--workdir", "/w"])])
def test_a_setting_the_run_does_not_read_is_shown_at_launch(tmp_path, script, args):
  """The check's warning (a no-op key: dllm_rl.config.unread) is shown on stderr and the launch
  goes on (before, common.sh dropped what the check said on status 0: a 64-chip pod learnt
  it from the workers' logs)."""
  res = run_script(script, [*args, "--", "--config.rl.beta_end=4.0"], _tools(tmp_path), tmp_path)
  assert res.returncode == 0 and commands(res.stdout), res.stderr
  assert ("warning: config.rl.beta_end=4.0 is not read: the steprs advantages' schedule"
          in res.stderr.splitlines()), res.stderr
  assert not _called(tmp_path)
