"""launch/*.sh: arguments that are there but wrong (a flag where a value goes, a flag given twice,
a launcher flag after ``--``, a config outside what the workers get), each refused, naming it,
before anything is created, submitted or started."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.test_launch import GPU_CHECK, REPO, SLURM, TPU, recording_tools, run_script

TPU_ARGS = ["--name", "n", "--zone", "z", "--workdir", "gs://b/r"]
SLURM_ARGS = ["--config", "configs/tiny_cpu.py", "--workdir", "/w"]


def _tools(tmp_path, python=None):
  """An environment whose gcloud and sbatch touch ``called-TOOL``; the config check runs with
  ``python`` (default: none here, so the check is left to the workers, as on a laptop without
  the checkout's venv: the launcher's own checks must hold without it)."""
  env = recording_tools(tmp_path, {tool: f"touch '{tmp_path}/called-{tool}'"
                                   for tool in ("gcloud", "sbatch")})
  python = python or str(tmp_path / "no-python")
  env.update(DLLM_LOCAL_PYTHON=python, DLLM_PYTHON=python)
  return env


def _refused(res, tmp_path, message):
  assert res.returncode == 2, (res.stdout, res.stderr)
  assert message in res.stderr, res.stderr
  assert not res.stdout and not list(tmp_path.glob("called-*"))


@pytest.mark.parametrize("script, args", [
    (TPU, ["--name", "n", "--zone", "z", "--workdir", "--dry-run"]),
    (SLURM, ["--config", "configs/tiny_cpu.py", "--workdir", "--dry-run"])])
def test_a_flag_where_a_value_goes_is_refused(tmp_path, script, args):
  """`--workdir --dry-run` took --dry-run for the workdir and ran for real: gcloud ssh'd to the
  workers, sbatch queued the job."""
  res = run_script(script, args, _tools(tmp_path), tmp_path)
  _refused(res, tmp_path, "--workdir needs a value, not the flag '--dry-run'")


@pytest.mark.parametrize("script, args, message", [
    (TPU, [*TPU_ARGS, "--name", "m"], "--name given twice ('n', then 'm'): give it once"),
    (TPU, [*TPU_ARGS, "--workdir", "gs://b/other"], "--workdir given twice ('gs://b/r', then"),
    (SLURM, [*SLURM_ARGS, "--nodes", "2", "--nodes", "4"], "--nodes given twice ('2', then '4')"),
    (SLURM, [*SLURM_ARGS, "--config", "configs/wd1.py"], "--config given twice")])
def test_a_value_flag_given_twice_is_refused(tmp_path, script, args, message):
  """Which one was meant? The last one won silently: a second --workdir pasted onto a command
  ran in a folder the first one did not name. --env stays repeatable."""
  _refused(run_script(script, args, _tools(tmp_path), tmp_path), tmp_path, message)


def test_tpu_env_stays_repeatable(tmp_path):
  res = run_script(TPU, ["--dry-run", *TPU_ARGS, "--env", "A=1", "--env", "B=2"],
                   _tools(tmp_path), tmp_path)
  assert res.returncode == 0 and "A=1 B=2 " in res.stdout, res.stderr


@pytest.mark.parametrize("script, args", [(TPU, TPU_ARGS), (SLURM, SLURM_ARGS)])
@pytest.mark.parametrize("after, message", [
    ("--dry-run", "--dry-run after '--' would go to dllm_rl.main, not stop the launch"),
    ("--config=configs/wd1.py", "--config=configs/wd1.py after '--': give --config before"),
    ("--workdir", "--workdir after '--': give --workdir before"),
    ("--workdir=/elsewhere", "--workdir=/elsewhere after '--': give --workdir before")])
def test_a_launcher_flag_after_the_separator_is_refused(tmp_path, script, args, after, message):
  """`-- --dry-run` ran for real (dllm_rl.main got --dry-run); `-- --config=OTHER` ran OTHER
  on the workers while the launcher had checked its own config (absl keeps the last --config),
  and `-- --workdir=OTHER` wrote elsewhere than the launcher said. With no Python here to check
  the overrides, nothing caught them before the workers."""
  res = run_script(script, [*args, "--", "--config.rl.steps=5", after], _tools(tmp_path),
                   tmp_path)
  _refused(res, tmp_path, message)


def test_config_overrides_after_the_separator_still_pass(tmp_path):
  res = run_script(TPU, ["--dry-run", *TPU_ARGS, "--", "--config.rl.steps=5",
                         "--config.task.name=workdir"], _tools(tmp_path), tmp_path)
  assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("flag", [["--accelerator-type", "v4-8"], ["--runtime-version", "v"],
                                  ["--spot"]])
def test_tpu_refuses_a_create_flag_without_create(tmp_path, flag):
  """They say what --create makes; without it the slice is used as it is, and they did
  nothing (the user meant a Spot or a v4 slice)."""
  res = run_script(TPU, [*TPU_ARGS, *flag], _tools(tmp_path), tmp_path)
  _refused(res, tmp_path, f"{flag[0]} applies only with --create (the slice n is used")


def test_tpu_refuses_a_config_outside_the_checkout(tmp_path):
  """`--config ../x.py` exists here but not on the workers (they get this checkout's copy):
  the run failed after the slices were created and set up."""
  shutil.copy(os.path.join(REPO, "configs", "tiny_cpu.py"), tmp_path / "mine.py")
  outside = os.path.relpath(tmp_path / "mine.py", REPO)
  res = run_script(TPU, [*TPU_ARGS, "--create", "--config", outside],
                   _tools(tmp_path, sys.executable), tmp_path)
  _refused(res, tmp_path, f"--config {outside}: {tmp_path}/mine.py is outside the checkout")


@pytest.mark.parametrize("folder", ["workdir-launch-test-{pid}", "runs/launch-test-{pid}",
                                    "launch-test-{pid}/__pycache__"])
def test_tpu_refuses_a_config_in_a_folder_the_tarball_leaves_out(tmp_path, folder):
  """A config under runs/ or workdir*/ (or any __pycache__) is here but not in --setup's
  tarball: the workers' dllm_rl.main could not find it, after the slices were created."""
  top = folder.format(pid=os.getpid()).split("/")[0]
  made = not os.path.exists(os.path.join(REPO, top))
  where = os.path.join(REPO, folder.format(pid=os.getpid()))
  try:
    os.makedirs(where)
    shutil.copy(os.path.join(REPO, "configs", "tiny_cpu.py"), os.path.join(where, "mine.py"))
    config = os.path.relpath(os.path.join(where, "mine.py"), REPO)
    res = run_script(TPU, [*TPU_ARGS, "--dry-run", "--config", config],
                     _tools(tmp_path, sys.executable), tmp_path)
  finally:
    shutil.rmtree(os.path.join(REPO, top) if made else where)
  left_out = os.path.basename(where) if "__pycache__" in folder else top
  _refused(res, tmp_path, f"is in {left_out}/, which --setup's tarball leaves out")


def test_tpu_refuses_a_config_linked_to_a_file_outside_the_checkout(tmp_path):
  """The tarball carries a link as a link: one to a file outside the checkout dangles on the
  workers."""
  shutil.copy(os.path.join(REPO, "configs", "tiny_cpu.py"), tmp_path / "mine.py")
  folder = os.path.join(REPO, f".launch-test-{os.getpid()}")
  try:
    os.makedirs(folder)
    os.symlink(tmp_path / "mine.py", os.path.join(folder, "link.py"))
    config = os.path.relpath(os.path.join(folder, "link.py"), REPO)
    res = run_script(TPU, [*TPU_ARGS, "--dry-run", "--config", config],
                     _tools(tmp_path, sys.executable), tmp_path)
  finally:
    shutil.rmtree(folder)
  _refused(res, tmp_path, f"--config {config}: {tmp_path}/mine.py is outside the checkout")


@pytest.mark.parametrize("remote", [".", "./", "~", "/", "$HOME"])
def test_tpu_refuses_home_as_the_remote_dir(tmp_path, remote):
  """--setup unpacks the checkout into --remote-dir and rebuilds its .venv with
  `uv venv --clear`: home itself would get the checkout's files and lose its own ~/.venv."""
  res = run_script(TPU, [*TPU_ARGS, "--setup", "--remote-dir", remote], _tools(tmp_path),
                   tmp_path)
  _refused(res, tmp_path, f"--remote-dir '{remote}': name a folder of its own")


def _checkout(where):
  """A minimal checkout at ``where``: launch/, dllm_rl/main.py and configs/tiny_cpu.py."""
  shutil.copytree(os.path.join(REPO, "launch"), where / "launch")
  (where / "dllm_rl").mkdir()
  (where / "dllm_rl" / "main.py").write_text("")
  (where / "configs").mkdir()
  shutil.copy(os.path.join(REPO, "configs", "tiny_cpu.py"), where / "configs" / "tiny_cpu.py")


def test_slurm_refuses_a_checkout_path_with_a_comma(tmp_path):
  """sbatch --export=ALL,DLLM_REPO=PATH splits PATH at its commas: the job would get a
  DLLM_REPO cut short and fail after waiting in the queue."""
  repo = tmp_path / "runs,2"
  _checkout(repo)
  res = run_script(str(repo / "launch" / "slurm_gpu.sh"), SLURM_ARGS, _tools(tmp_path), tmp_path)
  _refused(res, tmp_path, f"the checkout's path {repo} has a comma")


def test_slurm_names_a_dllm_repo_that_is_no_checkout(tmp_path):
  """A stale DLLM_REPO: bash's "launch/common.sh: No such file or directory", status 1."""
  env = {**_tools(tmp_path), "DLLM_REPO": str(tmp_path / "gone")}
  res = run_script(SLURM, SLURM_ARGS, env, tmp_path)
  _refused(res, tmp_path, f"DLLM_REPO={tmp_path}/gone is not a dllm_rl checkout (no "
                          "dllm_rl/main.py there)")


@pytest.mark.parametrize("fraction", ["0.0", ".000", "0"])
def test_slurm_refuses_a_memory_fraction_of_zero(tmp_path, fraction):
  """(0, 1] as the message says: 0.0 passed, and every process would have preallocated no GPU
  memory, after the queue."""
  res = run_script(SLURM, [*SLURM_ARGS, "--mem-fraction", fraction], _tools(tmp_path), tmp_path)
  _refused(res, tmp_path, f"must be in (0, 1], got '{fraction}'")


@pytest.mark.parametrize("args, message", [
    (["--limit", "5"], "unknown option '--limit': OUT_DIR is the only argument"),
    (["out", "extra"], "got 2 arguments: OUT_DIR is the only one")])
def test_gpu_check_takes_one_out_dir_and_no_options(tmp_path, args, message):
  """An option was taken for OUT_DIR (mkdir failed on it: status 1) and a second argument was
  dropped while the benchmarks ran: status 2 now, nothing run or made."""
  marker = tmp_path / "ran"
  python = tmp_path / "python"
  python.write_text(f"#!/bin/sh\ntouch '{marker}'\n")
  python.chmod(0o755)
  res = subprocess.run(["bash", GPU_CHECK, *args], env={**os.environ, "PYTHON": str(python)},
                       capture_output=True, text=True, timeout=30, cwd=tmp_path)
  assert res.returncode == 2 and message in res.stderr, res.stderr
  assert sorted(os.listdir(tmp_path)) == ["python"]


@pytest.mark.parametrize("variable", ["SLURM_GPUS_PER_NODE", "DLLM_GPUS_PER_NODE"])
def test_slurm_refuses_gpus_of_several_types(tmp_path, variable):
  """An allocation of `--gpus-per-node=a100:2,v100:2` (2 of each type per node) was read as 2
  GPUs per node (the last count): srun asked for 2 untyped GPUs, and one run would have mixed
  two GPU generations. --gpus-per-node still overrides it."""
  env = recording_tools(tmp_path, {tool: f"touch '{tmp_path}/called-{tool}'"
                                   for tool in ("srun", "scontrol", "sbatch")})
  env.update(SLURM_JOB_ID="5", SLURM_JOB_NODELIST="g[1-2]", SLURM_JOB_NUM_NODES="2",
             DLLM_PYTHON=str(tmp_path / "no-python"), **{variable: "a100:2,v100:2"})
  res = run_script(SLURM, SLURM_ARGS, env, tmp_path)
  _refused(res, tmp_path, f"{variable}=a100:2,v100:2 lists GPUs of several types: a run needs "
                          "GPUs of one type; allocate one (e.g. --gpus-per-node=a100:2)")
  res = run_script(SLURM, ["--dry-run", *SLURM_ARGS, "--gpus-per-node", "2"], env, tmp_path)
  assert res.returncode == 0 and "--gpus-per-node=2" in res.stdout, res.stderr


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["--config", "c.py", "--help"]])
def test_slurm_help_needs_no_checkout(tmp_path, args):
  """A copy of the script (as sbatch spools one) with no checkout beside it: --help said
  "cannot find the dllm_rl checkout: set DLLM_REPO" (status 2) instead of the usage."""
  shutil.copy(SLURM, tmp_path / "slurm_gpu.sh")
  res = run_script(str(tmp_path / "slurm_gpu.sh"), args, _tools(tmp_path), tmp_path)
  assert res.returncode == 0 and not res.stderr, res.stderr
  assert res.stdout.startswith("Run dllm_rl on several GPU nodes") and "\nOptions" in res.stdout


def test_slurm_says_when_dllm_repo_names_another_checkout(tmp_path):
  """A DLLM_REPO left exported from another checkout was used silently: the job ran that
  checkout's code and configs. Now one line on stderr names it; none when DLLM_REPO is this
  script's own checkout (through a link too), as in the submitted job (a spooled copy)."""
  _checkout(tmp_path / "other")
  env = {**_tools(tmp_path), "DLLM_REPO": str(tmp_path / "other")}
  res = run_script(SLURM, ["--dry-run", *SLURM_ARGS], env, tmp_path)
  assert res.returncode == 0, res.stderr
  notes = [line for line in res.stderr.splitlines() if "note: using the checkout" in line]
  assert notes == [f"slurm_gpu.sh: note: using the checkout DLLM_REPO={tmp_path}/other, not "
                   f"{REPO} where this script is (unset DLLM_REPO to use that one)"], res.stderr
  assert f"--chdir={tmp_path}/other " in res.stdout
  os.symlink(REPO, tmp_path / "link")
  for repo in (REPO, str(tmp_path / "link")):
    res = run_script(SLURM, ["--dry-run", *SLURM_ARGS], {**env, "DLLM_REPO": repo}, tmp_path)
    assert res.returncode == 0 and "note: using the checkout" not in res.stderr, res.stderr
  shutil.copy(SLURM, tmp_path / "spooled.sh")  # sbatch's copy: in no checkout
  res = run_script(str(tmp_path / "spooled.sh"), ["--dry-run", *SLURM_ARGS], env, tmp_path)
  assert res.returncode == 0 and "note: using the checkout" not in res.stderr, res.stderr


def test_tpu_caps_the_slices_at_the_planners_bound(tmp_path):
  """A 9-digit --slices passed the number check and built a slice name each (then a gcloud
  session each) before anything failed: the bound is the planner's, topology.MAX_SLICES."""
  from dllm_rl.parallel import topology
  most, env = topology.MAX_SLICES, _tools(tmp_path)
  for slices in (most + 1, 999999999):
    res = run_script(TPU, [*TPU_ARGS, "--dry-run", "--slices", str(slices)], env, tmp_path)
    _refused(res, tmp_path, f"--slices (or TPU_SLICES) {slices}: at most {most} slices")
  with open(TPU) as f:  # the script's own number (a dry run of 1024 slices takes seconds)
    assert f"\nMAX_SLICES={most}\n" in f.read()
