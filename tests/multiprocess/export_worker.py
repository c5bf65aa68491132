"""One process of the 2-process ``convert export --workdir`` test (tests/test_multiprocess_run.py).

    python tests/multiprocess/export_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT.json

Sets the DLLM_* variables a multi-process launch gives each process (coordinator, process
count, this process's id), runs ``python -m dllm_rl.convert`` in-process with the arguments
listed in ``convert.json`` of its working directory, and writes ``{"rc": its exit status,
"process_count": jax.process_count() after it, "stdout": what it printed}`` to OUT.json.
With ``file_size_limit.json`` there (``{"process": P, "bytes": N}``), process P may write no
file past N bytes (RLIMIT_FSIZE, as a full disk: a write past it fails with EFBIG).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(coordinator: str, num_processes: int, process_id: int, out_path: str) -> None:
  os.environ.update(DLLM_COORDINATOR_ADDRESS=coordinator, DLLM_NUM_PROCESSES=str(num_processes),
                    DLLM_PROCESS_ID=str(process_id))
  import jax

  from dllm_rl import convert
  with open("convert.json") as f:
    argv = json.load(f)
  if os.path.exists("file_size_limit.json"):
    with open("file_size_limit.json") as f:
      limit = json.load(f)
    if limit["process"] == process_id:
      signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an OSError, not the signal's exit
      resource.setrlimit(resource.RLIMIT_FSIZE, (limit["bytes"], limit["bytes"]))
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    rc = convert.main(argv)
  with open(out_path, "w") as f:
    json.dump({"rc": rc, "process_count": jax.process_count(), "stdout": printed.getvalue()}, f)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
