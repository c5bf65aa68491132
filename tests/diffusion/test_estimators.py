"""Likelihood estimators: invariants, shared-mask ratio = 1, unbiasedness by exact enumeration."""

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

MASK = 2
CFG = T.ModelConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=8,
                    mlp_hidden=32, init_std=0.5)


@pytest.fixture(scope="module")
def model():
  graphdef, params = T.init_model(CFG, jax.random.key(0))
  return lambda p: (lambda *a: T.apply(graphdef, p, *a)), params


def _seqs(b=2, l=3):
  prompt = jnp.array([[4, 5], [6, 3]])[:b]
  completion = jnp.array([[3, 7, 5], [4, 4, 6]])[:b, :l]
  return SequenceBatch(prompt, jnp.ones_like(prompt, bool), completion,
                       jnp.ones_like(completion, bool))


@pytest.mark.parametrize("name, cfg", [
    ("mean_field", EstimatorConfig(reduction="sum")),
    ("mean_field", EstimatorConfig(reduction="mean", prompt_mask_prob=0.15)),
    ("elbo", EstimatorConfig(num_samples=3)),
    ("elbo", EstimatorConfig(num_samples=4, coupled=True, stratified=True, prompt_mask_prob=0.15)),
])
def test_invariants_and_shared_masks_give_ratio_one(model, name, cfg):
  logits_of, params = model
  seqs = _seqs()
  est = ESTIMATORS.get(name)
  lik = est(logits_of(params), seqs, jax.random.key(3), cfg, MASK)
  np.testing.assert_allclose(lik.seq_B, lik.token_BL.sum(-1), rtol=1e-6)
  assert lik.token_BL.dtype == jnp.float32 and np.all(np.isfinite(lik.token_BL))
  again = est(logits_of(params), seqs, jax.random.key(3), cfg, MASK)  # θ = θ_old, same key
  np.testing.assert_array_equal(lik.seq_B - again.seq_B, 0.0)
  other = est(logits_of(params), seqs, jax.random.key(4), cfg, MASK)
  if name == "elbo":  # fresh masks give a different estimate
    assert not np.allclose(lik.seq_B, other.seq_B)


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


def _exact_elbo(logits_fn, seqs, t_eps):
  """E_t E_M[(1/t) Σ_{i∈M} log p(o_i | masked M)] / L by enumerating every mask M.

  P(M | t) = t^k (1 − t)^(L − k), t ~ U[t_eps, 1]: E_t[P(M|t)/t] =
  ∫ t^(k−1) (1 − t)^(L − k) dt / (1 − t_eps), integrated exactly term by term.
  """
  b, l = seqs.completion_BL.shape
  total = np.zeros(b)
  for k in range(1, l + 1):
    coef = sum(math.comb(l - k, j) * (-1) ** j * (1 - t_eps ** (k + j)) / (k + j)
               for j in range(l - k + 1)) / (1 - t_eps)
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
])
def test_elbo_is_unbiased_against_exact_enumeration(model, cfg):
  logits_of, params = model
  seqs = _seqs()
  exact = _exact_elbo(logits_of(params), seqs, cfg.t_eps)
  est = jax.jit(jax.vmap(lambda k: ESTIMATORS.get("elbo")(logits_of(params), seqs, k, cfg,
                                                          MASK).seq_B))
  draws = np.asarray(est(jax.random.split(jax.random.key(11), 4000)), np.float64)
  mean, se = draws.mean(0), draws.std(0) / np.sqrt(len(draws))
  assert np.all(np.abs(mean - exact) < 4 * se + 1e-4), (mean, exact, se)


def test_coupled_pairs_score_every_token_once(model):
  """With complementary masks each token is scored in exactly one of the pair."""
  logits_of, params = model
  seqs = _seqs()
  cfg = EstimatorConfig(num_samples=2, coupled=True, t_eps=0.5)
  lik = ESTIMATORS.get("elbo")(logits_of(params), seqs, jax.random.key(2), cfg, MASK)
  assert np.all(np.asarray(lik.token_BL) < 0)  # every token received a (negative) log-prob


def test_coupled_needs_even_samples(model):
  logits_of, params = model
  with pytest.raises(ValueError, match="even"):
    ESTIMATORS.get("elbo")(logits_of(params), _seqs(), jax.random.key(0),
                           EstimatorConfig(num_samples=3, coupled=True), MASK)
