"""The RL step's traced hyperparameters (``StepHyper``): the optimizer's peak lr as an
``update`` argument gives optax.adamw's arithmetic (to rounding: XLA may fold constants that
an input keeps apart), runs that differ only in lr or the advantages' β lower to one program,
passing them traced gives the step of the same constants, and β as an input gives the
advantages of the same β compiled in, bit for bit."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dllm_rl.models import transformer as T
from dllm_rl.parallel.shard import init_train_state
from dllm_rl.rl import advantages as adv_lib
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


ADV = AdvantageConfig(beta=1.0, beta_start=0.0, beta_end=2.0)  # the steps' β unless told


def _setup(advantage, advantage_cfg=ADV, inner=2):
  graphdef, params = T.init_model(tiny_model(), jax.random.key(0))
  tx, schedule = make_optimizer(_opt_cfg("constant", lr=1e-2, warmup=0))
  cfg = rl_step_config("stabledrl", advantage, inner_steps=inner, advantage_cfg=advantage_cfg)
  state = init_train_state(params, tx, jax.random.key(1))
  return make_rl_step(graphdef, tx, schedule, cfg), state


# (β_start, β_end, β): the study's steprs and steprs_reversed arms and a calibrated β_end,
# each with a β for risk_sensitive
BETAS = ((0.0, 2.0, 1.0), (2.0, 0.0, 0.37), (0.0, 0.7316, 3.1))


def test_runs_that_differ_in_lr_or_beta_lower_to_one_program():
  step, state = _setup("steprs")
  batch = random_rollout_batch(0, 2, 4, 3, 8, vocab_size=12, unmask_period=4)
  key = jax.random.key(3)
  runs = [(1.2345e-2, ADV), (3e-3, ADV),
          (1e-3, AdvantageConfig(beta=4.5678, beta_start=1.2345, beta_end=-2.5678))]
  texts = {step.lower(state, batch, key, StepHyper.of(lr, a)).as_text() for lr, a in runs}
  assert len(texts) == 1
  for number in ("1.2345", "4.5678", "2.5678"):  # the lr and β are inputs, not constants
    assert number not in next(iter(texts))


def test_one_compiled_step_follows_the_beta_it_is_given():
  """StepRS runs that differ only in β share one compiled rl_step, and each gets steprs() at
  its own β; β 2 → 0 given as an input gives the advantages of the step that compiles it in
  (``hyper=None``), bit for bit."""
  step, state = _setup("steprs")
  batch = random_rollout_batch(2, 2, 4, 3, 8, vocab_size=12, unmask_period=4)
  # states 0, 1, 2, 3, 3, 3, 3, 3: β 0 → 2 and 2 → 0 give other |A| (and u = 1 is reached)
  batch = batch.replace(unmask_step_BGL=jnp.broadcast_to(jnp.minimum(jnp.arange(8), 3),
                                                         (2, 4, 8)))
  copy = lambda s: jax.tree.map(jnp.copy, s)
  progress_BGL = adv_lib.progress_from_unmask_step(batch.unmask_step_BGL, 4)
  adv_abs_mean = {}
  for b0, b1, _ in BETAS:
    _, m = step(copy(state), batch, jax.random.key(5),
                StepHyper.of(1e-2, AdvantageConfig(beta_start=b0, beta_end=b1)))
    want = jnp.abs(adv_lib.steprs(batch.rewards_BG, progress_BGL, b0, b1)).mean()
    assert float(m["adv_abs_mean"]) == pytest.approx(float(want), rel=1e-6)
    adv_abs_mean[b0, b1] = float(m["adv_abs_mean"])
  assert len(set(adv_abs_mean.values())) == len(BETAS)  # each β its own advantages
  assert step._cache_size() == 1  # from one program
  compiled_in, _ = _setup("steprs", AdvantageConfig(beta_start=2.0, beta_end=0.0))
  _, m = compiled_in(copy(state), batch, jax.random.key(5))
  assert float(m["adv_abs_mean"]) == adv_abs_mean[2.0, 0.0]


def _advantages(name, cfg, rewards_BG, steps_BGL, mask_BGL, betas=None):
  """Advantage ``name`` at 16 denoising states with ``cfg``, its β replaced by ``betas``
  (β, β_start, β_end) when given."""
  if betas is not None:
    cfg = dataclasses.replace(cfg, **dict(zip(("beta", "beta_start", "beta_end"), betas)))
  progress_BGL = adv_lib.progress_from_unmask_step(steps_BGL, 16)
  return adv_lib.ADVANTAGES.get(name)(rewards_BG, progress_BGL, mask_BGL, cfg)


@pytest.mark.parametrize("name, schedule", [("steprs", "linear"), ("steprs", "cosine"),
                                            ("steprs_mass_matched", "linear"),
                                            ("risk_sensitive", "linear")])
def test_beta_as_an_input_gives_the_advantages_of_beta_compiled_in(name, schedule):
  """Bit for bit: XLA folds a β compiled in into the arithmetic (x / β → x·(1/β); 1/(S − 1)
  of u = s/(S − 1) kept apart from β_end − β_start), and the advantages are written so that
  β as an input rounds the same (one run's last bit moves its whole trajectory)."""
  rng = np.random.default_rng(0)
  rewards_BG = np.concatenate([rng.random((2, 8)) < 0.4, rng.normal(size=(2, 8))])
  steps_BGL = rng.integers(-1, 16, (4, 8, 32)).astype(np.int32)
  mask_BGL = rng.random((4, 8, 32)) < 0.9
  args = (rewards_BG.astype(np.float32), steps_BGL, mask_BGL)
  run = jax.jit(_advantages, static_argnums=(0, 1))
  for b0, b1, beta in BETAS:
    cfg = AdvantageConfig(beta=beta, beta_start=b0, beta_end=b1, beta_schedule=schedule,
                          num_states=16)
    compiled_in = np.asarray(run(name, cfg, *args))
    given = np.asarray(run(name, AdvantageConfig(beta_schedule=schedule, num_states=16), *args,
                           np.float32([beta, b0, b1])))
    np.testing.assert_array_equal(given.view(np.uint32), compiled_in.view(np.uint32))


@pytest.mark.parametrize("advantage", ["centered", "steprs"])
def test_traced_lr_gives_the_constant_step(advantage):
  step, state = _setup(advantage)
  batch = random_rollout_batch(1, 2, 4, 3, 8, vocab_size=12, unmask_period=4)
  copy = lambda s: jax.tree.map(jnp.copy, s)
  s_const, m_const = step(copy(state), batch, jax.random.key(5))
  s_traced, m_traced = step(copy(state), batch, jax.random.key(5), StepHyper.of(1e-2, ADV))
  for a, b in zip(jax.tree.leaves(s_const.params), jax.tree.leaves(s_traced.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  assert float(m_traced["lr"]) == float(m_const["lr"]) == pytest.approx(1e-2)
  assert float(m_traced["loss"]) == pytest.approx(float(m_const["loss"]), rel=1e-6)
  # another lr: the metric follows it and the update grows with it
  s_lr, m_lr = step(copy(state), batch, jax.random.key(5), StepHyper.of(2e-2, ADV))
  assert float(m_lr["lr"]) == pytest.approx(2e-2)
  delta = lambda s: sum(float(jnp.abs(a - b).sum()) for a, b in
                        zip(jax.tree.leaves(s.params), jax.tree.leaves(state.params)))
  assert delta(s_lr) > 1.5 * delta(s_traced)
