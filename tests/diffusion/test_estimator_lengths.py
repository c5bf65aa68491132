"""Estimators use each completion's true length (tokens through the first EOS), never the
padded L (DESIGN "Masked diffusion basics"): the length-mean reductions divide by it, and
``spg_block`` picks its block b among the ceil(len / Bsz) blocks that hold action tokens."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.diffusion.estimators import ESTIMATORS, EstimatorConfig
from dllm_rl.diffusion.spg_block import spg_block_masks
from dllm_rl.types import SequenceBatch

MASK, VOCAB, L = 2, 8, 12


def _seqs(lengths):
  b = len(lengths)
  rng = np.random.default_rng(0)
  return SequenceBatch(
      prompt_BP=jnp.asarray(rng.integers(3, VOCAB, (b, 3)), jnp.int32),
      prompt_valid_BP=jnp.ones((b, 3), bool),
      completion_BL=jnp.asarray(rng.integers(3, VOCAB, (b, L)), jnp.int32),
      completion_valid_BL=jnp.asarray(np.arange(L)[None] < np.asarray(lengths)[:, None]))


def _logits_fn(tokens_BN, positions_BN, mask):
  """Log-probs that vary with the position and with whether the input is a mask."""
  del mask
  table = jax.random.normal(jax.random.key(0), (64, VOCAB))
  return table[positions_BN] + 2.0 * (tokens_BN == MASK)[..., None] * jnp.arange(VOCAB) / VOCAB


@pytest.mark.parametrize("name, cfg", [
    ("mean_field", EstimatorConfig()),
    ("elbo", EstimatorConfig(num_samples=3)),
])
def test_mean_reduction_divides_by_the_true_length(name, cfg):
  lengths = np.array([12, 5, 1])
  seqs, key = _seqs(lengths), jax.random.key(3)
  est = ESTIMATORS.get(name)
  mean, total = jax.jit(lambda k: [
      est(_logits_fn, seqs, k, dataclasses.replace(cfg, reduction=r), MASK) for r in ("mean", "sum")
  ])(key)
  assert np.all(np.asarray(total.seq_B) != 0)
  np.testing.assert_allclose(np.asarray(mean.seq_B) * lengths, total.seq_B, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(mean.token_BL) * lengths[:, None], total.token_BL,
                             rtol=1e-5, atol=1e-6)


def test_spg_block_draws_only_blocks_that_hold_action_tokens():
  """Lengths that are multiples of the block length (8 = 2·4, 4 = 1·4 in L = 12): the block
  after the last full one holds no action token, so drawing it would score nothing."""
  block = 4
  lengths = np.array([8, 4, 12, 9])
  seqs = _seqs(lengths)
  fn = jax.jit(lambda key: spg_block_masks(key, seqs, 2, block, 0.0))
  for key in jax.random.split(jax.random.key(1), 32):
    m = fn(key)
    assert np.all(np.asarray(m.block_KB) < -(-lengths // block)[None])
    scored = np.asarray(m.completion_KBL & seqs.completion_valid_BL[None])
    assert np.all(scored.sum(-1) >= 1)  # m_k ≥ 1 token of block b_k
