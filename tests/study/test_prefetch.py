"""The study's background compiles (dllm_rl.study.prefetch): claim order, failures, and that
the arms load what was compiled for them, with the same results as without."""

import logging
import os
import re
import threading

import pytest

from dllm_rl.study import prefetch
from dllm_rl.study.studies import study
from tests.study.test_study import QUICK_ARMS, TINY


def test_claims_wait_for_a_compile_in_progress_and_drop_those_not_started(tmp_path):
  started, release, compiled, lines = threading.Event(), threading.Event(), [], []

  def fake_compile(config, workdir):
    compiled.append(config)
    if config == "a":
      started.set()
      assert release.wait(10)
      return {"sampler_seconds": 2.0, "step_seconds": 3.0}  # as precompile_rl's
    if config == "b":
      raise RuntimeError("no such program")

  pre = prefetch.Prefetcher([("a", "a"), ("b", "b"), ("c", "c")], str(tmp_path / "scratch"),
                            log=lines.append, compile_fn=fake_compile).start()
  assert started.wait(10)
  assert pre.claim("c") < 1.0  # not started: dropped at once, its arm compiles it
  assert pre.state["c"] == prefetch.CLAIMED
  threading.Timer(0.3, release.set).start()
  assert pre.claim("a") >= 0.2  # in progress: waited for, not compiled a second time
  assert pre.state["a"] == prefetch.DONE
  pre.claim("b")  # whatever b's compile did, claiming it returns once it is over
  pre.close()
  assert compiled == ["a", "b"]  # c was claimed before its turn
  assert pre.state == {"a": prefetch.DONE, "b": prefetch.DONE, "c": prefetch.CLAIMED}
  assert len(lines) == 2 and "background compile of b failed (RuntimeError: no such program)" \
      in lines[0] and "compiles its programs itself" in lines[0]
  assert lines[1].startswith("[study] compiled 1 arm(s)' RL programs in the background (")
  # the failed one is not counted; a's own per-program timings are named
  assert re.search(r"\(\d+ s: a \d+ s \(sampler 2 s, step 3 s\)\)$", lines[1]), lines[1]
  assert not (tmp_path / "scratch").exists()
  assert pre.claim("unknown") < 1.0  # an arm that was never queued


class _CacheLog(logging.Handler):
  """JAX's persistent-cache lines: (thread name, 'hit' / 'miss', cache key)."""

  def __init__(self):
    super().__init__(logging.DEBUG)
    self.events = []

  def emit(self, record):
    msg = record.getMessage()
    for marker, kind in (("Persistent compilation cache hit", "hit"),
                         ("PERSISTENT COMPILATION CACHE MISS", "miss")):
      if msg.startswith(marker):
        self.events.append((threading.current_thread().name, kind, msg.rsplit(" ", 1)[-1]))


@pytest.mark.slow
def test_arms_load_the_background_compiles_and_give_the_same_runs(tmp_path):
  """A study with background compiles, then the same study without them in another DIR over
  the same compilation cache (so it compiles little): the arm loaded every program the
  thread compiled, and both gave the same runs bit for bit."""
  runs, events, handler = {}, {}, _CacheLog()
  logger = logging.getLogger("jax._src.compiler")
  old_level = logger.level
  logger.setLevel(logging.DEBUG)
  logger.addHandler(handler)
  try:
    for on in (True, False):
      d = tmp_path / f"prefetch_{on}"
      out = study(["stability"], str(d), 1, True, TINY, str(d / "r.md"), "test", rl_steps=1,
                  eval_every=1, cache_dir=str(tmp_path / "jax_cache"),
                  arm_patterns=QUICK_ARMS[:1], prefetch=on)
      runs[on], events[on], handler.events = out["studies"][0]["runs"], handler.events, []
  finally:
    logger.removeHandler(handler)
    logger.setLevel(old_level)
  # the same programs either way: every step record and test result is bit-identical
  for a, b in zip(runs[True], runs[False], strict=True):
    assert a["arm"] == b["arm"] and a["steps"] == b["steps"] and a["final"] == b["final"]

  def keys(on, thread, kind):  # the mesh-wrapped programs (parallel.constraints.jit_sharded):
    # samplers, steps, evaluators; small helpers (e.g. the RNG's) are left out, as one
    # thread's compile of them serves the other from the process's in-memory cache
    return {key for t, k, key in events[on]
            if t == thread and k == kind and key.startswith("'jit_wrapped-")}

  background = keys(True, "dllm_rl-prefetch", "miss")
  assert not {t for t, _, _ in events[False]} - {"MainThread"}  # prefetch=False: no thread
  assert len(background) >= 2  # the rollout sampler and the rl_step, at least
  assert background <= keys(True, "MainThread", "hit")  # each was loaded by the arm
  assert not background & keys(True, "MainThread", "miss")  # ... not compiled again
  assert not os.path.exists(prefetch.scratch_dir(str(tmp_path / "prefetch_True")))
