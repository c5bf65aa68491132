"""Threads and coroutines that orbax leaves behind when a checkpoint save or read fails.

Orbax (0.12) runs an async save's commit on threads (``_SignalingThread``) that signal one
another in-process. When the save's step folder cannot be made (no rights, a full disk), its
other commit threads wait for the "folder made" signal until orbax's coordination timeout
(300 s), and the process cannot exit before they end; cancelled, each still holds coroutines
it never ran, and each such coroutine warns "coroutine ... was never awaited" when collected.
A damaged step's read leaves the same warnings: orbax closes the restore's asyncio loop with
the other arrays' reads still scheduled.

`dllm_rl.infra.checkpoint.Checkpointer` uses this module to tell one save's commit threads
from any other save's (`save_mark`, `threads_of_save`), to release only those of a failed save
(`release_stalled_commits`), and to close the coroutines left behind (`close_released`,
`close_dropped_reads`). All of it reads orbax internals; with another orbax nothing is tracked
or released (a stalled save's threads wait out orbax's timeout).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import traceback
from collections.abc import Sequence


def save_mark() -> tuple[frozenset[threading.Thread], int] | None:
  """Taken as a save begins: orbax's live commit threads (``_SignalingThread``, orbax 0.12)
  and the newest operation id it has issued; None with another orbax (nothing is tracked,
  and a stalled save's threads wait out its timeout, as before)."""
  try:
    from orbax.checkpoint._src.futures import future, synchronization
    kind = future._SignalingThread
    newest = int(synchronization.OperationIdGenerator.get_current_operation_id())
  except (ImportError, AttributeError, TypeError, ValueError):
    return None
  return frozenset(t for t in threading.enumerate() if isinstance(t, kind)), newest


def threads_of_save(mark: tuple[frozenset[threading.Thread], int] | None
                     ) -> list[threading.Thread]:
  """Orbax's commit threads of the save begun at ``mark`` (`save_mark`), as it returns or
  fails: those started since, holding an operation id issued since. Orbax issues one id per
  save, process-wide, in its blocking part, which starts each thread of the save under it:
  another save's threads (in flight before it, or begun after it) hold another id. The
  blocking parts of two saves never overlap (orbax's signal contract is keyed by the current
  id: two Python threads saving at once would mix their signals already)."""
  if mark is None:
    return []
  from orbax.checkpoint._src.futures import future
  seen, newest = mark

  def issued_since(thread: threading.Thread) -> bool:
    try:
      return int(getattr(thread, "_operation_id", None)) > newest
    except (TypeError, ValueError):
      return False

  return [t for t in threading.enumerate()
          if isinstance(t, future._SignalingThread) and t not in seen and issued_since(t)]


def release_stalled_commits(threads: Sequence[threading.Thread]) -> None:
  """A save whose step folder could not be made (no rights, a full disk) leaves its other
  commit threads waiting for the "folder made" signal until orbax's coordination timeout
  (300 s), and the process cannot exit before they end: cancel each of ``threads`` (that
  save's, `threads_of_save`) still alive and give it its signals, under the save's own
  operation id, so that it ends at once without writing (`close_released` then closes the
  coroutines it never ran). Another save's threads, of this or another Checkpointer (or any
  other user of orbax in the process), are left alone. Only with orbax's in-process signals
  (a single process; orbax 0.12's ``_SignalingThread``): elsewhere other hosts wait on them
  too."""
  try:  # another orbax's internals: its threads wait out its timeout, as before
    from orbax.checkpoint._src.futures import future, signaling_client
    thread_type = future._SignalingThread
    in_process = isinstance(signaling_client.get_signaling_client(),
                            signaling_client.ThreadSafeKeyValueSignalingClient)
  except (ImportError, AttributeError):
    return
  if not in_process:
    return
  for thread in threads:
    if isinstance(thread, thread_type) and thread.is_alive():
      thread.cancel()
      future.set_signals(thread._receive_signals, operation_id=thread._operation_id)
      _RELEASED.append(thread)


_RELEASED: list[threading.Thread] = []  # commit threads `release_stalled_commits` cancelled


def close_released() -> None:
  """Closes the coroutines that the commit threads `release_stalled_commits` cancelled hold
  and never ran (each would warn "coroutine ... was never awaited" when collected, a dozen
  lines at exit), once each thread has ended."""
  while _RELEASED:
    thread = _RELEASED.pop()
    threading.Thread.join(thread, timeout=5.0)  # orbax's join re-raises its CancelledError
    if not thread.is_alive():  # ended without running its target (Thread.run drops a run one)
      _close_unstarted(getattr(thread, "_target", None))


def _close_unstarted(fn, depth: int = 0) -> None:
  """Closes the coroutines, not yet started, that callable ``fn`` holds in its closure (a few
  levels of wrapped callables deep), and the unstarted coroutines passed to them as
  arguments first (closing the outer one would drop those unclosed)."""
  for cell in getattr(fn, "__closure__", None) or ():
    try:
      value = cell.cell_contents
    except ValueError:  # an empty cell
      continue
    if inspect.iscoroutine(value):
      _close_coroutine(value, depth)
    elif callable(value) and depth < 4:
      _close_unstarted(value, depth + 1)


def _close_coroutine(coro, depth: int) -> None:
  """Closes ``coro`` if not yet started, and first the unstarted coroutines it holds as
  arguments (lists and tuples of them too), down to a few levels."""
  if inspect.getcoroutinestate(coro) != inspect.CORO_CREATED:
    return
  for arg in (coro.cr_frame.f_locals.values() if depth < 6 else ()):
    for item in (arg if isinstance(arg, (list, tuple)) else (arg,)):
      if inspect.iscoroutine(item):
        _close_coroutine(item, depth + 1)
  coro.close()


def close_dropped_reads(err: BaseException) -> None:
  """Closes the reads of a damaged step that orbax's event loop never started: orbax closes
  the loop of a failed restore with the other arrays' reads still scheduled (those spawned
  last), and each such coroutine, collected later, warned "coroutine ... was never awaited"
  (at a later save, or at exit). The loops are those whose ``run_until_complete`` ``err``
  (or its cause) passed through, once closed; their pending tasks can never run."""
  seen: set[int] = set()
  while err is not None and id(err) not in seen:
    seen.add(id(err))
    for frame, _ in traceback.walk_tb(err.__traceback__):
      loop = frame.f_locals.get("self") if frame.f_code.co_name == "run_until_complete" else None
      if isinstance(loop, asyncio.AbstractEventLoop) and loop.is_closed():
        for task in asyncio.all_tasks(loop):
          if inspect.iscoroutine(coro := task.get_coro()):
            _close_coroutine(coro, 0)  # only one never started
    err = err.__cause__ or err.__context__
