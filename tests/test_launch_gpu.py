"""launch/gpu_lease.sh and gpu_check.sh over a stub Python (no GPU, no jax): what a lease call
packs and summarizes, call after call on the same state (a warm machine keeps /tmp)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile

from tests.test_launch import REPO


def _lease(tmp_path, out_name, **extra_env):
  """One gpu_lease.sh call (no study, the staircase benchmark alone) from a copy of launch/ (a
  checkout's .whl/ would be installed over /tmp/site), its state in tmp_path/state; PYTHON is
  tmp_path/py, a stub that echoes its arguments unless the test wrote its own."""
  repo = tmp_path / "repo"
  if not repo.exists():
    shutil.copytree(os.path.join(REPO, "launch"), repo / "launch")
  stub = tmp_path / "py"
  if not stub.exists():
    stub.write_text("#!/bin/sh\necho stub \"$@\"\n")
    stub.chmod(0o755)
  out = tmp_path / out_name
  out.mkdir()
  env = {**os.environ, "PYTHON": str(tmp_path / "py"), "OUT": str(out),
         "GPU_LEASE_STATE": str(tmp_path / "state"), "GPU_CHECK_PARTS": "staircase",
         **extra_env}
  res = subprocess.run(["bash", str(repo / "launch" / "gpu_lease.sh"), "0", "5"], env=env,
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
  assert res.returncode == 0, res.stderr
  return out


def test_a_second_lease_call_summarizes_each_part_once(tmp_path):
  """gpu_check.sh appended to its summary.txt, which a second call on the same state kept: the
  summary brought back held every part once per call so far."""
  _lease(tmp_path, "out1")
  out = _lease(tmp_path, "out2")
  for summary in (out / "summary.txt", tmp_path / "state" / "bench" / "summary.txt"):
    text = summary.read_text()
    assert text.count("== staircase (limit 5s)") == 1, text
    assert text.count("stub -m dllm_rl.benchmarks.staircase") == 1, text


def test_the_packed_state_leaves_out_the_runs_lock_files(tmp_path):
  """A run's workdir keeps its (empty) .dllm_rl.lock: it came back in gpu_lease.tgz."""
  run_dir = tmp_path / "state" / "study_check" / "study" / "sft"
  run_dir.mkdir(parents=True)
  (run_dir / ".dllm_rl.lock").touch()
  (run_dir / "summary.json").write_text("{}")
  out = _lease(tmp_path, "out")
  with tarfile.open(out / "gpu_lease.tgz") as tgz:
    names = tgz.getnames()
  assert "state/study_check/study/sft/summary.json" in names, names
  assert not [n for n in names if n.endswith(".lock")], names


def test_a_python_without_the_stack_stops_the_lease_before_any_part(tmp_path):
  """PYTHON unset on a machine whose python3 lacks jax (and no .whl/): every part failed on its
  import and the call exited 0 after spending its limits. It stops at the version probe now
  (status 3), naming PYTHON and the import that failed; no part runs."""
  shutil.copytree(os.path.join(REPO, "launch"), tmp_path / "repo" / "launch")
  stub = tmp_path / "py"
  stub.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'jax'\"\nexit 1\n")
  stub.chmod(0o755)
  env = {**os.environ, "PYTHON": str(stub), "OUT": str(tmp_path / "out"),
         "GPU_LEASE_STATE": str(tmp_path / "state")}
  (tmp_path / "out").mkdir()
  res = subprocess.run(["bash", str(tmp_path / "repo" / "launch" / "gpu_lease.sh"), "5", "5"],
                       env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
  assert res.returncode == 3, (res.stdout, res.stderr)
  assert f"PYTHON={stub} cannot import the stack" in res.stderr, res.stderr
  assert "No module named 'jax'" in res.stderr, res.stderr
  assert sorted(os.listdir(tmp_path / "state")) == ["env.txt"]  # no study_check, no bench


def test_a_python_without_the_stack_is_not_reported_as_xla_rejecting_deterministic_ops(
    tmp_path):
  """With GPU_LEASE_DETERMINISTIC=1 the deterministic-ops check ran before the stack probe, so
  a Python without jax printed "XLA rejected --xla_gpu_deterministic_ops: running without it"
  before the import error. The probe runs first now: only the failed import is reported."""
  shutil.copytree(os.path.join(REPO, "launch"), tmp_path / "repo" / "launch")
  stub = tmp_path / "py"
  stub.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'jax'\" >&2\n"
                  "exit 1\n")
  stub.chmod(0o755)
  env = {**os.environ, "PYTHON": str(stub), "GPU_LEASE_STATE": str(tmp_path / "state"),
         "GPU_LEASE_DETERMINISTIC": "1"}
  res = subprocess.run(["bash", str(tmp_path / "repo" / "launch" / "gpu_lease.sh"), "5", "5"],
                       env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
  assert res.returncode == 3, (res.stdout, res.stderr)
  assert "XLA" not in res.stdout + res.stderr, (res.stdout, res.stderr)
  assert f"PYTHON={stub} cannot import the stack" in res.stderr, res.stderr
  assert "No module named 'jax'" in res.stderr, res.stderr


def test_deterministic_ops_that_fail_are_dropped_with_the_reason(tmp_path):
  """A stack that imports but fails the bf16 matmul with --xla_gpu_deterministic_ops: the flag
  is dropped before any part runs, and env.txt (printed) says so with the error's last line."""
  (tmp_path / "py").write_text(
      "#!/bin/sh\ncase $1 in\n  -) cat >/dev/null; echo 'python 3.12 jax stub' ;;\n"
      "  -c) echo Traceback >&2; echo 'XlaRuntimeError: no GEMM config' >&2; exit 1 ;;\n"
      "  *) echo stub \"$@\" \"XLA_FLAGS=$XLA_FLAGS\" ;;\nesac\n")
  (tmp_path / "py").chmod(0o755)
  out = _lease(tmp_path, "out", GPU_LEASE_DETERMINISTIC="1", XLA_FLAGS="--xla_mine=1")
  env_txt = (out / "env.txt").read_text()
  assert ("XLA failed a bf16 matmul with --xla_gpu_deterministic_ops (XlaRuntimeError: no GEMM"
          " config): running without it\nXLA_FLAGS=--xla_mine=1\n") in env_txt, env_txt
  summary = (out / "summary.txt").read_text()
  assert "XLA_FLAGS=--xla_mine=1" in summary and "deterministic_ops" not in summary, summary
