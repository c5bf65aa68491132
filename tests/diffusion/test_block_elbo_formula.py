"""block_elbo against its formula by hand (shared/DESIGN.md, "Block diffusion"):
ℓ̂ = Σ_b ELBO_b, ELBO_b = (1/t_b) Σ_{i ∈ M_b} log p(o_i) / len, one rate t_b per block, the
true length len (never L), completion positions continuing the prompt's.

The one-pass estimator and its per-block reference share the draws, the 1/t weighting and the
positions, so their equality (test_block_elbo.py) holds whatever those are.
"""

import jax
import jax.numpy as jnp
import numpy as np

from dllm_rl.diffusion.block import block_elbo, block_masks
from dllm_rl.diffusion.estimators import EstimatorConfig
from dllm_rl.models import transformer as T
from dllm_rl.types import SequenceBatch
from tests.helpers import tiny_model

MASK, V = 2, 16


def _seqs(b=2, p=5, l=8, length=(6, 8)):
  """A left-padded first prompt (3 valid tokens); completions of true lengths ``length``."""
  k = jax.random.split(jax.random.key(1), 2)
  valid = jnp.ones((b, p), bool).at[0, :2].set(False)
  completion_valid = jnp.arange(l)[None, :] < jnp.asarray(length)[:, None]
  return SequenceBatch(jax.random.randint(k[0], (b, p), 3, V), valid,
                       jax.random.randint(k[1], (b, l), 3, V), completion_valid)


def test_each_block_is_masked_at_its_own_rate_t_not_1_minus_t():
  """M_b ~ Bernoulli(t_b): over 256-token blocks the masked fraction of a block is t_b to
  within a few 1/sqrt(256), and its mean over the draws is E t = (1 + t_eps)/2."""
  cfg = EstimatorConfig(num_samples=8, block_size=256, t_eps=0.1)
  seqs = _seqs(b=2, l=1024, length=(1024, 1024))
  t_KBL, masked_KBL = block_masks(jax.random.key(3), seqs, cfg)
  t_KBb = np.asarray(t_KBL).reshape(8, 2, 4, 256)[..., 0]
  frac_KBb = np.asarray(masked_KBL).reshape(8, 2, 4, 256).mean(-1)
  assert np.abs(frac_KBb - t_KBb).max() < 0.12
  assert np.abs(frac_KBb - t_KBb).mean() < 0.04


def test_block_masks_use_one_rate_per_block_and_only_the_action():
  cfg = EstimatorConfig(num_samples=64, block_size=4, t_eps=0.5)
  seqs = _seqs()
  t_KBL, masked_KBL = block_masks(jax.random.key(0), seqs, cfg)
  t_KBbs = np.asarray(t_KBL).reshape(64, 2, 2, 4)
  np.testing.assert_array_equal(t_KBbs, np.repeat(t_KBbs[..., :1], 4, axis=-1))
  assert not np.allclose(t_KBbs[:, :, 0], t_KBbs[:, :, 1])  # each block its own rate
  assert t_KBbs.min() >= 0.5 and t_KBbs.max() <= 1.0  # t ~ U[t_eps, 1]
  assert not np.asarray(masked_KBL)[:, 0, 6:].any()  # nothing after the action is scored
  assert np.asarray(masked_KBL)[:, 0, :6].any()


def _positional_logits(tokens_BN, positions_BN, mask):
  """Logits that depend on the position only: row n scores token v with 0.1·pos_n·v."""
  del tokens_BN, mask
  return 0.1 * positions_BN[..., None].astype(jnp.float32) * jnp.arange(V, dtype=jnp.float32)


def test_token_contributions_equal_the_formula_by_hand():
  cfg = EstimatorConfig(num_samples=2, block_size=4, attention_impl="reference")
  seqs, key = _seqs(), jax.random.key(3)
  got = block_elbo(_positional_logits, seqs, key, cfg, MASK)
  t_KBL, masked_KBL = (np.asarray(a) for a in block_masks(jax.random.split(key)[0], seqs, cfg))
  # completion position i of row b sits at (valid prompt tokens of b) + i
  pos_BL = np.asarray(seqs.prompt_valid_BP).sum(-1)[:, None] + np.arange(8)[None]
  logits_BLV = 0.1 * pos_BL[..., None] * np.arange(V)
  logp_all = logits_BLV - np.log(np.exp(logits_BLV).sum(-1, keepdims=True))
  logp_BL = np.take_along_axis(logp_all, np.asarray(seqs.completion_BL)[..., None], -1)[..., 0]
  length_B = np.array([6.0, 8.0])
  want_BL = np.mean(np.where(masked_KBL, logp_BL / t_KBL, 0.0), axis=0) / length_B[:, None]
  assert masked_KBL.any()
  np.testing.assert_allclose(got.token_BL, want_BL, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got.seq_B, want_BL.sum(-1), rtol=1e-5)


def test_tokens_after_the_action_are_never_attended():
  """Changing the completion after its true length (EOS fill) changes nothing."""
  graphdef, params = T.init_model(tiny_model(vocab_size=V, init_std=0.3), jax.random.key(0))
  cfg = EstimatorConfig(num_samples=2, block_size=4, attention_impl="reference")
  seqs = _seqs()
  other = seqs.replace(completion_BL=seqs.completion_BL.at[0, 6:].set(MASK + 1))
  assert not np.array_equal(other.completion_BL, seqs.completion_BL)
  model = lambda *a: T.apply(graphdef, params, *a)  # noqa: E731
  a = block_elbo(model, seqs, jax.random.key(3), cfg, MASK)
  b = block_elbo(model, other, jax.random.key(3), cfg, MASK)
  np.testing.assert_array_equal(a.token_BL, b.token_BL)
