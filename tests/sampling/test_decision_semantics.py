"""One denoising decision on hand-built logits, against the official semantics by hand.

The sampler tests run whole rollouts on a random model, where a confidence of the wrong sign,
a sampler at the wrong temperature or a decision that reuses one key every step still passes
their invariants (k tokens per step, never re-masked). Here the logits are chosen so that each
rule of shared/DESIGN.md ("Sampler (LLaDA)") gives a known answer.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.sampling import remasking
from dllm_rl.sampling.sampler import SamplerConfig
from dllm_rl.sampling.step import commit_step, select_commits

MASK = 3
PROBS = np.array([0.5, 0.3, 0.2], np.float32)


def _cfg(**kw):
  return SamplerConfig(completion_len=8, steps=8, block_len=8, **kw)


def test_policies_score_a_known_distribution():
  """probs (0.5, 0.3, 0.2), proposal token 1: low_confidence is p(proposal) = 0.3 (not the
  max), margin 0.5 − 0.3, entropy −H = Σ p log p; random draws from its key."""
  logits = jnp.log(jnp.asarray(PROBS))[None, None]
  x0 = jnp.array([[1]], jnp.int32)
  key = jax.random.key(0)
  np.testing.assert_allclose(remasking.confidence("low_confidence", logits, x0, key), [[0.3]],
                             rtol=1e-6)
  np.testing.assert_allclose(remasking.confidence("margin", logits, x0, key), [[0.2]],
                             rtol=1e-5)
  np.testing.assert_allclose(remasking.confidence("entropy", logits, x0, key),
                             [[np.sum(PROBS * np.log(PROBS))]], rtol=1e-5)
  x0_8 = jnp.zeros((1, 8), jnp.int32)
  a = remasking.confidence("random", jnp.zeros((1, 8, 3)), x0_8, jax.random.key(1))
  b = remasking.confidence("random", jnp.zeros((1, 8, 3)), x0_8, jax.random.key(2))
  assert not np.array_equal(a, b)


def _peaked(top_probs):
  """[1, L, 4] logits: position i proposes token 0 with probability top_probs[i] at
  temperature 0 (the rest spread over tokens 1, 2; the mask token 3 gets nothing)."""
  p = np.asarray(top_probs, np.float64)
  rest = (1 - p) / 2
  probs = np.stack([p, rest, rest, np.full_like(p, 1e-12)], -1)
  return jnp.asarray(np.log(probs), jnp.float32)[None]


@pytest.mark.parametrize("remask", ["low_confidence", "margin", "entropy"])
def test_commits_the_k_most_confident_open_positions(remask):
  """k = 2: the two most confident *masked* positions commit; the most confident position of
  all is already decoded and must not use up the budget."""
  logits = _peaked([0.95, 0.6, 0.9, 0.4, 0.8, 0.5, 0.7, 0.45])
  open_ = jnp.array([[False, True, True, True, True, True, True, True]])
  x0, commit = select_commits(logits, open_, jax.random.key(0), 2, cfg=_cfg(remasking=remask),
                              mask_id=MASK)
  np.testing.assert_array_equal(x0, np.zeros((1, 8)))
  np.testing.assert_array_equal(commit[0], [0, 0, 1, 0, 1, 0, 0, 0])


def test_threshold_mode_commits_above_the_threshold_or_the_single_best():
  """Fast-dLLM dynamic mode: every open position above the threshold; when none is, the most
  confident one alone."""
  logits = _peaked([0.95, 0.6, 0.9, 0.4, 0.8, 0.5, 0.7, 0.45])
  open_ = jnp.array([[False, True, True, True, True, True, True, True]])
  _, commit = select_commits(logits, open_, jax.random.key(0), 0, cfg=_cfg(threshold=0.65),
                             mask_id=MASK)
  np.testing.assert_array_equal(commit[0], [0, 0, 1, 0, 1, 0, 1, 0])
  _, commit = select_commits(logits, open_, jax.random.key(0), 0, cfg=_cfg(threshold=0.99),
                             mask_id=MASK)
  np.testing.assert_array_equal(commit[0], [0, 0, 1, 0, 0, 0, 0, 0])


def test_threshold_mode_commits_a_confidence_equal_to_the_threshold():
  """Fast-dLLM's ``get_transfer_index`` keeps an open position whose confidence is >= the
  threshold (it drops only those below it): p = 0.5 exactly (two equal logits) at threshold
  0.5 commits, beside the most confident position."""
  row_even = [0.0, 0.0, -1e9, -1e9]  # p(token 0) = 1/2 exactly in float32
  row_sure = [4.0, 0.0, -1e9, -1e9]
  logits = jnp.array([[row_even, row_sure, row_even]], jnp.float32)
  open_ = jnp.array([[True, True, False]])
  _, commit = select_commits(logits, open_, jax.random.key(0), 0, cfg=_cfg(threshold=0.5),
                             mask_id=MASK)
  np.testing.assert_array_equal(commit[0], [1, 1, 0])
  _, commit = select_commits(logits, open_, jax.random.key(0), 0,
                             cfg=_cfg(threshold=0.5 + 1e-6), mask_id=MASK)
  np.testing.assert_array_equal(commit[0], [0, 1, 0])


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_proposals_sample_softmax_of_logits_over_temperature(temperature):
  """Gumbel-max at temperature T draws token v with probability ∝ p_v^(1/T)."""
  n = 20000
  logits = jnp.broadcast_to(jnp.log(jnp.asarray(PROBS)), (1, n, 3))
  x0, _ = select_commits(logits, jnp.ones((1, n), bool), jax.random.key(4), 1,
                         cfg=_cfg(temperature=temperature), mask_id=MASK)
  want = PROBS ** (1 / temperature) / np.sum(PROBS ** (1 / temperature))
  freq = np.bincount(np.asarray(x0[0]), minlength=3) / n
  np.testing.assert_allclose(freq, want, atol=0.015)


def test_each_step_draws_fresh_randomness():
  """``fold_in(key, step)``: the same state at two step indices proposes different tokens."""
  cfg = _cfg(temperature=1.0, exclude_mask=True)
  x = jnp.full((1, 8), MASK, jnp.int32)
  buffers = (x, jnp.full((1, 8), -1, jnp.int32), jnp.int32(0), jnp.zeros((0, 1, 8), jnp.int32))
  logits = jnp.zeros((1, 8, 64))
  a = commit_step(buffers, logits, 0, 8, jax.random.key(0), cfg=cfg, mask_id=MASK)
  b = commit_step((*buffers[:2], jnp.int32(1), buffers[3]), logits, 0, 8, jax.random.key(0),
                  cfg=cfg, mask_id=MASK)
  assert not np.array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], 0)  # every position committed at step 0 ...
  np.testing.assert_array_equal(b[1], 1)  # ... or at step 1
