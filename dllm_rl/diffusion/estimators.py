"""Likelihood estimators ℓ̂_θ(o | q) for masked-diffusion policies, registered by name.

log π_θ(o | q) is intractable for a dLLM; RL methods replace it with an
estimate. Every estimator is called as

    estimator(model, seqs: SequenceBatch, key, cfg: EstimatorConfig, mask_id) -> Likelihood

where ``model`` is a scorer (dllm_rl.diffusion.scoring: the transformer scored at
the completion rows only, with a chunked vocabulary log-softmax) or any
``logits_fn(tokens_BN, positions_BN, mask) -> float32 logits_BNV``; either closes
over the parameters (θ, θ_old or a reference). All randomness (masking rates,
masks) comes from ``key``: calling an estimator twice with the same key and
different parameters uses the same masks, which is how θ and θ_old share noise
(``antithetic``) so that it cancels in log ρ̂ = ℓ̂_θ − ℓ̂_old; the official setup
gives them independent keys instead (see dllm_rl.rl.step).

An :class:`Estimator` is three functions, so that the RL step can split the work
into micro-batches of sequences and draws (``rl.micro_batch``) and still compute
exactly the full-batch estimate and gradient:

* ``draw(key, seqs, cfg, mask_id) -> draws``: every random choice, for the whole
  batch — a dict of arrays [K, B, ...] (K draws; row b of every array belongs to
  sequence b);
* ``forward(scorer, seqs, draw, cfg) -> (logp_BL, entropy_BL)``: the one forward
  pass of one draw (``draws[k]``), the only part that depends on the parameters;
  row b of the output depends only on row b of the inputs;
* ``reduce(logp_KBL, entropy_KBL, seqs, draws, cfg) -> Likelihood``: the estimate
  from the per-draw log-probs, row by row, without parameters.

Invariant: ``seq_B == token_BL.sum(-1)`` and ``token_BL`` is 0 outside
``completion_valid_BL``. Everything is float32.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from flax import struct

from dllm_rl.diffusion.scoring import as_scorer
from dllm_rl.diffusion.sft import sequence_inputs
from dllm_rl.models.logprob import token_log_probs
from dllm_rl.registry import Registry
from dllm_rl.types import SequenceBatch

ESTIMATORS: Registry = Registry("likelihood estimator", key="estimator.name")


REDUCTIONS = ("sum", "mean")  # per-sequence sum or length-mean
REDUCIBLE = ("mean_field", "elbo", "trajectory")  # the estimators that read cfg.reduction


@dataclasses.dataclass(frozen=True)
class EstimatorConfig:
  """Static options (from ``config.estimator``); each estimator reads what it needs."""

  num_samples: int = 1        # K Monte-Carlo draws of (t, mask)
  antithetic: bool = False    # θ and θ_old share masks (RL step); False = official
                              # independent masks
  coupled: bool = False       # elbo: complementary mask pairs (m, 1 − m)
  full_mask_term: bool = False  # elbo: + ½ log p(o_i | whole completion masked) per token
  stratified: bool = False    # elbo: t_k = (k + u_k) / K
  prompt_mask_prob: float = 0.0  # mask prompt tokens with this probability (d1 uses 0.15)
  t_eps: float = 1e-3         # masking rates t ∈ [t_eps, 1]
  reduction: str = "mean"     # mean_field, elbo, trajectory: per-sequence "sum" or length-"mean"
  spg_beta: float = 1.5       # spg_block: EUBO exponent β
  spg_omega: float = 0.5      # spg_block: EUBO weight ω for negative advantages
  spg_block_len: int = 32     # spg_block: block length of the block-wise masking
  block_size: int = 0         # block_elbo, trajectory: model.block_size (0 = bidirectional model)
  attention_impl: str = "auto"  # block_elbo: staircase attention auto | pallas | mosaic_gpu |
                                # interpret | reference
  prompt_block_causal: bool = False  # block_elbo: block-causal prompt attention (SDAR)
  logits_chunk: int = 0       # rows per vocabulary slab of the scorer (config.model.logits_chunk)
  trajectory_shrink: int = 1  # trajectory: distinct denoising steps per forward pass
                              # (TraceRL shrink)
  num_states: int = 0         # trajectory: the sampler's step budget S over all blocks
                              # (SamplerConfig.max_steps)

  @classmethod
  def from_config(cls, est_cfg, block_size: int = 0, prompt_block_causal: bool = False,
                  logits_chunk: int = 0, num_states: int = 0) -> "EstimatorConfig":
    d = dict(est_cfg)
    d.pop("name", None)
    return cls(**d, logits_chunk=logits_chunk, num_states=num_states,
               **({"block_size": block_size,
                   "prompt_block_causal": prompt_block_causal} if block_size else {}))


@struct.dataclass
class Likelihood:
  """Per-token contributions, the per-sequence estimate and diagnostics.

  ``entropy_B``: mean predictive entropy (nats) over the scored (masked)
  completion positions — a cheap policy-entropy diagnostic; NaN for a sequence with none
  (average it with :func:`batch_entropy`). ``extra`` holds
  estimator-specific per-sequence terms (e.g. the EUBO of ``spg_block``).
  """

  token_BL: jax.Array
  seq_B: jax.Array
  entropy_B: jax.Array
  extra: dict = struct.field(default_factory=dict)


def masked_mean(x_BL, scored_BL):
  """Mean of ``x`` over the scored positions of each row (0 for a row with none)."""
  n = jnp.maximum(scored_BL.sum(-1), 1)
  return jnp.where(scored_BL, x_BL, 0.0).sum(-1) / n


def draws_entropy(ent_KBL, scored_KBL):
  """Mean predictive entropy over each draw's scored positions, averaged over the draws that
  score any (a draw masking none of a short completion says nothing of it); NaN for a
  sequence that no draw scores (:func:`batch_entropy` leaves it out)."""
  return scoring_draws_mean(jax.vmap(masked_mean)(ent_KBL, scored_KBL), scored_KBL.any(-1))


def scoring_draws_mean(per_draw_KB, scores_KB):
  """Each sequence's mean of ``per_draw_KB`` over its draws that score anything
  (``scores_KB``); NaN for a sequence that no draw scores."""
  n_B = scores_KB.sum(0)
  total_B = jnp.where(scores_KB, per_draw_KB, 0.0).sum(0)
  return jnp.where(n_B > 0, total_B / jnp.maximum(n_B, 1), jnp.nan)


def batch_entropy(entropy_B):
  """The batch's mean of ``Likelihood.entropy_B`` over the sequences that have one (not NaN);
  0 when none has (a metric must stay finite). Written out, not through :func:`masked_mean`:
  the same formula, but in the RL step XLA then reduces it in another order, and the metric
  moves in its last bit, so the committed study records (``docs/results.md``, at 4000db6)
  no longer reproduce bit for bit (``dllm_rl.study.reuse``)."""
  has_B = ~jnp.isnan(entropy_B)
  return jnp.where(has_B, entropy_B, 0.0).sum() / jnp.maximum(has_B.sum(), 1)


@dataclasses.dataclass(frozen=True)
class Estimator:
  """A likelihood estimator as draw / forward / reduce (module docstring)."""

  draw: Callable
  forward: Callable
  reduce: Callable
  doc: str = ""  # what it estimates (the paper's equation)

  def __call__(self, model, seqs: SequenceBatch, key, cfg: EstimatorConfig,
               mask_id: int) -> Likelihood:
    draws = self.draw(key, seqs, cfg, mask_id)
    logp_KBL, ent_KBL = score_draws(self, as_scorer(model), seqs, draws, cfg)
    return self.reduce(logp_KBL, ent_KBL, seqs, draws, cfg)


def score_draws(estimator: Estimator, scorer, seqs: SequenceBatch, draws: dict,
                cfg: EstimatorConfig):
  """(logp_KBL, entropy_KBL): ``estimator.forward`` for each of the K draws (a scan)."""
  def one(carry, draw):
    return carry, estimator.forward(scorer, seqs, draw, cfg)

  _, out = jax.lax.scan(one, None, draws)
  return out


def mask_prompt(key, seqs: SequenceBatch, prob: float, mask_id: int) -> jax.Array:
  """Mask each valid prompt token with probability ``prob`` (d1's prompt masking)."""
  if prob <= 0:
    return seqs.prompt_BP
  hit = jax.random.bernoulli(key, prob, seqs.prompt_BP.shape) & seqs.prompt_valid_BP
  return jnp.where(hit, mask_id, seqs.prompt_BP)


def score_completion(logits_fn, seqs: SequenceBatch, prompt_BP, noisy_BL):
  """Forward pass on (prompt, noisy completion); float32 (log p of the clean
  completion tokens, completion logits). Full logits: for tests and references."""
  tokens_BN, positions_BN, mask_B1N = sequence_inputs(prompt_BP, seqs.prompt_valid_BP, noisy_BL)
  logits_BLV = logits_fn(tokens_BN, positions_BN, mask_B1N)[:, prompt_BP.shape[1]:]
  return token_log_probs(logits_BLV, seqs.completion_BL), logits_BLV


def masked_forward(scorer, seqs: SequenceBatch, draw: dict, cfg: EstimatorConfig):
  """One forward on [noisy prompt | noisy completion] (key padding only), scored at
  the completion rows: the ``forward`` of the masked-diffusion estimators."""
  del cfg
  prompt_BP = draw["prompt_BP"]
  tokens_BN, positions_BN, mask_B1N = sequence_inputs(prompt_BP, seqs.prompt_valid_BP,
                                                      draw["noisy_BL"])
  return scorer(tokens_BN, positions_BN, mask_B1N, prompt_BP.shape[1], seqs.completion_BL)


def _mean_field_draw(key, seqs: SequenceBatch, cfg: EstimatorConfig, mask_id: int) -> dict:
  prompt_BP = mask_prompt(key, seqs, cfg.prompt_mask_prob, mask_id)
  return {"prompt_BP": prompt_BP[None],
          "noisy_BL": jnp.full_like(seqs.completion_BL, mask_id)[None],
          "scored_BL": seqs.completion_valid_BL[None]}


def _mean_field_reduce(logp_KBL, ent_KBL, seqs: SequenceBatch, draws: dict,
                       cfg: EstimatorConfig) -> Likelihood:
  valid_BL = seqs.completion_valid_BL
  token_BL = jnp.where(valid_BL, logp_KBL[0], 0.0)
  if cfg.reduction == "mean":
    token_BL = token_BL / jnp.maximum(valid_BL.sum(-1, keepdims=True), 1)
  return Likelihood(token_BL=token_BL, seq_B=token_BL.sum(-1),
                    entropy_B=draws_entropy(ent_KBL, draws["scored_BL"]))


mean_field = ESTIMATORS.register("mean_field")(Estimator(
    draw=_mean_field_draw, forward=masked_forward, reduce=_mean_field_reduce,
    doc="""d1 / diffu-GRPO one-step estimate: mask every completion position (and
prompt tokens with p = prompt_mask_prob), one forward, ℓ̂ = Σ_i log p(o_i | q̃, all masked)
over the valid tokens i (``reduction="sum"``) or its mean over their number (``"mean"``).
As in d1, positions after the action are masks in the input too. (One draw whatever K.)"""))


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


def _elbo_draw(key, seqs: SequenceBatch, cfg: EstimatorConfig, mask_id: int) -> dict:
  """The K (t, mask) draws; ``weight_B`` is each draw's whole weight in the estimate (1/t,
  1/K, 1/L with ``reduction="mean"``), so that ``reduce`` sums over draws. With
  ``full_mask_term`` a last draw masks the whole completion, at weight ½."""
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
  noisy_KBL = jnp.where(masked_KBL, mask_id, seqs.completion_BL[None])
  weight_KB = weight_KB / cfg.num_samples
  if cfg.full_mask_term:  # as mean_field / d1: every completion position a mask in the input
    masked_KBL = jnp.concatenate([masked_KBL, valid_BL[None]], axis=0)
    noisy_KBL = jnp.concatenate([noisy_KBL, jnp.full_like(noisy_KBL[:1], mask_id)], axis=0)
    weight_KB = jnp.concatenate([weight_KB, jnp.full_like(weight_KB[:1], 0.5)], axis=0)
  if cfg.reduction == "mean":
    weight_KB = weight_KB / jnp.maximum(valid_BL.sum(-1), 1).astype(jnp.float32)[None]
  keys = jax.random.split(k_p, masked_KBL.shape[0])
  prompt_KBP = jax.vmap(lambda k: mask_prompt(k, seqs, cfg.prompt_mask_prob, mask_id))(keys)
  return {"prompt_BP": prompt_KBP, "noisy_BL": noisy_KBL, "scored_BL": masked_KBL,
          "weight_B": weight_KB}


def _elbo_reduce(logp_KBL, ent_KBL, seqs: SequenceBatch, draws: dict,
                 cfg: EstimatorConfig) -> Likelihood:
  contrib_KBL = jnp.where(draws["scored_BL"], logp_KBL, 0.0) * draws["weight_B"][..., None]
  token_BL = contrib_KBL.sum(0)
  return Likelihood(token_BL=token_BL, seq_B=token_BL.sum(-1),
                    entropy_B=draws_entropy(ent_KBL, draws["scored_BL"]))


elbo = ESTIMATORS.register("elbo")(Estimator(
    draw=_elbo_draw, forward=masked_forward, reduce=_elbo_reduce,
    doc="""LLaDA / VRPO ELBO, K Monte-Carlo samples:

    ELBO_k = (1/t_k) Σ_{i ∈ M_k} log p_θ(o_i | q, o ⊙ M_k) / L,   ℓ̂ = mean_k ELBO_k

with M_k ~ Bernoulli(t_k) over the valid completion tokens and L their count
(an unbiased estimate of the LLaDA SFT objective's negative, per sequence);
``reduction="sum"`` drops the 1/L (an estimate of log π(o | q) itself, whose
per-token terms are ESPO's and DiffuCoder's token log-probs).
``coupled``: draws come in complementary pairs (M, ¬M) with rates (t, 1 − t),
t ~ U[t_eps, 1 − t_eps] (:func:`elbo_draws`) — each half unbiased for the
objective over that t range, together they score every token once. ``stratified``:
stratified t over the K draws. Prompt tokens are masked with
``prompt_mask_prob`` independently per draw.

``full_mask_term`` (DiffuCoder's coupled-GRPO, apple/ml-diffucoder
``coupled_grpo.py``: ``forward_process`` version 0 and ``selective_log_softmax``):
one more forward with the whole completion masked, and token i's estimate becomes

    ℓ̂_i = ½ [ log p_θ(o_i | q, all masked) + mean_pairs w_i log p_θ(o_i | q, x_pair) ],

w_i = 1/t where i ∈ M, 1/(1 − t) where i ∈ ¬M (with one pair, K = 2: DiffuCoder's
(p0 + weighted(p1, p2)) / 2 exactly). The mean over the pair is a sum over its two
draws (each token is scored in one of them), so ℓ̂ = ½·mean-field + ELBO in expectation,
not an average of the two."""))
