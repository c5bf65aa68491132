"""Block diffusion: the one-pass staircase ELBO equals the per-block loop."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.diffusion.block import block_elbo, block_elbo_loop
from dllm_rl.diffusion.estimators import ESTIMATORS, EstimatorConfig
from dllm_rl.kernels.block_mask import block_causal_mask
from dllm_rl.models import transformer as T
from dllm_rl.types import SequenceBatch
from tests.helpers import tiny_model

MASK = 2
CFG = tiny_model(vocab_size=16, n_layers=2, n_heads=4, qk_norm=True, init_std=0.3)


@pytest.fixture(scope="module")
def model():
  graphdef, params = T.init_model(CFG, jax.random.key(0))
  return lambda *a: T.apply(graphdef, params, *a)


def _seqs(b=2, p=5, l=8):
  k = jax.random.split(jax.random.key(1), 2)
  valid = jnp.ones((b, p), bool).at[0, :2].set(False)  # a left-padded prompt
  return SequenceBatch(jax.random.randint(k[0], (b, p), 3, 16), valid,
                       jax.random.randint(k[1], (b, l), 3, 16), jnp.ones((b, l), bool))


@pytest.mark.parametrize("impl", ["reference", "interpret"])
@pytest.mark.parametrize("prompt_mask_prob, prompt_block_causal", [(0.0, False), (0.15, False),
                                                                   (0.15, True)])
def test_one_pass_equals_per_block_loop(model, impl, prompt_mask_prob, prompt_block_causal):
  cfg = EstimatorConfig(num_samples=2, block_size=4, attention_impl=impl,
                        prompt_mask_prob=prompt_mask_prob, prompt_block_causal=prompt_block_causal)
  seqs = _seqs()
  one = block_elbo(model, seqs, jax.random.key(3), cfg, MASK)
  loop = block_elbo_loop(model, seqs, jax.random.key(3), cfg, MASK)
  np.testing.assert_allclose(one.token_BL, loop.token_BL, atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(one.seq_B, one.token_BL.sum(-1), rtol=1e-6)
  np.testing.assert_allclose(one.entropy_B, loop.entropy_B, atol=1e-4)
  assert np.all(np.asarray(one.seq_B) < 0)


def test_registered_and_shared_masks_give_ratio_one(model):
  """The registered estimator is block_elbo; its masks are a function of the key alone:
  θ_old and a different θ scored with one key score the same tokens (so at θ = θ_old the
  ratio is exactly 1, whatever the parameter values), and another key scores others."""
  cfg = EstimatorConfig(block_size=4, attention_impl="reference")
  est = ESTIMATORS.get("block_elbo")
  seqs = _seqs()
  old = est(model, seqs, jax.random.key(5), cfg, MASK)
  np.testing.assert_array_equal(old.token_BL, block_elbo(model, seqs, jax.random.key(5), cfg,
                                                         MASK).token_BL)
  graphdef, other_params = T.init_model(CFG, jax.random.key(1))  # a different θ
  other = est(lambda *a: T.apply(graphdef, other_params, *a), seqs, jax.random.key(5), cfg, MASK)
  scored = np.asarray(old.token_BL) != 0
  assert scored.any() and not scored.all()
  np.testing.assert_array_equal(np.asarray(other.token_BL) != 0, scored)  # the same masks
  assert not np.allclose(other.seq_B, old.seq_B)  # ... under different log-probs
  again = est(model, seqs, jax.random.key(5), cfg, MASK)  # θ = θ_old, same key: ratio 1
  np.testing.assert_array_equal(np.exp(np.asarray(again.seq_B) - np.asarray(old.seq_B)), 1.0)
  fresh = est(model, seqs, jax.random.key(6), cfg, MASK)  # another key: other masks
  assert not np.array_equal(np.asarray(fresh.token_BL) != 0, scored)


def test_block_causal_mask_rules():
  m = np.asarray(block_causal_mask(jnp.array([[False, True, True]]), 8, 4))[0]
  assert not m[:, 0].any()  # the padded prompt key is invisible
  assert m[1, 1:3].all() and not m[1, 3:].any()  # prompt rows: the prompt only
  assert m[3:7, 3:7].all() and not m[3:7, 7:].any()  # block 0: itself, not block 1
  assert m[7:, 1:].all()  # block 1 sees prompt, block 0 and itself


def test_gradients_flow_only_through_allowed_paths(model):
  """A noisy block's ELBO does not depend on later clean blocks' tokens... except
  through their own ELBO terms: check block 0's contribution alone."""
  cfg = EstimatorConfig(block_size=4, attention_impl="reference")
  seqs = _seqs(b=1)
  base = block_elbo(model, seqs, jax.random.key(7), cfg, MASK).token_BL[:, :4]
  changed = seqs.replace(completion_BL=seqs.completion_BL.at[:, 4:].set(3))
  after = block_elbo(model, changed, jax.random.key(7), cfg, MASK).token_BL[:, :4]
  np.testing.assert_allclose(base, after, atol=1e-6)  # block 0 never sees block 1
