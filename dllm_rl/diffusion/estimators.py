"""Likelihood estimators ℓ̂_θ(o | q) for masked-diffusion policies, registered by name.

log π_θ(o | q) is intractable for a dLLM; RL methods replace it with an
estimate. Every estimator has the signature

    estimator(logits_fn, seqs: SequenceBatch, key, cfg: EstimatorConfig, mask_id) -> Likelihood

where ``logits_fn(tokens_BN, positions_BN, mask_B1N) -> float32 logits_BNV``
closes over the parameters (θ, θ_old or a reference). All randomness (masking
rates, masks) comes from ``key``: calling an estimator twice with the same key
and different parameters uses the same masks, which is how θ and θ_old share
noise (``antithetic``) so that it cancels in log ρ̂ = ℓ̂_θ − ℓ̂_old; the
official setup gives them independent keys instead (see dllm_rl.rl.step).

Invariant: ``seq_B == token_BL.sum(-1)`` and ``token_BL`` is 0 outside
``completion_valid_BL``. Everything is float32.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from dllm_rl.diffusion.sft import sequence_inputs, token_log_probs
from dllm_rl.registry import Registry
from dllm_rl.types import SequenceBatch

ESTIMATORS: Registry = Registry("likelihood estimator")


@dataclasses.dataclass(frozen=True)
class EstimatorConfig:
  """Static options (from ``config.estimator``); each estimator reads what it needs."""

  num_samples: int = 1        # K Monte-Carlo draws of (t, mask)
  antithetic: bool = False    # θ and θ_old share masks (RL step); False = official independent masks
  coupled: bool = False       # elbo: complementary mask pairs (m, 1 − m)
  stratified: bool = False    # elbo: t_k = (k + u_k) / K
  prompt_mask_prob: float = 0.0  # mask prompt tokens with this probability (d1 uses 0.15)
  t_eps: float = 1e-3         # masking rates t ∈ [t_eps, 1]
  reduction: str = "mean"     # mean_field: per-sequence "sum" or length-"mean"
  spg_beta: float = 1.5       # spg_block: EUBO exponent β
  spg_omega: float = 0.5      # spg_block: EUBO weight ω for negative advantages
  spg_block_len: int = 32     # spg_block: block length of the block-wise masking
  block_size: int = 4         # block_elbo: the model's block size (from config.model.block_size)
  attention_impl: str = "auto"  # block_elbo: staircase attention auto | pallas | interpret | reference
  prompt_block_causal: bool = False  # block_elbo: block-causal prompt attention (SDAR)

  @classmethod
  def from_config(cls, est_cfg, block_size: int = 0,
                  prompt_block_causal: bool = False) -> "EstimatorConfig":
    d = dict(est_cfg)
    d.pop("name", None)
    return cls(**d, **({"block_size": block_size,
                        "prompt_block_causal": prompt_block_causal} if block_size else {}))


@struct.dataclass
class Likelihood:
  """Per-token contributions, the per-sequence estimate and diagnostics.

  ``entropy_B``: mean predictive entropy (nats) over the scored (masked)
  completion positions — a cheap policy-entropy diagnostic. ``extra`` holds
  estimator-specific per-sequence terms (e.g. the EUBO of ``spg_block``).
  """

  token_BL: jax.Array
  seq_B: jax.Array
  entropy_B: jax.Array
  extra: dict = struct.field(default_factory=dict)


def masked_entropy(logits_BLV, scored_BL):
  logp = jax.nn.log_softmax(logits_BLV.astype(jnp.float32), axis=-1)
  ent_BL = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
  n = jnp.maximum(scored_BL.sum(-1), 1)
  return jnp.where(scored_BL, ent_BL, 0.0).sum(-1) / n


def mask_prompt(key, seqs: SequenceBatch, prob: float, mask_id: int) -> jax.Array:
  """Mask each valid prompt token with probability ``prob`` (d1's prompt masking)."""
  if prob <= 0:
    return seqs.prompt_BP
  hit = jax.random.bernoulli(key, prob, seqs.prompt_BP.shape) & seqs.prompt_valid_BP
  return jnp.where(hit, mask_id, seqs.prompt_BP)


def score_completion(logits_fn, seqs: SequenceBatch, prompt_BP, noisy_BL):
  """Forward pass on (prompt, noisy completion); float32 (log p of the clean
  completion tokens, completion logits)."""
  tokens_BN, positions_BN, mask_B1N = sequence_inputs(prompt_BP, seqs.prompt_valid_BP, noisy_BL)
  logits_BLV = logits_fn(tokens_BN, positions_BN, mask_B1N)[:, prompt_BP.shape[1]:]
  return token_log_probs(logits_BLV, seqs.completion_BL), logits_BLV


@ESTIMATORS.register("mean_field")
def mean_field(logits_fn, seqs: SequenceBatch, key, cfg: EstimatorConfig, mask_id: int) -> Likelihood:
  """d1 / diffu-GRPO one-step estimate: mask every completion position (and prompt
  tokens with p = prompt_mask_prob), one forward, ℓ̂ = Σ_i log p(o_i | q̃, all masked)
  over the valid tokens i (``reduction="sum"``) or its mean over their number
  (``"mean"``). As in d1, positions after the action are masks in the input too."""
  valid_BL = seqs.completion_valid_BL
  prompt_BP = mask_prompt(key, seqs, cfg.prompt_mask_prob, mask_id)
  noisy_BL = jnp.full_like(seqs.completion_BL, mask_id)
  logp_BL, logits_BLV = score_completion(logits_fn, seqs, prompt_BP, noisy_BL)
  token_BL = jnp.where(valid_BL, logp_BL, 0.0)
  if cfg.reduction == "mean":
    token_BL = token_BL / jnp.maximum(valid_BL.sum(-1, keepdims=True), 1)
  return Likelihood(token_BL=token_BL, seq_B=token_BL.sum(-1),
                    entropy_B=masked_entropy(logits_BLV, valid_BL))


def elbo_draws(key, batch: int, cfg: EstimatorConfig) -> jax.Array:
  """Masking rates t [K, B]: i.i.d. U[t_eps, 1], or stratified (t_k = (k + u)/K).

  ``coupled``: t ~ U[t_eps, 1 − t_eps], an interval symmetric about 1/2, so that
  the complement's rate 1 − t has the same law as t and each half of the pair is
  an unbiased estimate of the same objective (with U[t_eps, 1] the complement
  would cover [0, 1 − t_eps] instead).
  """
  k = cfg.num_samples // 2 if cfg.coupled else cfg.num_samples
  u = jax.random.uniform(key, (k, batch), jnp.float32)
  if cfg.stratified:
    u = (jnp.arange(k, dtype=jnp.float32)[:, None] + u) / k
  hi = 1.0 - cfg.t_eps if cfg.coupled else 1.0
  return (hi - cfg.t_eps) * u + cfg.t_eps


@ESTIMATORS.register("elbo")
def elbo(logits_fn, seqs: SequenceBatch, key, cfg: EstimatorConfig, mask_id: int) -> Likelihood:
  """LLaDA / VRPO ELBO, K Monte-Carlo samples:

      ELBO_k = (1/t_k) Σ_{i ∈ M_k} log p_θ(o_i | q, o ⊙ M_k) / L,   ℓ̂ = mean_k ELBO_k

  with M_k ~ Bernoulli(t_k) over the valid completion tokens and L their count
  (an unbiased estimate of the LLaDA SFT objective's negative, per sequence).
  ``coupled``: draws come in complementary pairs (M, ¬M) with rates (t, 1 − t),
  t ~ U[t_eps, 1 − t_eps] (:func:`elbo_draws`) — each half unbiased for the
  objective over that t range, together they score every token once. ``stratified``:
  stratified t over the K draws. Prompt tokens are masked with
  ``prompt_mask_prob`` independently per draw.
  """
  if cfg.coupled and cfg.num_samples % 2:
    raise ValueError(f"coupled ELBO needs an even num_samples, got {cfg.num_samples}")
  b, l = seqs.completion_BL.shape
  valid_BL = seqs.completion_valid_BL
  k_t, k_m, k_p = jax.random.split(key, 3)
  t_KB = elbo_draws(k_t, b, cfg)
  u_KBL = jax.random.uniform(k_m, (t_KB.shape[0], b, l), jnp.float32)
  masked_KBL = (u_KBL < t_KB[..., None]) & valid_BL
  weight_KB = 1.0 / t_KB
  if cfg.coupled:
    masked_KBL = jnp.concatenate([masked_KBL, ~masked_KBL & valid_BL], axis=0)
    weight_KB = jnp.concatenate([weight_KB, 1.0 / (1.0 - t_KB)], axis=0)
  length_B = jnp.maximum(valid_BL.sum(-1), 1).astype(jnp.float32)
  num = masked_KBL.shape[0]

  def one(carry, xs):
    masked_BL, weight_B, k = xs
    prompt_BP = mask_prompt(k, seqs, cfg.prompt_mask_prob, mask_id)
    noisy_BL = jnp.where(masked_BL, mask_id, seqs.completion_BL)
    logp_BL, logits_BLV = score_completion(logits_fn, seqs, prompt_BP, noisy_BL)
    contrib_BL = jnp.where(masked_BL, logp_BL, 0.0) * (weight_B / length_B)[:, None]
    return carry, (contrib_BL, masked_entropy(logits_BLV, masked_BL))

  _, (contrib_KBL, ent_KB) = jax.lax.scan(
      one, None, (masked_KBL, weight_KB, jax.random.split(k_p, num)))
  token_BL = contrib_KBL.mean(0)
  return Likelihood(token_BL=token_BL, seq_B=token_BL.sum(-1), entropy_B=ent_KB.mean(0))
