"""One process of the 2-process ``dllm_rl.train.modes.run`` tests (tests/test_multiprocess_run.py).

    python tests/multiprocess/run_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT.json

Reads ``run.json`` in its working directory (``{"workdir", "mode", "overrides"}``), runs that
mode of the shrunk embedded default (tests/helpers.tiny_run_config, then the overrides) with
``jax.distributed`` over every process and writes ``{"error": the ConfigError or null,
"summary": the run's summary or null}`` to OUT.json.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from dllm_rl.errors import ConfigError  # noqa: E402  (after the repo is on sys.path)
from dllm_rl.train import modes  # noqa: E402
from tests.helpers import tiny_run_config  # noqa: E402


def main(coordinator: str, num_processes: int, process_id: int, out_path: str) -> None:
  with open("run.json") as f:
    spec = json.load(f)
  config = tiny_run_config(spec["mode"], {
      **spec["overrides"], "mesh.data": -1, "distributed.initialize": "explicit",
      "distributed.coordinator_address": coordinator,
      "distributed.num_processes": num_processes, "distributed.process_id": process_id})
  out = {"error": None, "summary": None}
  try:
    out["summary"] = modes.run(config, spec["workdir"])
  except ConfigError as err:
    out["error"] = str(err)
  with open(out_path, "w") as f:
    json.dump(out, f, default=str)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
