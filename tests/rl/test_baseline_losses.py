"""wd1 and ESPO: each registered loss against a line-by-line numpy transcription of its
official ``compute_loss`` and against hand-computed values."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from dllm_rl.config import recipes
from dllm_rl.diffusion.estimators import Likelihood
from dllm_rl.rl import losses

B, G, L = 3, 4, 6


def _rand(key, shape, scale=1.0):
  return scale * jax.random.normal(jax.random.key(key), shape, jnp.float32)


def _lik(token_BGL):
  return Likelihood(token_BL=token_BGL, seq_B=token_BGL.sum(-1),
                    entropy_B=jnp.zeros(token_BGL.shape[:2]))


def _batch(seed):
  """Per-token log-probs (0 off the action, as every estimator returns them), the action
  mask (first EOS at varying positions) and centered rewards' advantages."""
  first_eos = np.array([[6, 2, 4, 1], [3, 6, 5, 6], [1, 1, 2, 6]])
  mask = np.arange(L)[None, None, :] < first_eos[..., None]
  token = jnp.where(mask, -jnp.abs(_rand(seed, (B, G, L))), 0.0)
  rewards = np.asarray(jax.random.bernoulli(jax.random.key(seed + 1), 0.5, (B, G)), np.float32)
  adv = rewards - rewards.mean(-1, keepdims=True)
  return token, jnp.asarray(mask), adv


# ----------------------------------------------------------------------------------- wd1


def _wd1_official(per_token_logps, completion_mask, advantages):
  """xiaohangt/wd1 RevDiffuGRPOTrainer.compute_loss, one call per device micro-batch (one
  group of G), averaged over the micro-batches as DDP / gradient accumulation do."""
  out = []
  for logp, cmask, adv in zip(per_token_logps, completion_mask, advantages):
    is_weights = np.exp(adv) / np.exp(adv).sum()
    ce_loss = -((logp * cmask).sum(-1) * is_weights).sum()
    n_is_weights = np.exp(-adv) / np.exp(-adv).sum()
    min_likeli_loss = ((logp * cmask).sum(-1) * n_is_weights).sum()
    out.append(ce_loss + min_likeli_loss)
  return np.mean(out)


def test_wd1_matches_the_official_loss_and_needs_no_old_policy():
  token, mask, adv = _batch(0)
  fn = losses.LOSSES.get("wd1")
  adv_BGL = jnp.where(mask, jnp.asarray(adv)[..., None], 0.0)
  lengths = mask.sum(-1).astype(jnp.float32)
  cfg = losses.LossConfig()
  loss, metrics = fn(_lik(token), _lik(token + 3.0), adv_BGL, mask, lengths, cfg)
  expected = _wd1_official(np.asarray(token, np.float64), np.asarray(mask), adv.astype(np.float64))
  assert float(loss) == pytest.approx(expected, rel=1e-5)
  assert float(metrics["clip_fraction"]) == 0.0
  # ratio-free: ℓ̂_old changes nothing
  other, _ = fn(_lik(token), _lik(_rand(9, (B, G, L), 5.0)), adv_BGL, mask, lengths, cfg)
  assert float(other) == float(loss)
  # the gradient: −(w⁺ − w⁻)/B on every action token, 0 elsewhere
  grad = jax.grad(lambda t: fn(_lik(t), _lik(t), adv_BGL, mask, lengths, cfg)[0])(token)
  w_pos = np.exp(adv) / np.exp(adv).sum(-1, keepdims=True)
  w_neg = np.exp(-adv) / np.exp(-adv).sum(-1, keepdims=True)
  want = np.where(mask, -(w_pos - w_neg)[..., None] / B, 0.0)
  np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-8)


def test_wd1_by_hand_for_two_completions():
  """G = 2, A = (a, −a): w⁺ = (σ(2a), σ(−2a)), w⁻ reversed, so w⁺ − w⁻ = ±tanh(a) and
  L = −tanh(a)·(ℓ̂_1 − ℓ̂_2); the same constant added to both ℓ̂ changes nothing."""
  a, l1, l2 = 0.5, -3.0, -7.0
  logp = jnp.array([[l1, l2]])
  adv = jnp.array([[a, -a]])
  assert float(losses.wd1_loss(logp, adv)) == pytest.approx(-math.tanh(a) * (l1 - l2), rel=1e-6)
  assert float(losses.wd1_loss(logp + 11.0, adv)) == pytest.approx(
      float(losses.wd1_loss(logp, adv)), rel=1e-5)
  w_pos, w_neg = losses.wd1_weights(_rand(3, (B, G), 2.0))
  np.testing.assert_allclose(w_pos.sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(w_neg.sum(-1), 1.0, rtol=1e-6)
  assert np.all(np.asarray(w_pos) >= 0) and np.all(np.asarray(w_neg) >= 0)


# ---------------------------------------------------------------------------------- ESPO


def _espo_official(elbo, old_elbo, advantages, logits_to_keep, eps):
  """ML-GSAI/ESPO ESPOTrainer.compute_loss on one micro-batch of sequences (flat)."""
  coef_1 = np.exp((elbo - old_elbo) / logits_to_keep)
  coef_2 = np.clip(coef_1, 1 - eps, 1 + eps)
  per_token_loss1 = coef_1 * advantages
  per_token_loss2 = coef_2 * advantages
  return -np.minimum(per_token_loss1, per_token_loss2).sum() / elbo.shape[0]


def test_espo_matches_the_official_loss():
  token, mask, adv = _batch(4)
  # ratios exp(Δ/L) on both sides of [1 − ε, 1 + ε]
  old = token.sum(-1) + _rand(5, (B, G), 0.4 * L)
  fn = losses.LOSSES.get("espo")
  adv_BGL = jnp.where(mask, jnp.asarray(adv)[..., None], 0.0)
  cfg = losses.LossConfig(eps=0.2)
  old_lik = Likelihood(token_BL=jnp.zeros((B, G, L)), seq_B=old, entropy_B=jnp.zeros((B, G)))
  loss, metrics = fn(_lik(token), old_lik, adv_BGL, mask, mask.sum(-1), cfg)
  elbo = np.asarray(token, np.float64).sum(-1).reshape(-1)
  expected = _espo_official(elbo, np.asarray(old, np.float64).reshape(-1), adv.reshape(-1), L, 0.2)
  assert float(loss) == pytest.approx(expected, rel=1e-5)
  ratio = np.exp((elbo - np.asarray(old, np.float64).reshape(-1)) / L)
  clipped = ((adv.reshape(-1) > 0) & (ratio > 1.2)) | ((adv.reshape(-1) < 0) & (ratio < 0.8))
  assert 0 < clipped.sum() < clipped.size
  assert float(metrics["clip_fraction"]) == pytest.approx(clipped.mean())


def test_espo_by_hand():
  """L = 4, one group of two rewarded completions with ρ̂ = (1.1, 2.0): the second is clipped
  at 1.2, loss = −(1.1 + 1.2)/2, and only the first gets a gradient, −ρ̂ A / (L · 2)."""
  length = 4
  old = jnp.zeros((1, 2))
  elbo = jnp.array([[length * math.log(1.1), length * math.log(2.0)]])
  adv = jnp.ones((1, 2))
  assert float(losses.espo(elbo, old, adv, length, 0.2)) == pytest.approx(-1.15, rel=1e-6)
  grad = jax.grad(losses.espo)(elbo, old, adv, length, 0.2)
  np.testing.assert_allclose(grad, [[-1.1 / (length * 2), 0.0]], rtol=1e-5)


def test_espo_kl_is_the_steps_k2_at_beta_over_length():
  """The official KL, β · Σ_b k2(ELBO_θ, ELBO_ref) / (batch · L) with k2 = (Δ)²/2
  (``compute_approx_kl(..., "k2")``), is the step's kl_coef · kl_penalty(k2) with the
  recipe's kl_coef = β / L."""
  beta, length = 1e-3, 256
  elbo, ref = _rand(6, (B, G), 30.0), _rand(7, (B, G), 30.0)
  d = np.asarray(elbo, np.float64) - np.asarray(ref, np.float64)
  official = beta * (d ** 2 / 2.0).sum() / (B * G * length)
  config = ml_collections.ConfigDict({"data": {"completion_len": length}})
  kl_coef = recipes.espo(config)["rl.kl_coef"]
  assert recipes.espo(config)["rl.kl_estimator"] == "k2"
  ours = kl_coef * float(losses.kl_penalty(elbo, ref, "k2"))
  assert ours == pytest.approx(official, rel=1e-5)
