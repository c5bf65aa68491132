"""A real 2-process run (jax.distributed on localhost, CPU collectives): two RL
steps on a mesh spanning both processes agree with the single-process result."""

import importlib.util
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from dllm_rl.parallel.mesh import make_mesh

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(REPO, "tests", "multiprocess", "rl_worker.py")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _worker_module():
  spec = importlib.util.spec_from_file_location("rl_worker", WORKER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.multiprocess
def test_two_process_rl_steps_match_single_process(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "OMPI", "TPU_", "DLLM_"))}
  env.update(XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
             PYTHONPATH=REPO)
  coordinator = f"localhost:{_free_port()}"
  outs = [tmp_path / f"out{p}.npz" for p in range(2)]
  logs = [tmp_path / f"log{p}.txt" for p in range(2)]
  procs = []
  try:
    for p in range(2):
      with open(logs[p], "w") as log:
        procs.append(subprocess.Popen([sys.executable, WORKER, coordinator, "2", str(p),
                                       str(outs[p])], env=env, cwd=tmp_path, stdout=log,
                                      stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 240
    for proc in procs:
      proc.wait(timeout=max(1.0, deadline - time.monotonic()))
  except subprocess.TimeoutExpired:
    pass
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  report = "\n".join(f"--- process {p} (rc {procs[p].returncode}):\n{logs[p].read_text()[-3000:]}"
                     for p in range(len(procs)))
  assert [proc.returncode for proc in procs] == [0, 0], report

  ref_losses, ref_leaves = _worker_module().two_rl_steps(
      make_mesh({"data": 2, "fsdp": 2, "tensor": 1}))  # 4 of this process's 8 devices
  for out in outs:
    got = np.load(out)
    assert int(got["process_count"]) == 2 and int(got["global_devices"]) == 4
    np.testing.assert_allclose(got["losses"], ref_losses, rtol=1e-5, atol=1e-6)
    for i, ref in enumerate(ref_leaves):
      np.testing.assert_allclose(got[f"p{i}"], ref, rtol=1e-5, atol=1e-6)
