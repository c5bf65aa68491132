"""A hard per-call timeout for any verifier (``TimedVerifier``, ``with_timeout``).

A verifier runs in a persistent worker process (a fresh interpreter, never a
fork of the JAX process) that the caller talks to over a socket pair with
length-prefixed pickles. A call that misses its deadline gets the worker
killed (SIGKILL, which also stops C code such as a huge big-integer power that
no Python signal can interrupt) and replaced; the replacement starts at once
so its start-up overlaps the caller's next work. math-verify's own timeouts
(signal.alarm) are not enough on their own: main thread only, whole seconds,
and blind to long C calls.
"""

from __future__ import annotations

import importlib
import os
import pickle
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from typing import Any, Callable, Sequence

from dllm_rl.tasks.base import VerifyResult, malformed

_WORKER_CODE = "from dllm_rl.tasks.timed_verifier import _worker_main; _worker_main()"
_HEADER = struct.Struct("!Q")


class VerifierError(RuntimeError):
  """The verifier raised in the worker (a bug, not a bad completion)."""


def timeout_result(seconds: float) -> VerifyResult:
  """Zero reward, reason "timeout"."""
  return malformed("timeout", seconds=seconds)


def _send(sock: socket.socket, obj: Any, deadline: float | None) -> None:
  data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
  sock.settimeout(None if deadline is None else max(deadline - time.monotonic(), 1e-6))
  sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
  buf = bytearray()
  while len(buf) < n:
    if deadline is not None:
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        raise TimeoutError
      sock.settimeout(remaining)
    else:
      sock.settimeout(None)
    chunk = sock.recv(min(n - len(buf), 1 << 20))
    if not chunk:
      raise EOFError("peer closed the connection")
    buf += chunk
  return bytes(buf)


def _recv(sock: socket.socket, deadline: float | None) -> Any:
  (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, deadline))
  return pickle.loads(_recv_exact(sock, size, deadline))


def _worker_main() -> None:
  """Worker loop: receive (fn, preload), import, then answer (args, kwargs) calls."""
  fd, max_memory_mb = int(sys.argv[1]), int(sys.argv[2])
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business.
  if max_memory_mb > 0:
    limit = max_memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
  sock = socket.socket(fileno=fd)
  try:
    fn, preload = _recv(sock, None)
    for name in preload:
      importlib.import_module(name)
    _send(sock, ("ready", None), None)
    while True:
      args, kwargs = _recv(sock, None)
      try:
        out = ("ok", fn(*args, **kwargs))
      except (MemoryError, RecursionError) as err:
        out = ("exhausted", type(err).__name__)
      except Exception as err:
        out = ("error", "".join(traceback.format_exception(err)))
      _send(sock, out, None)
  except EOFError:
    return  # the parent went away


def _child_pids(pid: int) -> list[int]:
  """The processes whose parent is ``pid`` (Linux /proc; [] where there is none)."""
  children = []
  try:
    entries = os.listdir("/proc")
  except OSError:
    return []
  for entry in entries:
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat", "rb") as fh:
        stat = fh.read()
    except OSError:  # gone since the listing
      continue
    fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
    if len(fields) > 1 and int(fields[1]) == pid:
      children.append(int(entry))
  return children


def _terminate(proc: subprocess.Popen, sock: socket.socket, scratch: str) -> None:
  """Kill the worker and what it started: the worker is stopped first (it can start no more),
  then each child is killed with its process group when it leads one (the code task runs each
  test case in a session of its own: killing only the worker would orphan them, and a case
  that sleeps, using no CPU, would outlive its CPU limit), then the worker; then its temporary
  folder ``scratch`` is removed (a worker killed mid-call leaves what it made there: the code
  task's per-case folders)."""
  try:
    _stop(proc, sock)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)


def _stop(proc: subprocess.Popen, sock: socket.socket) -> None:
  """:func:`_terminate`'s kills."""
  sock.close()
  if proc.poll() is None:
    try:
      os.kill(proc.pid, signal.SIGSTOP)
    except ProcessLookupError:
      pass
    for child in _child_pids(proc.pid):
      try:
        if os.getpgid(child) == child:
          os.killpg(child, signal.SIGKILL)
        else:
          os.kill(child, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
    proc.kill()
    proc.wait()


class _Worker:
  """One worker process; killed when closed, garbage-collected or at exit."""

  def __init__(self, fn: Callable, preload: Sequence[str], max_memory_mb: int):
    parent, child = socket.socketpair()
    # The worker's temporary files go in a folder of its own, removed with it (TMPDIR).
    self.scratch = tempfile.mkdtemp(prefix="dllm_rl_verifier_")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TMPDIR=self.scratch)
    try:
      self.proc = subprocess.Popen(
          [sys.executable, "-c", _WORKER_CODE, str(child.fileno()), str(max_memory_mb)],
          pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, env=env)
    except BaseException:
      shutil.rmtree(self.scratch, ignore_errors=True)
      parent.close()
      raise
    finally:
      child.close()
    self.sock = parent
    self.ready = False
    self._finalizer = weakref.finalize(self, _terminate, self.proc, self.sock, self.scratch)
    _send(self.sock, (fn, tuple(preload)), None)

  def wait_ready(self, timeout: float) -> None:
    if self.ready:
      return
    try:
      _recv(self.sock, time.monotonic() + timeout)
    except (TimeoutError, EOFError, OSError) as err:
      code = self.proc.poll()
      self.close()
      raise RuntimeError(f"verifier worker did not start within {timeout:g} s "
                         f"(exit code {code}; its stderr is above)") from err
    self.ready = True

  def close(self) -> None:
    self._finalizer()


class TimedVerifier:
  """``fn(*args, **kwargs)`` in a persistent worker process with a hard deadline.

  ``fn`` must be picklable by reference (a module-level function, or a
  ``functools.partial`` of one). A call that takes longer than ``seconds``
  returns ``timeout_result`` (reward 0, reason "timeout") and the worker is
  killed, with the processes it started, and restarted; a worker that dies or exhausts
  memory (address space capped at ``max_memory_mb``, 0 = no cap) or recursion gives reward 0
  with the reason; any other exception in ``fn`` is re-raised here as VerifierError.
  ``preload`` modules are imported before the first deadline starts, and
  worker start-up never counts against a deadline. Thread-safe (calls are
  serialised). ``timeouts`` and ``restarts`` count events.
  """

  def __init__(self, fn: Callable, seconds: float, *, preload: Sequence[str] = (),
               max_memory_mb: int = 4096, startup_timeout: float = 120.0):
    if not seconds > 0:
      raise ValueError(f"seconds must be > 0, got {seconds}")
    try:
      pickle.dumps(fn)
    except Exception as err:
      raise TypeError(f"verifier {fn!r} must be picklable by reference "
                      "(a module-level function or a functools.partial of one)") from err
    self.fn, self.seconds = fn, float(seconds)
    self.preload, self.max_memory_mb = tuple(preload), int(max_memory_mb)
    self.startup_timeout = float(startup_timeout)
    self.timeouts = self.restarts = 0
    self._worker: _Worker | None = None
    self._lock = threading.Lock()

  def start(self) -> "TimedVerifier":
    """Starts the worker now (otherwise the first call does); does not wait."""
    if self._worker is None:
      self._worker = _Worker(self.fn, self.preload, self.max_memory_mb)
    return self

  def _restart(self) -> None:
    if self._worker is not None:
      self._worker.close()
    self._worker = None
    self.restarts += 1
    self.start()

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    with self._lock:
      self.start()
      worker = self._worker
      try:
        worker.wait_ready(self.startup_timeout)
      except RuntimeError:
        self._worker = None
        raise
      deadline = time.monotonic() + self.seconds
      try:
        _send(worker.sock, (args, kwargs), deadline)
        status, value = _recv(worker.sock, deadline)
      except TimeoutError:
        self.timeouts += 1
        self._restart()
        return timeout_result(self.seconds)
      except (EOFError, OSError):
        code = worker.proc.poll()
        self._restart()
        return malformed("verifier worker died", exit_code=code)
    if status == "ok":
      return value
    if status == "exhausted":
      return malformed(f"verifier exhausted resources ({value})")
    raise VerifierError(f"verifier {getattr(self.fn, '__name__', self.fn)!s} raised "
                        f"in its worker process:\n{value}")

  def close(self) -> None:
    """Stops the worker (a later call starts a new one)."""
    with self._lock:
      if self._worker is not None:
        self._worker.close()
        self._worker = None

  def __enter__(self) -> "TimedVerifier":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.close()


def with_timeout(fn: Callable, seconds: float, **kwargs: Any) -> TimedVerifier:
  """``TimedVerifier(fn, seconds, **kwargs)``: ``fn`` with a hard per-call timeout."""
  return TimedVerifier(fn, seconds, **kwargs)
