"""Launch N real JAX processes on localhost for the multi-process tests.

Each worker script is called as ``python WORKER COORDINATOR N PROCESS_ID OUT`` with
a clean environment (no cluster variables), ``devices`` simulated CPU devices
per process and the repository on PYTHONPATH. Bounded in time; processes still
running at the deadline are killed.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER_ENV_PREFIXES = ("DLLM_", "SLURM_", "OMPI_", "TPU_", "MEGASCALE_", "JAX_COORDINATOR",
                        "JAX_LOCAL_DEVICE_IDS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def load_module(path: str, name: str):
  """Import a worker script as a module (to reuse its functions in-process)."""
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def run_workers(worker: str, tmp_path, *, out_suffix: str, processes: int = 2, devices: int = 2,
                timeout: float = 120.0):
  """Run the workers; return (output paths, log paths, return codes, a report of the logs)."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(CLUSTER_ENV_PREFIXES)}
  # The test run's XLA flags (tests/conftest.py: the faster CPU compiles) with this worker's
  # own device count.
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env.update(XLA_FLAGS=" ".join(flags + [f"--xla_force_host_platform_device_count={devices}"]),
             JAX_PLATFORMS="cpu",
             PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=REPO)
  coordinator = f"localhost:{free_port()}"
  outs = [tmp_path / f"out{p}{out_suffix}" for p in range(processes)]
  logs = [tmp_path / f"log{p}.txt" for p in range(processes)]
  procs = []
  try:
    for p in range(processes):
      with open(logs[p], "w") as log:
        procs.append(subprocess.Popen(
            [sys.executable, worker, coordinator, str(processes), str(p), str(outs[p])],
            env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    for proc in procs:
      proc.wait(timeout=max(1.0, deadline - time.monotonic()))
  except subprocess.TimeoutExpired:
    pass
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  codes = [proc.returncode for proc in procs]
  report = "\n".join(f"--- process {p} (rc {codes[p]}):\n{logs[p].read_text()[-3000:]}"
                     for p in range(len(procs)))
  return outs, logs, codes, report
