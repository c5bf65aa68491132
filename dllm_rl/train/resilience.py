"""Preemption, time-based checkpoints and non-finite steps: what the SFT and RL loops ask
after every step.

Signals. :func:`handle_signals` (installed by ``dllm_rl.train.modes.run`` around the whole
run) turns the first SIGTERM or SIGINT into a *stop request*: the loop finishes the step in
progress, saves a checkpoint at that step, flushes metrics and TensorBoard and raises
:class:`Preempted`; ``dllm_rl.main`` then exits with status :data:`EXIT_PREEMPTED` (75,
``EX_TEMPFAIL``: "rerun to resume"). A second signal exits at once with status 128 + signal number
(143 for SIGTERM, 130 for SIGINT), without saving. The time to stop is bounded by one step plus one
checkpoint write.

Multi-host. All processes must save the same step. After every step :meth:`StepGuard.poll`
combines, across processes, (a) a signal received by any process, (b) JAX's preemption sync
point (``multihost_utils.reached_preemption_sync_point``: the coordination service's
preemption notice, e.g. a Cloud TPU maintenance event) and (c) a time-based save that is due
on any process, with one all-gather of two flags; every process then takes the same
decision at the same step. With one process no collective runs.

Non-finite updates are skipped inside the optimiser (``train.optim.skip_nonfinite``); the loop
reads its counters: ``skipped_steps`` is logged with the metrics, and
``train.max_consecutive_nonfinite`` skipped updates in a row raise :class:`NonFiniteError`
naming the step (no checkpoint is written for it: the newest one is the last good state).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

import jax
import numpy as np

from dllm_rl.parallel.distributed import agree_any
from dllm_rl.train.optim import skip_counters

EXIT_PREEMPTED = 75  # sysexits.h EX_TEMPFAIL: temporary failure, rerun to resume
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: list[int] = []  # signal numbers received while handle_signals is active
_depth = [0]  # nesting of handle_signals (a study's arms run inside the study's)
_saves = [True]  # whether the run acts on a stop request after a step (False: mode=eval)


class Preempted(Exception):
  """Raised by a loop after it saved a checkpoint at ``step`` because a stop was requested
  (``message``: the loop's own account of what was saved, e.g. a study's finished arms)."""

  def __init__(self, phase: str, step: int, message: str | None = None):
    self.phase, self.step = phase, step
    super().__init__(message or f"stopped on request after {phase} step {step} (checkpoint"
                     " saved); rerun the same command to resume")


class NonFiniteError(RuntimeError):
  """Too many consecutive non-finite updates; the message names the phase and step."""


def _handler(signum, frame):
  del frame
  if _received:  # second signal: exit now, no cleanup
    os._exit(128 + signum)
  _received.append(signum)
  name = signal.Signals(signum).name
  if not _saves[0]:  # no step, nothing to save: stop now (main thread, between bytecodes)
    raise _eval_stopped(signum)
  print(f"[preemption] received {name}: finishing the current step, "
        "then saving a checkpoint and exiting (send it again to exit at once)",
        file=sys.stderr, flush=True)


def _eval_stopped(signum: int) -> Preempted:
  """The Preempted of a ``mode=eval`` run that received signal ``signum``."""
  return Preempted("eval", 0, f"received {signal.Signals(signum).name} during mode=eval, which"
                   " saves nothing: stopped; rerun the same command to evaluate again")


def raise_if_eval_stopped() -> None:
  """``mode=eval`` (``handle_signals(saves=False)``): raise :class:`Preempted` for a signal
  already received. The handler raises it at once, but code that catches every Exception
  loses it when the signal lands there (JAX reading its persistent compilation cache turns it
  into a warning and goes on); the evaluation calls this between its sampler batches.
  A no-op in training, which acts on a stop request after its step."""
  if _received and not _saves[0]:
    raise _eval_stopped(_received[0])


@contextlib.contextmanager
def handle_signals(saves: bool = True):
  """Install the SIGTERM/SIGINT stop-request handlers for the duration (main thread only).
  ``saves`` False (``mode=eval``: no step to finish, no checkpoint to write): the first
  signal raises :class:`Preempted` at once, which ``dllm_rl.main`` turns into status 75.

  Nested uses keep the outermost's handlers and its received signals: a run inside a loop of
  runs (the study's arms) that ends without acting on a stop request (it came during the
  final evaluation) leaves it for the outer loop, which stops before its next run."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  if _depth[0]:
    _depth[0] += 1
    try:
      yield
    finally:
      _depth[0] -= 1
    return
  previous = {s: signal.getsignal(s) for s in _SIGNALS}
  _received.clear()
  _saves[0] = saves
  for s in _SIGNALS:
    signal.signal(s, _handler)
  _depth[0] = 1
  try:
    yield
  finally:
    _depth[0] = 0
    _saves[0] = True
    for s, h in previous.items():
      signal.signal(s, h)
    _received.clear()


def stop_requested() -> bool:
  """Whether this process received a stop signal (not agreed across processes)."""
  return bool(_received)


def stop_agreed() -> bool:
  """Whether any process received a stop signal (every process calls it at the same point,
  e.g. between two phases; with one process no collective runs)."""
  return bool(agree_any(np.array([stop_requested()]))[0])


def _preemption_notice(step: int) -> bool:
  from jax.experimental import multihost_utils
  try:
    return bool(multihost_utils.reached_preemption_sync_point(step))
  except RuntimeError:  # preemption service not enabled
    return False


class StepGuard:
  """Per-phase decisions after each step: save (step- or time-based), stop, non-finite."""

  def __init__(self, phase: str, ckpt, *, save_every: int, save_every_seconds: float,
               max_consecutive_nonfinite: int):
    self.phase = phase
    self.ckpt = ckpt
    self.save_every = save_every
    self.save_every_seconds = save_every_seconds
    self.max_consecutive_nonfinite = max_consecutive_nonfinite
    self._last_save = time.monotonic()
    self._writing: int | None = None  # the step of an asynchronous save not yet waited for

  @classmethod
  def from_config(cls, phase: str, ckpt, config) -> "StepGuard":
    return cls(phase, ckpt, save_every=config.checkpoint.save_every,
               save_every_seconds=float(config.checkpoint.save_every_seconds),
               max_consecutive_nonfinite=config.train.max_consecutive_nonfinite)

  def poll(self, step: int) -> tuple[bool, bool]:
    """(save, stop) after ``step``, identical on every process.

    An asynchronous save overlaps one step only: the first poll after it waits until it is
    committed, so a ``kill -9`` never loses more than the save interval."""
    if self._writing is not None and step > self._writing and self.ckpt is not None:
      self.ckpt.wait()
      self._writing = None
    timed = (self.save_every_seconds > 0
             and time.monotonic() - self._last_save >= self.save_every_seconds)
    stop = stop_requested()
    if jax.process_count() > 1:
      stop = stop or _preemption_notice(step)
      stop, timed = agree_any(np.array([stop, timed]))
    save = bool(stop or timed or step % self.save_every == 0)
    return save, bool(stop)

  def saved(self, step: int) -> None:
    """Restart the time-based save clock (call after each checkpoint save of ``step``)."""
    self._last_save = time.monotonic()
    self._writing = step

  def skipped(self, opt_state, step: int) -> int:
    """Total skipped (non-finite) updates of the phase; after ``max_consecutive_nonfinite`` in
    a row, waits for pending checkpoint writes and raises NonFiniteError."""
    consecutive, total = skip_counters(opt_state)
    if consecutive >= self.max_consecutive_nonfinite:
      self.ckpt.wait()
      last_checkpoint = self.ckpt.latest_step()
      self.ckpt.close()
      kept = (f"the newest checkpoint (step {last_checkpoint}) is the last good state"
              if last_checkpoint is not None else "no checkpoint of this phase was written")
      raise NonFiniteError(
          f"{self.phase} step {step}: {consecutive} consecutive updates with a non-finite loss or"
          f" gradient norm (train.max_consecutive_nonfinite={self.max_consecutive_nonfinite});"
          f" stopping, {kept}")
    return total


def window_to_meta(window: list) -> list[dict]:
  """The metrics of steps not yet logged, as JSON floats (saved in the checkpoint so that a
  resumed run logs the same window means as an uninterrupted one)."""
  return [{k: float(v) for k, v in m.items()} for m in jax.device_get(window)]
