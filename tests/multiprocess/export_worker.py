"""One process of the 2-process ``convert export --workdir`` test (tests/test_multiprocess_run.py).

    python tests/multiprocess/export_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT.json

Sets the DLLM_* variables a multi-process launch gives each process (coordinator, process
count, this process's id), runs ``python -m dllm_rl.convert`` in-process with the arguments
listed in ``convert.json`` of its working directory, and writes ``{"rc": its exit status,
"process_count": jax.process_count() after it, "stdout": what it printed}`` to OUT.json.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(coordinator: str, num_processes: int, process_id: int, out_path: str) -> None:
  os.environ.update(DLLM_COORDINATOR_ADDRESS=coordinator, DLLM_NUM_PROCESSES=str(num_processes),
                    DLLM_PROCESS_ID=str(process_id))
  import jax

  from dllm_rl import convert
  with open("convert.json") as f:
    argv = json.load(f)
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    rc = convert.main(argv)
  with open(out_path, "w") as f:
    json.dump({"rc": rc, "process_count": jax.process_count(), "stdout": printed.getvalue()}, f)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
