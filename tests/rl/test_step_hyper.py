"""The RL step's traced learning rate (``StepHyper``): the optimizer's peak lr as an
``update`` argument gives optax.adamw's arithmetic (to rounding: XLA may fold constants that
an input keeps apart), runs that differ only in lr lower to one program, and passing it
traced gives the step of the same constant."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dllm_rl.models import transformer as T
from dllm_rl.parallel.shard import init_train_state
from dllm_rl.rl.advantages import AdvantageConfig
from dllm_rl.rl.step import StepHyper, make_rl_step
from dllm_rl.train.optim import learning_rate_schedule, make_optimizer
from tests.helpers import random_rollout_batch, rl_step_config, tiny_model


def _opt_cfg(kind="cosine", lr=2e-4, warmup=5):
  return types.SimpleNamespace(lr=lr, steps=30, warmup_steps=warmup, schedule=kind, b1=0.9, b2=0.99,
                               weight_decay=0.01, grad_clip=1.0)


@pytest.mark.parametrize("kind", ["constant", "cosine", "linear"])
def test_peak_lr_argument_matches_optax_adamw(kind):
  cfg = _opt_cfg(kind)
  tx, schedule = make_optimizer(cfg)
  reference = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
      learning_rate_schedule(cfg.lr, cfg.steps, cfg.warmup_steps, kind), b1=0.9, b2=0.99,
      weight_decay=0.01))
  p0 = {"w": jax.random.normal(jax.random.key(0), (4, 6))}

  @jax.jit
  def run(lr):
    def one(carry, i):
      p, s, p_ref, s_ref = carry
      g = {"w": jax.random.normal(jax.random.fold_in(jax.random.key(1), i), (4, 6))}
      u, s = tx.update(g, s, p, lr=lr)
      u_ref, s_ref = reference.update(g, s_ref, p_ref)
      return (optax.apply_updates(p, u), s, optax.apply_updates(p_ref, u_ref), s_ref), None
    (p, _, p_ref, _), _ = jax.lax.scan(one, (p0, tx.init(p0), p0, reference.init(p0)),
                                       jnp.arange(cfg.steps))
    return p["w"], p_ref["w"]

  w, w_ref = run(jnp.float32(cfg.lr))
  np.testing.assert_allclose(np.asarray(w), np.asarray(w_ref), rtol=1e-6, atol=1e-7)
  w_other, _ = run(jnp.float32(cfg.lr * 3))
  assert not np.array_equal(np.asarray(w_other), np.asarray(w_ref))  # the argument is used
  for count in (0, 3, 5, 17, 29):
    assert float(schedule(count)) == float(schedule(jnp.int32(count), jnp.float32(cfg.lr)))
  assert float(schedule(4, 3 * cfg.lr)) == pytest.approx(3 * float(schedule(4)), rel=1e-6)


def test_a_decay_floor_is_hfs_cosine_with_min_lr():
  """``min_lr_ratio`` r: cosine lr(u) = r·lr + (1 − r)·lr·½(1 + cos πu) after the warm-up
  (transformers' ``cosine_with_min_lr``, ``min_lr_rate`` r, DiffuCoder's 0.1); linear to r·lr;
  the end value r·lr, the peak lr. Through ``make_optimizer`` too (a section without the key:
  no floor)."""
  lr, steps, warm, r = 1e-6, 40, 4, 0.1
  cos = learning_rate_schedule(lr, steps, warm, "cosine", r)
  for t in (4, 10, 22, 39, 40):
    u = (t - warm) / (steps - warm)
    assert float(cos(t)) == pytest.approx(r * lr + (1 - r) * lr * 0.5 * (1 + np.cos(np.pi * u)),
                                          rel=1e-5)
  lin = learning_rate_schedule(lr, steps, warm, "linear", r)
  assert float(lin(warm)) == pytest.approx(lr) and float(lin(steps)) == pytest.approx(r * lr)
  assert float(lin(22)) == pytest.approx(lr - (1 - r) * lr / 2, rel=1e-5)
  _, schedule = make_optimizer(types.SimpleNamespace(**{**vars(_opt_cfg("cosine", lr, warm)),
                                                       "steps": steps, "min_lr_ratio": r}))
  assert float(schedule(steps)) == pytest.approx(r * lr)
  assert float(make_optimizer(_opt_cfg("cosine", lr, warm))[1](30)) == pytest.approx(0.0)


def _setup(advantage, inner=2):
  graphdef, params = T.init_model(tiny_model(), jax.random.key(0))
  tx, schedule = make_optimizer(_opt_cfg("constant", lr=1e-2, warmup=0))
  cfg = rl_step_config("stabledrl", advantage, inner_steps=inner,
                       advantage_cfg=AdvantageConfig(beta=1.0, beta_start=0.0, beta_end=2.0))
  state = init_train_state(params, tx, jax.random.key(1))
  return make_rl_step(graphdef, tx, schedule, cfg), state


def test_runs_that_differ_in_lr_lower_to_one_program():
  step, state = _setup("steprs")
  batch = random_rollout_batch(0, 2, 4, 3, 8, vocab_size=12, unmask_period=4)
  key = jax.random.key(3)
  texts = {step.lower(state, batch, key, StepHyper.of(lr)).as_text()
           for lr in (1.2345e-2, 3e-3, 1e-3)}
  assert len(texts) == 1
  assert "1.2345" not in next(iter(texts))  # the lr is an input, not a constant


@pytest.mark.parametrize("advantage", ["centered", "steprs"])
def test_traced_lr_gives_the_constant_step(advantage):
  step, state = _setup(advantage)
  batch = random_rollout_batch(1, 2, 4, 3, 8, vocab_size=12, unmask_period=4)
  copy = lambda s: jax.tree.map(jnp.copy, s)
  s_const, m_const = step(copy(state), batch, jax.random.key(5))
  s_traced, m_traced = step(copy(state), batch, jax.random.key(5), StepHyper.of(1e-2))
  for a, b in zip(jax.tree.leaves(s_const.params), jax.tree.leaves(s_traced.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  assert float(m_traced["lr"]) == float(m_const["lr"]) == pytest.approx(1e-2)
  assert float(m_traced["loss"]) == pytest.approx(float(m_const["loss"]), rel=1e-6)
  # another lr: the metric follows it and the update grows with it
  s_lr, m_lr = step(copy(state), batch, jax.random.key(5), StepHyper.of(2e-2))
  assert float(m_lr["lr"]) == pytest.approx(2e-2)
  delta = lambda s: sum(float(jnp.abs(a - b).sum()) for a, b in
                        zip(jax.tree.leaves(s.params), jax.tree.leaves(state.params)))
  assert delta(s_lr) > 1.5 * delta(s_traced)
