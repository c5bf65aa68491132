"""The study's background compiles (dllm_rl.study.prefetch): claim order and failures (that
the arms load what was compiled for them, with the same results as without: on the quick
study of tests/study/test_quick_study.py)."""

import re
import threading


from dllm_rl.study import prefetch


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
