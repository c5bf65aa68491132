"""The metrics lines dllm_rl.train.phases.run_phase writes, on a fake phase (no model): every
``log_every`` steps and, for the steps since the last line, at the phase's end or early stop;
which steps its per-step clock times."""

from __future__ import annotations

import types

import jax.numpy as jnp
import pytest
from flax import struct

from dllm_rl.infra.observability import read_metrics
from dllm_rl.train.phases import Phase, StepCost, run_phase
from tests.helpers import tiny_run_config


@struct.dataclass
class _Skips:
  consecutive: jnp.ndarray
  total: jnp.ndarray


@struct.dataclass
class _State:
  step: jnp.ndarray
  params: dict
  opt_state: _Skips


class _Counting(Phase):
  """Step s (1-based) logs ``value`` = s; stops early after ``stop_at`` steps (0 = never)."""

  name = "sft"
  postfix = ()
  panels = ("value",)
  steps, log_every, eval_every, stop_at = 7, 3, 0, 0

  def init_state(self):
    zero = jnp.zeros((), jnp.int32)
    return _State(step=zero, params={"w": jnp.zeros(2)}, opt_state=_Skips(zero, zero))

  def start(self, state, meta, resumed):
    return int(state.step)

  def step(self, state, step):
    state = state.replace(step=state.step + 1)
    self.stopped = step + 1 == self.stop_at
    return state, {"value": jnp.float32(step + 1)}, StepCost(tokens=1.0, flops=1.0)

  def meta(self):
    return {}

  def test(self, state):
    return dict.fromkeys(("accuracy", "sample_accuracy", "diversity", "distinct_correct",
                          "malformed_fraction"), 0.0)

  def summary(self, run):
    return {}, {}


@pytest.mark.parametrize("steps, stop_at, lines", [
    (7, 0, {3: 2.0, 6: 5.0, 7: 7.0}),   # 7 steps, log_every 3: the 7th step's own line
    (9, 5, {3: 2.0, 5: 4.5}),           # an early stop after step 5: steps 4-5
    (6, 0, {3: 2.0, 6: 5.0})])          # a multiple of log_every: no extra line
def test_the_steps_after_the_last_line_get_a_line_at_the_end(tmp_path, steps, stop_at, lines):
  config = tiny_run_config("sft", {"log.tensorboard": False, "checkpoint.async_save": False})
  ctx = types.SimpleNamespace(config=config, workdir=str(tmp_path), writers=(), mesh=None,
                              hf_checkpoint=None)
  phase_cls = type("Phase", (_Counting,), {"steps": steps, "stop_at": stop_at})
  run_phase(phase_cls, ctx)
  logged = [r for r in read_metrics(str(tmp_path), phase="sft") if "value" in r]
  assert {r["step"]: r["value"] for r in logged} == lines
  assert all(r["skipped_steps"] == 0 for r in logged)


def test_per_step_timing_leaves_out_the_first_step_and_the_steps_that_compile():
  """RL times each step; the first of a process and the first batch of each new prompt
  bucket width compile (StepCost.compiles), so neither counts in step_seconds / mfu."""
  from dllm_rl.train.phases import _StepClock
  from dllm_rl.train.throughput import StepTimer
  timer = StepTimer(num_devices=1, peak_flops=None)
  clock = _StepClock(timer, sync_every_step=True)
  state = types.SimpleNamespace(step=jnp.zeros(()))
  for compiles in (True, False, True, False, False):  # widths 8, 8, 16, 16, 8
    clock.start()
    clock.stop(state, StepCost(tokens=10.0, flops=1.0, compiles=compiles))
  assert timer.run_steps == 3 and timer.run_tokens == 30.0  # steps 2, 4 and 5
