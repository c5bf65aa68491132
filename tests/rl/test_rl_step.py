"""The jitted RL step: 2-step smoke test per loss, shared-mask ratio, KL, metrics."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dllm_rl.diffusion.estimators import EstimatorConfig
from dllm_rl.models import transformer as T
from dllm_rl.rl.advantages import AdvantageConfig
from dllm_rl.rl.losses import LOSSES, LossConfig
from dllm_rl.rl.step import RLStepConfig, RolloutBatch, completion_lengths, make_rl_step
from dllm_rl.train.sft_step import init_train_state

MASK, EOS = 2, 1
CFG = T.ModelConfig(vocab_size=12, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=8,
                    mlp_hidden=32)
B, G, P, L = 2, 4, 3, 8

ESTIMATOR_FOR = {"grpo_token": ("mean_field", EstimatorConfig(reduction="sum")),
                 "spg": ("spg_block", EstimatorConfig(num_samples=2, spg_block_len=4))}


def _batch(seed=0):
  k = jax.random.split(jax.random.key(seed), 3)
  rewards = jax.random.bernoulli(k[0], 0.5, (B, G)).astype(jnp.float32)
  return RolloutBatch(
      prompt_BP=jax.random.randint(k[1], (B, P), 3, 12), prompt_valid_BP=jnp.ones((B, P), bool),
      completion_BGL=jax.random.randint(k[2], (B, G, L), 3, 12),
      unmask_step_BGL=jnp.broadcast_to(jnp.arange(L) % 4, (B, G, L)),
      rewards_BG=rewards, correct_BG=rewards > 0)


def _step(loss, advantage="centered", kl_coef=0.0, antithetic=True, inner=2):
  name, est_cfg = ESTIMATOR_FOR.get(loss, ("elbo", EstimatorConfig(num_samples=1)))
  est_cfg = dataclasses.replace(est_cfg, antithetic=antithetic)
  cfg = RLStepConfig(loss=loss, advantage=advantage, estimator=name, estimator_cfg=est_cfg,
                     loss_cfg=LossConfig(), advantage_cfg=AdvantageConfig(), inner_steps=inner,
                     num_states=4, kl_coef=kl_coef, mask_id=MASK, eos_id=EOS)
  graphdef, params = T.init_model(CFG, jax.random.key(0))
  opt = optax.adam(1e-2)
  state = init_train_state(params, opt, jax.random.key(1))
  if kl_coef:
    state = state.replace(ref_params=jax.tree.map(jnp.copy, params))
  return make_rl_step(graphdef, opt, lambda s: 1e-2, cfg), state


@pytest.mark.parametrize("loss", LOSSES.names())
def test_two_rl_steps_per_loss(loss):
  step_fn, state = _step(loss)
  before = jax.tree.map(np.asarray, state.params)
  for i in range(2):
    state, metrics = step_fn(state, _batch(i), jax.random.key(10 + i))
    for k, v in metrics.items():
      assert np.isfinite(np.asarray(v)).all(), (loss, k)
  assert int(state.step) == 4  # 2 rollout batches × μ = 2 updates
  changed = [not np.allclose(a, np.asarray(b)) for a, b in
             zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(state.params))]
  assert any(changed)
  assert float(metrics["grad_norm"]) > 0
  for key in ("reward_mean", "accuracy", "ratio_mean", "ratio_max", "ratio_std", "clip_fraction",
              "bypass_fraction", "completion_length", "entropy", "grad_norm", "loss"):
    assert key in metrics


def test_ratio_is_one_before_the_first_update_with_shared_masks():
  step_fn, state = _step("stabledrl", antithetic=True)
  _, metrics = step_fn(state, _batch(), jax.random.key(5))
  assert abs(float(metrics["ratio_max_first"]) - 1.0) < 1e-5  # float rounding only
  step_fn, state = _step("stabledrl", antithetic=False)
  _, metrics = step_fn(state, _batch(), jax.random.key(5))
  assert float(metrics["ratio_max_first"]) > 1.01  # independent masks: ratio noise


def test_zero_advantages_leave_params_unchanged_with_sgd():
  """All-equal rewards → centered advantages 0 → the policy gradient is exactly 0."""
  name, est = "elbo", EstimatorConfig()
  cfg = RLStepConfig(loss="stabledrl", advantage="centered", estimator=name, estimator_cfg=est,
                     loss_cfg=LossConfig(), advantage_cfg=AdvantageConfig(), inner_steps=1,
                     num_states=4, mask_id=MASK, eos_id=EOS)
  graphdef, params = T.init_model(CFG, jax.random.key(0))
  opt = optax.sgd(1.0)
  state = init_train_state(params, opt, jax.random.key(1))
  before = jax.tree.map(np.asarray, state.params)
  batch = _batch().replace(rewards_BG=jnp.ones((B, G)))
  state, metrics = make_rl_step(graphdef, opt, lambda s: 1.0, cfg)(state, batch, jax.random.key(0))
  assert float(metrics["grad_norm"]) == 0.0
  for a, b in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(state.params)):
    np.testing.assert_array_equal(a, b)


def test_kl_penalty_is_zero_at_the_reference_and_reported():
  step_fn, state = _step("stabledrl", kl_coef=0.1, inner=1)
  _, metrics = step_fn(state, _batch(), jax.random.key(3))
  assert abs(float(metrics["kl"])) < 1e-6


def test_steprs_advantage_runs_in_the_step():
  step_fn, state = _step("stabledrl", advantage="steprs")
  state, metrics = step_fn(state, _batch(), jax.random.key(3))
  assert np.isfinite(float(metrics["loss"]))


def test_completion_lengths():
  c = jnp.array([[[5, 1, 1], [5, 6, 7], [1, 1, 1]]])
  np.testing.assert_array_equal(completion_lengths(c, 1), [[2, 3, 1]])
