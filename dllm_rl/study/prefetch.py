"""Compile the arms' RL programs ahead of the arm that trains, in a background thread.

A study's arms run one after another in one process, and most of an arm's wall time on a
small testbed is compiling its rl_step (its loss, clip and advantage options are compiled in);
on a GPU the first RL step of an arm spends ~15 s compiling while the device idles. The
:class:`Prefetcher` walks the arms in the order the study will run them and, for each,
compiles its rollout sampler and rl_step (dllm_rl.train.precompile) into the study's
persistent compilation cache (``DIR/jax_cache``). When the arm runs, its jit finds them
there and loads them. The programs are the same ones either way, so the results are too.

The study claims each arm (:meth:`Prefetcher.claim`) just before running it: an arm whose
compile is in progress is waited for (not compiled twice); one not yet started is dropped
from the queue and compiles in the arm as before. A failed background compile is logged and
costs nothing else: the arm compiles its programs itself.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from typing import Callable

import ml_collections

PENDING, RUNNING, DONE, CLAIMED = "pending", "running", "done", "claimed"


class Prefetcher:
  """Background compiles of ``jobs`` ((label, run config) pairs, in the order the study runs
  them) with a scratch ``workdir`` (created, and removed by :meth:`close`)."""

  def __init__(self, jobs: list[tuple[str, ml_collections.ConfigDict]], workdir: str,
               log: Callable[[str], None] = print,
               compile_fn: Callable[[ml_collections.ConfigDict, str], object] | None = None):
    self.jobs, self.workdir, self.log = list(jobs), workdir, log
    self.compile_fn = compile_fn or compile_arm
    self.state = {label: PENDING for label, _ in self.jobs}
    self.seconds: dict[str, float] = {}
    self.parts: dict[str, dict] = {}  # compile_fn's own timings (precompile_rl: per program)
    self._cv = threading.Condition()
    self._stop = False
    self._thread = threading.Thread(target=self._work, name="dllm_rl-prefetch", daemon=True)

  def start(self) -> "Prefetcher":
    self._thread.start()
    return self

  def _next(self):
    with self._cv:
      for label, config in self.jobs:
        if self._stop:
          return None
        if self.state[label] == PENDING:
          self.state[label] = RUNNING
          return label, config
      return None

  def _work(self) -> None:
    while (job := self._next()) is not None:
      label, config = job
      t0 = time.perf_counter()
      try:
        parts = self.compile_fn(config, self.workdir)
        self.seconds[label] = time.perf_counter() - t0
        if isinstance(parts, dict):
          self.parts[label] = parts
      except Exception as err:  # noqa: BLE001 - the arm compiles its own programs instead
        self.log(f"[study] background compile of {label} failed ({type(err).__name__}: {err});"
                 " the arm compiles its programs itself")
      finally:
        with self._cv:
          self.state[label] = DONE
          self._cv.notify_all()

  def claim(self, label: str) -> float:
    """Call just before running ``label``: waits for its compile when in progress, drops it
    when not started; returns the seconds waited."""
    t0 = time.perf_counter()
    with self._cv:
      if self.state.get(label) == PENDING:
        self.state[label] = CLAIMED
      while self.state.get(label) == RUNNING:
        self._cv.wait()
    return time.perf_counter() - t0

  def close(self, timeout: float | None = None) -> None:
    """Stop after the compile in progress (waited for, at most ``timeout`` seconds: a compile
    cannot be interrupted, and the interpreter should not exit under it) and remove the
    scratch workdir."""
    with self._cv:
      self._stop = True
    if self._thread.is_alive():
      self._thread.join(timeout)
    shutil.rmtree(self.workdir, ignore_errors=True)
    if self.seconds:
      self.log(f"[study] compiled {len(self.seconds)} arm(s)' RL programs in the background"
               f" ({sum(self.seconds.values()):.0f} s: "
               + ", ".join(f"{k} {v:.0f} s{self._detail(k)}" for k, v in self.seconds.items())
               + ")")

  def _detail(self, label: str) -> str:
    """`` (sampler 9 s, step 12 s)`` from compile_fn's per-program seconds, or ``""``."""
    parts = {k.removesuffix("_seconds"): v for k, v in self.parts.get(label, {}).items()
             if k.endswith("_seconds") and isinstance(v, (int, float))}
    return (" (" + ", ".join(f"{k} {v:.0f} s" for k, v in parts.items()) + ")") if parts else ""


def compile_arm(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """The RL programs of the run ``config`` (dllm_rl.train.precompile.precompile_rl), with
  ``workdir`` as its scratch directory."""
  from dllm_rl.train.context import build_context
  from dllm_rl.train.precompile import precompile_rl
  return precompile_rl(build_context(config, workdir))


def scratch_dir(study_dir: str) -> str:
  """The prefetcher's scratch workdir in the study directory."""
  return os.path.join(study_dir, ".prefetch")
