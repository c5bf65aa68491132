"""Forward masking and the LLaDA SFT objective."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dllm_rl.diffusion import masking
from dllm_rl.diffusion.sft import sft_loss
from dllm_rl.models import transformer as T
from dllm_rl.parallel.shard import init_train_state
from dllm_rl.train.sft_step import make_sft_step
from dllm_rl.types import SequenceBatch
from tests.helpers import tiny_model

MASK = 2
CFG = tiny_model(vocab_size=20, d_model=32, head_dim=16, mlp_hidden=64)


def _batch():
  prompt = jax.random.randint(jax.random.key(0), (8, 6), 3, 20)
  valid = jnp.ones((8, 6), bool).at[:, :2].set(False)
  completion = jax.random.randint(jax.random.key(1), (8, 5), 3, 20)
  comp_valid = jnp.ones((8, 5), bool).at[:4, 3:].set(False)
  return SequenceBatch(prompt, valid, completion, comp_valid)


def test_masking_only_touches_eligible_positions():
  tokens = jnp.arange(4000).reshape(40, 100) % 17 + 3
  eligible = jax.random.bernoulli(jax.random.key(0), 0.6, tokens.shape)
  t = masking.sample_t(jax.random.key(1), 40, 1e-3)
  noisy, masked = masking.forward_mask(jax.random.key(2), tokens, eligible, t, MASK)
  assert not np.any(np.asarray(masked & ~eligible))
  np.testing.assert_array_equal(np.asarray(noisy)[~np.asarray(masked)],
                                np.asarray(tokens)[~np.asarray(masked)])
  assert np.all(np.asarray(noisy)[np.asarray(masked)] == MASK)
  rate = np.asarray(masked).sum(1) / np.asarray(eligible).sum(1)
  np.testing.assert_allclose(rate, np.asarray(t), atol=0.25)  # per-row rate tracks t
  assert np.all((np.asarray(t) > 1e-3) & (np.asarray(t) <= 1.0))


def test_loss_has_no_gradient_from_prompt_padding_tokens():
  g, params = T.init_model(CFG, jax.random.key(0))
  batch = _batch()

  def loss_of(prompt):
    return sft_loss(g, params, batch.replace(prompt_BP=prompt), jax.random.key(3), mask_id=MASK,
                    t_eps=1e-3)[0]

  other = batch.prompt_BP.at[:, :2].set(7)  # change only padded prompt tokens
  np.testing.assert_allclose(loss_of(batch.prompt_BP), loss_of(other), rtol=1e-6)


def test_sft_loss_decreases_on_a_fixed_batch():
  g, params = T.init_model(CFG, jax.random.key(0))
  opt = optax.adam(3e-3)
  schedule = lambda step: 3e-3
  step_fn = make_sft_step(g, opt, schedule, mask_id=MASK, t_eps=1e-3)
  state = init_train_state(params, opt, jax.random.key(0))
  batch = _batch()
  losses = []
  for i in range(60):
    state, m = step_fn(state, batch, jax.random.key(i % 4))
    losses.append(float(m["loss"]))
  assert int(state.step) == 60
  assert np.isfinite(losses).all() and float(m["grad_norm"]) > 0
  assert np.mean(losses[-8:]) < 0.5 * np.mean(losses[:8])


def test_sft_loss_value_is_the_llada_objective():
  """L = mean_b −(1/t_b) Σ_{i masked} log p(x0_i | x_t) / L_b (LLaDA eq. 3; L_b the
  valid completion length), recomputed in float64 numpy from the same draws."""
  g, params = T.init_model(CFG, jax.random.key(0))
  batch = _batch()
  key = jax.random.key(5)
  loss, metrics = sft_loss(g, params, batch, key, mask_id=MASK, t_eps=1e-3)
  # the same (t, mask) draws as sft_loss: key → (k_t, k_m)
  k_t, k_m = jax.random.split(key)
  t = np.asarray(masking.sample_t(k_t, 8, 1e-3), np.float64)
  noisy, masked = masking.forward_mask(k_m, batch.completion_BL, batch.completion_valid_BL,
                                       jnp.asarray(t, jnp.float32), MASK)
  tokens = jnp.concatenate([batch.prompt_BP, noisy], axis=1)
  valid = jnp.concatenate([batch.prompt_valid_BP, jnp.ones_like(noisy, bool)], axis=1)
  positions = T.positions_from_valid(valid)
  logits = np.asarray(T.apply(g, params, tokens, positions, valid[:, None, :]), np.float64)[:, 6:]
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  target = np.take_along_axis(logp, np.asarray(batch.completion_BL)[..., None], -1)[..., 0]
  masked = np.asarray(masked)
  lengths = np.asarray(batch.completion_valid_BL).sum(-1)
  want = np.mean(-(np.where(masked, target, 0.0).sum(-1) / t) / lengths)
  assert masked.any() and not np.allclose(t, t[0])
  assert float(loss) == pytest.approx(want, rel=1e-5)
  assert float(metrics["masked_nll"]) == pytest.approx(-target[masked].mean(), rel=1e-5)
