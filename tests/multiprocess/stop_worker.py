"""One process of the 2-process stop/save agreement test in tests/test_resilience.py.

    python tests/multiprocess/stop_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT.json

Only process 1 receives SIGTERM (before step 3) and only process 0 has a time-based save due
(step 1); every process must still take the same (save, stop) decision at every step.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from dllm_rl.parallel import distributed  # noqa: E402
from dllm_rl.train import resilience  # noqa: E402


def main(coordinator: str, num_processes: int, process_id: int, out_path: str) -> None:
  distributed.initialize(ml_collections.ConfigDict(dict(
      initialize="explicit", coordinator_address=coordinator, num_processes=num_processes,
      process_id=process_id, local_device_ids="")))
  guard = resilience.StepGuard("rl", None, save_every=100,
                               save_every_seconds=1e-9 if process_id == 0 else 0.0,
                               max_consecutive_nonfinite=1)
  decisions = []
  with resilience.handle_signals():
    for step in range(1, 6):
      if process_id == 1 and step == 3:
        os.kill(os.getpid(), signal.SIGTERM)
      save, stop = guard.poll(step)
      if save:
        guard.saved(step)
        guard.save_every_seconds = 0.0  # one time-based save only
      decisions.append([step, save, stop])
      if stop:
        break
  distributed.sync("stop_worker_done")
  with open(out_path, "w") as f:
    json.dump({"decisions": decisions}, f)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
