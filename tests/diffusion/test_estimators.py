"""Likelihood estimators: masks independent of θ, invariants, unbiasedness by exact enumeration."""

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.diffusion.estimators import ESTIMATORS, EstimatorConfig, score_completion
from dllm_rl.models import transformer as T
from dllm_rl.types import SequenceBatch
from tests.helpers import tiny_model

MASK = 2
CFG = tiny_model(vocab_size=8, init_std=0.5)


@pytest.fixture(scope="module")
def model():
  graphdef, params = T.init_model(CFG, jax.random.key(0))
  return lambda p: (lambda *a: T.apply(graphdef, p, *a)), params


def _seqs(b=2, l=3):
  prompt = jnp.array([[4, 5], [6, 3]])[:b]
  completion = jnp.array([[3, 7, 5], [4, 4, 6]])[:b, :l]
  return SequenceBatch(prompt, jnp.ones_like(prompt, bool), completion,
                       jnp.ones_like(completion, bool))


def _probe(theta: float):
  """logits_fn whose log p of every target (ids ≥ 3) is −log(e^θ + V − 1) at a masked
  input position and −log V elsewhere: token contributions under two θ are
  proportional exactly when both calls drew the same masks and weights."""
  def logits_fn(tokens_BN, positions_BN, mask):
    del positions_BN, mask
    boost = theta * (tokens_BN == MASK).astype(jnp.float32)
    return jnp.zeros(tokens_BN.shape + (CFG.vocab_size,)).at[..., 0].set(boost)
  return logits_fn


@pytest.mark.parametrize("name, cfg", [
    ("mean_field", EstimatorConfig(reduction="sum")),
    ("mean_field", EstimatorConfig(reduction="mean", prompt_mask_prob=0.15)),
    ("elbo", EstimatorConfig(num_samples=3)),
    ("elbo", EstimatorConfig(num_samples=4, coupled=True, stratified=True, prompt_mask_prob=0.15)),
    ("spg_block", EstimatorConfig(num_samples=3, spg_block_len=2, prompt_mask_prob=0.15)),
])
def test_masks_depend_on_the_key_only_never_on_theta(model, name, cfg):
  """Same key, different parameters → same masks (what antithetic sharing and a
  ratio of exactly 1 at θ = θ_old rest on); a different key → different masks."""
  seqs = _seqs()
  est = ESTIMATORS.get(name)
  lik = {th: est(_probe(th), seqs, jax.random.key(3), cfg, MASK) for th in (1.0, 3.0)}
  f = lambda th: -math.log(math.exp(th) + CFG.vocab_size - 1)
  np.testing.assert_allclose(np.asarray(lik[1.0].token_BL) * f(3.0),
                             np.asarray(lik[3.0].token_BL) * f(1.0), rtol=1e-5, atol=1e-7)
  assert np.abs(np.asarray(lik[1.0].token_BL)).sum() > 0
  np.testing.assert_allclose(lik[1.0].seq_B, lik[1.0].token_BL.sum(-1), rtol=1e-6)
  # with the real model: finite float32, and θ changes the value on the same masks
  logits_of, params = model
  real = est(logits_of(params), seqs, jax.random.key(3), cfg, MASK)
  assert real.token_BL.dtype == jnp.float32 and np.all(np.isfinite(real.token_BL))
  if name != "mean_field":  # mean_field's masks are deterministic (everything masked)
    other = est(_probe(1.0), seqs, jax.random.key(4), cfg, MASK)
    assert not np.allclose(np.asarray(other.token_BL), np.asarray(lik[1.0].token_BL))


def test_mean_field_is_the_fully_masked_log_likelihood(model):
  logits_of, params = model
  seqs = _seqs()
  lik = ESTIMATORS.get("mean_field")(logits_of(params), seqs, jax.random.key(0),
                                     EstimatorConfig(reduction="sum"), MASK)
  noisy = jnp.full_like(seqs.completion_BL, MASK)
  logp, _ = score_completion(logits_of(params), seqs, seqs.prompt_BP, noisy)
  np.testing.assert_allclose(lik.token_BL, logp, rtol=1e-6)


def test_invalid_completion_positions_contribute_nothing(model):
  logits_of, params = model
  seqs = _seqs()
  seqs = seqs.replace(completion_valid_BL=jnp.array([[True, True, False], [True, False, False]]))
  for name in ("mean_field", "elbo"):
    lik = ESTIMATORS.get(name)(logits_of(params), seqs, jax.random.key(1),
                               EstimatorConfig(num_samples=2), MASK)
    assert np.all(np.asarray(lik.token_BL)[~np.asarray(seqs.completion_valid_BL)] == 0)


def _exact_elbo(logits_fn, seqs, t_lo, t_hi=1.0):
  """E_t E_M[(1/t) Σ_{i∈M} log p(o_i | masked M)] / L by enumerating every mask M.

  P(M | t) = t^k (1 − t)^(L − k), t ~ U[t_lo, t_hi]: E_t[P(M|t)/t] =
  ∫ t^(k−1) (1 − t)^(L − k) dt / (t_hi − t_lo), integrated exactly term by term.
  """
  b, l = seqs.completion_BL.shape
  total = np.zeros(b)
  for k in range(1, l + 1):
    coef = sum(math.comb(l - k, j) * (-1) ** j * (t_hi ** (k + j) - t_lo ** (k + j)) / (k + j)
               for j in range(l - k + 1)) / (t_hi - t_lo)
    for subset in itertools.combinations(range(l), k):
      m = np.zeros((b, l), bool)
      m[:, list(subset)] = True
      noisy = jnp.where(m, MASK, seqs.completion_BL)
      logp, _ = score_completion(logits_fn, seqs, seqs.prompt_BP, noisy)
      total += coef * np.where(m, np.asarray(logp, np.float64), 0.0).sum(-1) / l
  return total


@pytest.mark.parametrize("cfg", [
    EstimatorConfig(num_samples=1, t_eps=0.05),
    EstimatorConfig(num_samples=4, stratified=True, t_eps=0.05),
    EstimatorConfig(num_samples=2, coupled=True, t_eps=0.05),
    EstimatorConfig(num_samples=2, coupled=True, t_eps=0.25),
    EstimatorConfig(num_samples=4, coupled=True, stratified=True, t_eps=0.25),
])
def test_elbo_is_unbiased_against_exact_enumeration(model, cfg):
  """Monte-Carlo mean = exact expectation, to a resolution finer than a 5% bias.

  The coupled estimator draws t ~ U[t_eps, 1 − t_eps] so that the complement's
  rate 1 − t has the same law; its target is the objective over that range."""
  logits_of, params = model
  seqs = _seqs()
  t_hi = 1.0 - cfg.t_eps if cfg.coupled else 1.0
  exact = _exact_elbo(logits_of(params), seqs, cfg.t_eps, t_hi)
  est = jax.jit(jax.vmap(lambda k: ESTIMATORS.get("elbo")(logits_of(params), seqs, k, cfg,
                                                          MASK).seq_B))
  draws = np.asarray(est(jax.random.split(jax.random.key(11), 20000)), np.float64)
  mean, se = draws.mean(0), draws.std(0) / np.sqrt(len(draws))
  assert np.all(4 * se < 0.04 * np.abs(exact)), (se, exact)  # a 5% bias would fail below
  assert np.all(np.abs(mean - exact) < 4 * se + 1e-4), (mean, exact, se)


@pytest.mark.parametrize("num_samples", [2, 4])
def test_coupled_pairs_score_every_token_once(num_samples):
  """With complementary masks each token is scored in exactly one of the pair: draw k
  and draw k + K/2 are (M, ¬M) at rates (t, 1 − t), weights 1/t and 1/(1 − t). With
  uniform logits (log p = −log V for every token) the estimate is then exact:
  token i's contribution is −log V · (1/K) Σ_pairs w_pair(i) / L."""
  seqs = _seqs()
  cfg = EstimatorConfig(num_samples=num_samples, coupled=True, t_eps=0.1)
  est = ESTIMATORS.get("elbo")
  draws = est.draw(jax.random.key(2), seqs, cfg, MASK)
  scored = np.asarray(draws["scored_BL"]).astype(int)  # [K, B, L]
  half = num_samples // 2
  np.testing.assert_array_equal(scored[:half] + scored[half:], 1)  # once per pair
  assert 0 < scored[:half].sum() < scored[:half].size  # neither half is all or nothing
  # weight_B is a draw's whole weight: (1/t) / K / L, L = 3 valid tokens per row
  t_KB = (np.asarray(draws["weight_B"][:half]) * 3 * num_samples) ** -1
  np.testing.assert_allclose(np.asarray(draws["weight_B"][half:]) * 3 * num_samples,
                             1 / (1 - t_KB), rtol=1e-5)
  uniform = lambda tokens_BN, positions_BN, mask: jnp.zeros(tokens_BN.shape + (CFG.vocab_size,))
  lik = est(uniform, seqs, jax.random.key(2), cfg, MASK)
  w_KBL = np.where(scored, np.asarray(draws["weight_B"])[..., None], 0.0)
  np.testing.assert_allclose(lik.token_BL, -math.log(CFG.vocab_size) * w_KBL.sum(0), rtol=1e-5)


def test_coupled_needs_even_samples(model):
  logits_of, params = model
  with pytest.raises(ValueError, match="even"):
    ESTIMATORS.get("elbo")(logits_of(params), _seqs(), jax.random.key(0),
                           EstimatorConfig(num_samples=3, coupled=True), MASK)


def _diffucoder_token_logps(logits_fn, seqs, masked_BL, t_B):
  """apple/ml-diffucoder coupled_grpo.py, transcribed: ``forward_process`` makes three
  inputs — the completion all masked (p0), masked where u < t (p1), masked where u > t
  (p2) — and ``selective_log_softmax`` combines them per token as
  (p0 + where(mask, p1 · (1/t), p2 · (1/(1 − t)))) / 2, the prompt clean."""
  full = jnp.full_like(seqs.completion_BL, MASK)
  p0, _ = score_completion(logits_fn, seqs, seqs.prompt_BP, full)
  p1, _ = score_completion(logits_fn, seqs, seqs.prompt_BP,
                           jnp.where(masked_BL, MASK, seqs.completion_BL))
  p2, _ = score_completion(logits_fn, seqs, seqs.prompt_BP,
                           jnp.where(~masked_BL, MASK, seqs.completion_BL))
  p0, p1, p2 = (np.asarray(x, np.float64) for x in (p0, p1, p2))
  t = np.asarray(t_B, np.float64)[:, None]
  return (p0 + np.where(masked_BL, p1 * (1 / t), p2 * (1 / (1 - t)))) / 2


def test_coupled_with_full_mask_term_is_diffucoders_estimate(model):
  """configs/coupled_grpo.py's estimator: one complementary pair at t ∈ [0.2, 0.8] plus
  the fully masked pass; each completion token is scored exactly once across the pair,
  and the per-token estimate is DiffuCoder's, to float precision."""
  logits_of, params = model
  seqs = _seqs()
  cfg = EstimatorConfig(num_samples=2, coupled=True, t_eps=0.2, full_mask_term=True,
                        reduction="sum")
  est = ESTIMATORS.get("elbo")
  for seed in range(2):
    key = jax.random.key(seed)
    draws = est.draw(key, seqs, cfg, MASK)
    scored = np.asarray(draws["scored_BL"])
    assert scored.shape[0] == 3  # M, ¬M, all masked
    np.testing.assert_array_equal(scored[0].astype(int) + scored[1], 1)  # once per pair
    np.testing.assert_array_equal(scored[2], True)
    np.testing.assert_array_equal(np.asarray(draws["noisy_BL"][2]), MASK)
    for prompt_BP in np.asarray(draws["prompt_BP"]):  # the prompt is never masked
      np.testing.assert_array_equal(prompt_BP, seqs.prompt_BP)
    t_B = 1.0 / (2.0 * np.asarray(draws["weight_B"][0]))  # weight (1/t)/K, K = 2
    assert np.all((t_B >= 0.2) & (t_B <= 0.8))
    np.testing.assert_allclose(np.asarray(draws["weight_B"][1]), 1 / (2 * (1 - t_B)), rtol=1e-5)
    lik = est(logits_of(params), seqs, key, cfg, MASK)
    want = _diffucoder_token_logps(logits_of(params), seqs, scored[0], t_B)
    np.testing.assert_allclose(lik.token_BL, want, rtol=1e-5, atol=1e-6)
    # reduction="mean" is the same estimate over the length
    mean = est(logits_of(params), seqs, key, dataclasses.replace(cfg, reduction="mean"), MASK)
    np.testing.assert_allclose(mean.token_BL, want / seqs.completion_BL.shape[1], rtol=1e-5)


def test_entropy_leaves_out_draws_and_sequences_that_score_nothing():
  """A draw masking none of a short completion has no entropy to give: it is left out of its
  sequence's mean (it counted 0), and a sequence that no draw scores is left out of the
  batch's (NaN in entropy_B)."""
  from dllm_rl.diffusion.estimators import batch_entropy, draws_entropy
  ent_KBL = jnp.array([[[1.0, 3.0], [2.0, 2.0], [5.0, 5.0]],
                       [[4.0, 4.0], [9.0, 9.0], [7.0, 7.0]]])
  scored_KBL = jnp.array([[[True, True], [True, False], [False, False]],
                          [[False, True], [False, False], [False, False]]])
  entropy_B = draws_entropy(ent_KBL, scored_KBL)
  np.testing.assert_allclose(entropy_B[:2], [(2.0 + 4.0) / 2, 2.0])
  assert np.isnan(entropy_B[2])
  np.testing.assert_allclose(batch_entropy(entropy_B), (3.0 + 2.0) / 2)
  assert float(batch_entropy(jnp.full((3,), jnp.nan))) == 0.0
