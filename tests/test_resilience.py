"""Unit tests of the preemption / fault machinery (issue 11): the non-finite skip in the
optimiser, the stop/save decisions, signal handling and the DLLM_FAULT hooks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dllm_rl.infra import faults
from dllm_rl.train import resilience
from dllm_rl.train.optim import SkipNonFiniteState, make_optimizer, skip_counters, skip_nonfinite

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _section(**kw):
  base = dict(lr=1e-2, steps=10, warmup_steps=0, schedule="constant", b1=0.9, b2=0.99,
              weight_decay=0.0, grad_clip=1.0)
  return types.SimpleNamespace(**{**base, **kw})


def test_skip_nonfinite_leaves_params_and_moments_unchanged():
  opt, _ = make_optimizer(_section())
  params = {"w": jnp.arange(4.0), "b": jnp.ones(())}
  state = opt.init(params)
  assert isinstance(state, SkipNonFiniteState)
  good = {"w": jnp.full(4, 0.5), "b": jnp.ones(())}
  upd, state = opt.update(good, state, params)
  params = optax.apply_updates(params, upd)
  for bad_value in (jnp.nan, jnp.inf):
    bad = {"w": good["w"].at[2].set(bad_value), "b": jnp.ones(())}
    upd2, state2 = opt.update(bad, state, params)
    assert all(float(jnp.abs(u).max()) == 0.0 for u in jax.tree.leaves(upd2))
    for x, y in zip(jax.tree.leaves(state2.inner), jax.tree.leaves(state.inner)):
      np.testing.assert_array_equal(x, y)
  assert skip_counters(state2) == (1, 1)
  _, state3 = opt.update(bad, state2, params)
  assert skip_counters(state3) == (2, 2)
  _, state4 = opt.update(good, state3, params)
  assert skip_counters(state4) == (0, 2)  # a good update resets the run, not the total


def test_skip_nonfinite_is_exact_on_finite_updates():
  inner = optax.adamw(1e-2)
  wrapped = skip_nonfinite(inner)
  params = {"w": jnp.linspace(-1.0, 1.0, 8)}
  grads = {"w": jnp.sin(jnp.arange(8.0))}
  u1, _ = inner.update(grads, inner.init(params), params)
  u2, _ = jax.jit(wrapped.update)(grads, wrapped.init(params), params)
  np.testing.assert_array_equal(u1["w"], u2["w"])


class _Ckpt:
  def __init__(self, latest):
    self.latest, self.closed = latest, False

  def wait(self):
    pass

  def latest_step(self):
    return self.latest

  def close(self):
    self.closed = True


def _guard(ckpt=None, **kw):
  base = dict(save_every=5, save_every_seconds=0.0, max_consecutive_nonfinite=3)
  return resilience.StepGuard("rl", ckpt or _Ckpt(None), **{**base, **kw})


def test_guard_saves_by_step_and_by_time():
  g = _guard()
  assert g.poll(5) == (True, False) and g.poll(6) == (False, False)
  g = _guard(save_every=1000, save_every_seconds=0.05)
  assert g.poll(1) == (False, False)
  time.sleep(0.06)
  assert g.poll(2) == (True, False)
  g.saved(2)
  assert g.poll(3) == (False, False)


def test_an_async_save_overlaps_one_step_only():
  class Ckpt(_Ckpt):
    waits = 0

    def wait(self):
      self.waits += 1
  ckpt = Ckpt(None)
  g = _guard(ckpt)
  g.saved(5)
  g.poll(5)
  assert ckpt.waits == 0  # the write overlaps the next step
  g.poll(6)
  assert ckpt.waits == 1  # then it is committed before anything else is risked
  g.poll(7)
  assert ckpt.waits == 1


def test_guard_stops_naming_the_step_after_consecutive_nonfinite():
  ckpt = _Ckpt(5)
  g = _guard(ckpt)
  state = SkipNonFiniteState((), jnp.int32(2), jnp.int32(4))
  assert g.skipped(state, 7) == 4 and not ckpt.closed
  state = SkipNonFiniteState((), jnp.int32(3), jnp.int32(5))
  with pytest.raises(resilience.NonFiniteError,
                     match=r"rl step 8: 3 consecutive .*newest checkpoint \(step 5\)"):
    g.skipped(state, 8)
  assert ckpt.closed  # pending writes finished: the last good checkpoint is on disk


def test_first_signal_requests_a_stop_second_exits_at_once():
  with resilience.handle_signals():
    assert not resilience.stop_requested()
    os.kill(os.getpid(), signal.SIGTERM)
    assert resilience.stop_requested()
    assert _guard().poll(3) == (True, True)  # stop implies a save at this step
  assert not resilience.stop_requested()
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
  child = ("import os, signal, time\n"
           "from dllm_rl.train import resilience\n"
           "with resilience.handle_signals():\n"
           "  os.kill(os.getpid(), signal.SIGTERM)\n"
           "  os.kill(os.getpid(), signal.SIGTERM)\n"
           "  time.sleep(30)\n")
  proc = subprocess.run([sys.executable, "-c", child], cwd=ROOT, capture_output=True, text=True,
                        timeout=60, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 128 + signal.SIGTERM, proc.stderr  # at once, not after the sleep
  assert "received SIGTERM" in proc.stderr


def test_a_signal_during_mode_eval_stops_it_at_once(tmp_path, monkeypatch):
  """mode=eval has no step to finish and nothing to save: the first SIGTERM stops it (as
  Preempted: status 75 in dllm_rl.main), instead of being noted and ignored until the whole
  evaluation has run; the handlers are restored after."""
  from dllm_rl.train import eval_mode, modes
  from tests.helpers import tiny_run_config

  finished = []

  def evaluation(ctx):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # a long evaluation
    finished.append(True)  # not reached when the signal stops it at once
    return {}

  monkeypatch.setattr(eval_mode, "run_eval", evaluation)
  with pytest.raises(resilience.Preempted, match=r"SIGTERM during mode=eval, which saves"
                                                 r" nothing: stopped; rerun"):
    modes.run(tiny_run_config("eval"), str(tmp_path))
  assert not finished
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
  with resilience.handle_signals():  # a training run's handlers still only request a stop
    os.kill(os.getpid(), signal.SIGTERM)
    assert resilience.stop_requested()


def test_a_mode_eval_signal_swallowed_where_it_landed_stops_at_the_next_batch():
  """The eval handler's Preempted is lost when the signal lands in code that catches every
  Exception (JAX reading its persistent compilation cache warns and goes on): the sampler
  loop raises it before its next batch, instead of evaluating to the end with status 0.
  In training the same loop runs on (a stop request is acted on after the step)."""
  from dllm_rl.train import evaluation
  calls = []

  def sample_fn(params, prompt_BP, valid_BP, key):
    calls.append(len(calls))
    if len(calls) == 1:
      try:  # the signal lands in a library's catch-all
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
      except Exception:  # noqa: BLE001
        pass
    return types.SimpleNamespace(completion_BL=np.zeros((2, 3), np.int32))

  prompts, valid = np.zeros((6, 4), np.int32), np.ones((6, 4), bool)
  with resilience.handle_signals(saves=False):
    with pytest.raises(resilience.Preempted, match="SIGTERM during mode=eval"):
      evaluation.generate(sample_fn, None, prompts, valid, jax.random.key(0), 2)
  assert calls == [0]
  calls.clear()
  with resilience.handle_signals():
    out = evaluation.generate(sample_fn, None, prompts, valid, jax.random.key(0), 2)
  assert out.shape == (6, 3) and calls == [0, 1, 2]


def test_a_signal_during_the_sft_test_evaluation_stops_a_pipeline_before_rl(tmp_path,
                                                                          monkeypatch):
  """A pipeline whose SFT phase finished (its test evaluation ran on after the signal) stops
  there, as Preempted, instead of starting RL (its evaluation, compiles and a step) first."""
  from dllm_rl.train import modes, rl_loop, sft_loop
  from tests.helpers import tiny_run_config

  def sft(ctx):
    os.kill(os.getpid(), signal.SIGTERM)  # during the test evaluation
    return {"sft_steps": 20, "sft_accuracy": 0.5}

  def rl(ctx):
    raise AssertionError("RL started after a stop request")

  monkeypatch.setattr(sft_loop, "run_sft", sft)
  monkeypatch.setattr(rl_loop, "run_rl", rl)
  with pytest.raises(resilience.Preempted, match=r"after the SFT phase .*rerun the same"
                                                 r" command to start RL"):
    modes.run(tiny_run_config("pipeline"), str(tmp_path))
  assert not (tmp_path / "summary.json").exists()


def test_agree_any_single_process_is_identity():
  np.testing.assert_array_equal(resilience.agree_any(np.array([True, False])), [True, False])


def test_fault_spec_parsing_and_hooks(monkeypatch):
  assert faults.parse("sigterm@rollout:3; nan@reward:5") == {("rollout", 3): "sigterm",
                                                            ("reward", 5): "nan"}
  for bad in ("sigterm@rollout", "boom@rollout:1", "nan@nowhere:1"):
    with pytest.raises(ValueError, match="DLLM_FAULT"):
      faults.parse(bad)
  monkeypatch.delenv(faults.ENV, raising=False)
  rewards = np.ones((2, 3), np.float32)
  assert faults.at("reward", 5, rewards) is rewards  # unset: a no-op
  monkeypatch.setenv(faults.ENV, "nan@reward:5")
  assert faults.at("reward", 4, rewards) is rewards
  assert np.isnan(faults.at("reward", 5, rewards)).all()


def test_fault_benchmark_compares_records_and_summary_without_timings(tmp_path):
  # Two runs of one trajectory differ in wall time, throughput, MFU and memory only: the
  # benchmark must count them equal (else every resume reads as lost lines).
  import json as _json

  from dllm_rl.benchmarks import faults as bench
  same = {"phase": "rl", "step": 2, "loss": 0.5, "skipped_steps": 0}
  for name, seconds in (("a", 0.1), ("b", 0.3)):
    run = tmp_path / name
    run.mkdir()
    timed = {"time": seconds, "step_seconds": seconds, "tokens_per_second": 1 / seconds,
             "rollout_seconds": seconds, "update_seconds": seconds, "mfu": seconds,
             "memory_gib": seconds, "peak_memory_gib": seconds}
    (run / "metrics.jsonl").write_text(_json.dumps({**same, **timed}) + "\n")
    (run / "summary.json").write_text(_json.dumps(
        {"rl_accuracy": 0.25, "rl_step_seconds": seconds, "rl_plot": str(run / "p.png")}))
  a, b = bench._records(str(tmp_path / "a")), bench._records(str(tmp_path / "b"))
  assert a == b == [same]
  assert bench._missing(a, b) == 0
  assert (bench._untimed(str(tmp_path / "a" / "summary.json"))
          == bench._untimed(str(tmp_path / "b" / "summary.json")) == {"rl_accuracy": 0.25})


def test_fault_benchmark_help_names_its_command_and_the_config_overrides(capsys):
  from dllm_rl.benchmarks import faults as bench
  with pytest.raises(SystemExit) as exit_:
    bench.main(["--help"])
  assert exit_.value.code == 0
  out = " ".join(capsys.readouterr().out.split())
  assert out.startswith("usage: python -m dllm_rl.benchmarks.faults")
  assert "--config.KEY=VALUE" in out and "--kinds 'sigterm rollout'" in out


@pytest.mark.slow
def test_two_processes_agree_on_the_save_and_stop_steps(tmp_path):
  import json as _json

  from tests.multiprocess import harness
  worker = os.path.join(harness.REPO, "tests", "multiprocess", "stop_worker.py")
  outs, _, codes, report = harness.run_workers(worker, tmp_path, out_suffix=".json", devices=1)
  assert codes == [0, 0], report
  decisions = [_json.loads(out.read_text())["decisions"] for out in outs]
  # process 0's time-based save at step 1 and process 1's SIGTERM at step 3, on both
  assert decisions[0] == decisions[1] == [[1, True, False], [2, False, False], [3, True, True]]
