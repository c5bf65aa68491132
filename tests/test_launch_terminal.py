"""launch/tpu_pod.sh under a terminal (a pseudo-terminal): what Ctrl-C typed there does."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import time

import pytest

from tests.test_launch import TPU, kill_all, recording_tools, still_running

# util-linux's setsid -c: a new session whose controlling terminal is its stdin (the
# pseudo-terminal), started by subprocess's spawn, not by a fork of this multithreaded (JAX)
# process, which pty.fork would be.
SETSID = shutil.which("setsid")


def _read_until_exit(proc: subprocess.Popen, fd: int, timeout: float) -> tuple[int | None, str]:
  """(exit status of ``proc``, or None after ``timeout`` s; what it wrote to the terminal
  ``fd``), the terminal drained as it goes so the child never blocks on it, and after it
  exits: its last words (the trap's message just before ``exit 130``) may reach the terminal
  after the last read before the exit was seen, on a loaded machine."""
  out, status, deadline = b"", None, time.monotonic() + timeout
  while status is None and time.monotonic() < deadline:
    status = proc.poll()
    out += _drain(fd, 0.05 if status is None else 0.5)
  return status, out.decode(errors="replace")


def _drain(fd: int, wait: float) -> bytes:
  """What the terminal ``fd`` holds, waiting up to ``wait`` s for each piece; stops when it
  is quiet that long, or at its end (the last process holding it gone)."""
  out = b""
  while select.select([fd], [], [], wait)[0]:
    try:
      piece = os.read(fd, 4096)
    except OSError:  # EIO: the terminal's last process is gone and all it wrote was read
      break
    if not piece:
      break
    out += piece
  return out


@pytest.mark.skipif(SETSID is None, reason="no setsid (util-linux) to give bash a terminal")
def test_tpu_multislice_ctrl_c_typed_in_the_terminal_stops_every_slice(tmp_path):
  """Ctrl-C typed in the terminal goes to its foreground process group: the launcher's, while
  the slices run, so its trap stops every session and it exits 130. Before, the wait loop's
  `sleep 1` ran in the foreground under set -m, which gave it the terminal: Ctrl-C reached
  the sleep alone, bash exited 130 without the trap and every slice's session ran on."""
  pids = tmp_path / "pids"
  env = recording_tools(tmp_path, {"gcloud": f"""case "$*" in
  *ssh*) echo $$ >> '{pids}'; exec sleep 60 ;;
esac"""})
  env["DLLM_LOCAL_PYTHON"] = sys.executable
  bash = shutil.which("bash")
  argv = [bash, TPU, "--slices", "2", "--name", "ms", "--zone", "z", "--workdir", "gs://b/r",
          "--config", "configs/tiny_cpu.py"]
  fd, tty = os.openpty()
  proc = subprocess.Popen([SETSID, "-c", *argv], stdin=tty, stdout=tty, stderr=tty, env=env,
                          cwd=tmp_path)
  os.close(tty)
  started, status = [], None
  try:
    deadline = time.monotonic() + 20
    while status is None and len(started) < 2 and time.monotonic() < deadline:
      status, out = _read_until_exit(proc, fd, 0.05)
      started = pids.read_text().split() if pids.exists() else []
    assert status is None and len(started) == 2, (status, started)
    _read_until_exit(proc, fd, 0.3)  # the script waits in its loop now
    os.write(fd, b"\x03")  # Ctrl-C
    status, out = _read_until_exit(proc, fd, 10)
    assert status == 130 and "interrupted: stopping the slices' sessions" in out, (status, out)
    assert not still_running(started), started
  finally:
    kill_all(started)  # what the script left running, if it did
    if status is None:
      proc.kill()
      proc.wait()
    os.close(fd)
