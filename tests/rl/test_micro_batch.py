"""rl.micro_batch: micro-batched likelihoods and gradient accumulation = the full batch (fp32)."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dllm_rl.diffusion.estimators import EstimatorConfig
from dllm_rl.models import transformer as T
from dllm_rl.rl import micro
from dllm_rl.rl.advantages import AdvantageConfig
from dllm_rl.rl.losses import LOSSES
from dllm_rl.rl.step import RolloutBatch, make_rl_step
from dllm_rl.parallel.shard import init_train_state
from tests.helpers import EOS, rl_step_config, tiny_model

CFG = tiny_model(vocab_size=13, n_layers=2, n_kv_heads=1)
B, G, P, L = 2, 4, 3, 8

CASES = {  # loss, advantage, estimator, estimator options, kl
    "stabledrl-spg-official": ("stabledrl", "steprs", "spg_block",
                               dict(num_samples=2, spg_block_len=4, prompt_mask_prob=0.3), 0.0),
    "grpo-elbo-kl-antithetic": ("grpo", "centered", "elbo",
                                dict(num_samples=2, antithetic=True, coupled=True), 0.1),
    "spg": ("spg", "centered", "spg_block", dict(num_samples=3, spg_block_len=4), 0.0),
    "grpo_token-mean_field": ("grpo_token", "centered", "mean_field",
                              dict(reduction="sum", prompt_mask_prob=0.2), 0.0),
    "stabledrl-block": ("stabledrl", "steprs", "block_elbo",
                        dict(num_samples=2, block_size=4, attention_impl="reference",
                             prompt_mask_prob=0.2), 0.0),
    "coupled_grpo-token-kl": ("grpo_token", "leave_one_out", "elbo",  # DiffuCoder's
                              dict(num_samples=2, antithetic=True, coupled=True,
                                   full_mask_term=True, reduction="sum"), 0.01),
    "wd1-mean_field": ("wd1", "centered", "mean_field",  # wd1's recipe: ratio-free
                       dict(reduction="sum", prompt_mask_prob=0.15), 0.0),
    "espo-coupled-kl": ("espo", "leave_one_out", "elbo",  # ESPO's: exp(Δℓ̂ / L) and a KL
                        dict(num_samples=4, antithetic=True, coupled=True, reduction="sum"),
                        0.01),
}
KL_LEVEL = {"coupled_grpo-token-kl": "token"}  # the others: sequence


def test_every_registered_loss_has_a_case():
  """A registry check (README "Adding a component"): a new loss fails here until CASES holds
  it, so that its micro-batched gradient is checked against the full batch's."""
  missing = sorted(set(LOSSES.names()) - {loss for loss, *_ in CASES.values()})
  assert not missing, (f"add a case of rl.loss {missing} to CASES in"
                       " tests/rl/test_micro_batch.py (with the estimator it needs)")


def _batch():
  k = jax.random.split(jax.random.key(7), 4)
  completion = jax.random.randint(k[2], (B, G, L), 3, 13)
  completion = completion.at[0, 1, 3].set(EOS).at[1, 2, 0].set(EOS)  # ragged actions
  rewards = jnp.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.5]])
  return RolloutBatch(
      prompt_BP=jax.random.randint(k[1], (B, P), 3, 13),
      prompt_valid_BP=jnp.ones((B, P), bool).at[1, 0].set(False), completion_BGL=completion,
      unmask_step_BGL=jax.random.randint(k[3], (B, G, L), 0, 4), rewards_BG=rewards,
      correct_BG=rewards > 0.5)


def _capture_grads():
  """An optimizer that keeps the last gradient as its state and leaves params unchanged:
  the step's exact gradient, not one filtered through Adam's normalisation."""
  return optax.GradientTransformation(
      init=lambda p: jax.tree.map(jnp.zeros_like, p),
      update=lambda g, state, params=None: (jax.tree.map(jnp.zeros_like, g), g))


def _run(case, micro_batch, logits_chunk=0):
  loss, advantage, name, opts, kl = CASES[case]
  est_cfg = EstimatorConfig(**opts, logits_chunk=logits_chunk)
  cfg = rl_step_config(loss, advantage, name, est_cfg, inner_steps=2, num_states=4,
                       advantage_cfg=AdvantageConfig(num_states=4), kl_coef=kl,
                       kl_level=KL_LEVEL.get(case, "sequence"), micro_batch=micro_batch)
  graphdef, params = T.init_model(CFG, jax.random.key(0))
  opt = _capture_grads()
  state = init_train_state(params, opt, jax.random.key(1))
  if kl:
    state = state.replace(ref_params=T.init_model(CFG, jax.random.key(5))[1])
  state, metrics = make_rl_step(graphdef, opt, lambda s: 1e-2, cfg)(state, _batch(),
                                                                      jax.random.key(3))
  return jax.device_get(state.opt_state), jax.device_get(metrics)


@pytest.mark.parametrize("case", list(CASES))
def test_gradient_accumulation_equals_the_full_batch(case):
  ref_grads, ref_metrics = _run(case, 0)
  ref_leaves = jax.tree_util.tree_leaves(ref_grads)
  scale = max(float(np.abs(g).max()) for g in ref_leaves)
  assert scale > 1e-3  # a real gradient
  # 4 micro-batches of 2 sequences; once also 1 micro-batch of all 8 (only the draws split)
  for micro_batch in (2, 8) if case == "stabledrl-spg-official" else (2,):
    grads, metrics = _run(case, micro_batch, logits_chunk=3)
    for k in ("loss", "grad_norm", "ratio_mean", "entropy", "policy_loss"):
      np.testing.assert_allclose(metrics[k], ref_metrics[k], rtol=1e-5, atol=1e-7, err_msg=k)
    for a, b in zip(jax.tree_util.tree_leaves(grads), ref_leaves):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * scale)


def test_rows_split_interleaved_and_merge_back():
  x = jnp.arange(12 * 2).reshape(12, 2)
  parts = micro.split_rows(x, 3)
  assert parts.shape == (3, 4, 2)
  np.testing.assert_array_equal(parts[1, :, 0], x[1::3, 0])  # micro-batch j: rows j, j+3, ...
  np.testing.assert_array_equal(micro.merge_rows(parts), x)
  with pytest.raises(ValueError, match="do not split"):
    micro.split_rows(x, 5)
