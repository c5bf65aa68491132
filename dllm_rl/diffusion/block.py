"""Block diffusion (SDAR / BD3-LM): the per-block ELBO in one forward pass.

A block-diffusion model is causal across blocks of ``block_size`` tokens and
bidirectional within a block. Its training objective / likelihood estimate
scores every block's masked tokens given the *clean* history:

    ℓ̂ = Σ_b ELBO_b,   ELBO_b = (1/t_b) Σ_{i ∈ M_b} log p_θ(o_i | q, o_<b, õ_b) / L

with a masking rate t_b ~ U[t_eps, 1] and mask M_b ~ Bernoulli(t_b) per block.
Instead of one forward per block, the sequence is laid out as
[prompt | clean completion | noisy completion] (the noisy copy shares the clean
copy's position ids) under staircase attention (dllm_rl.kernels.staircase), so
all blocks are scored in ONE pass; :func:`block_elbo_loop` is the per-block
reference it must equal.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dllm_rl.diffusion.estimators import (
  ESTIMATORS,
  Estimator,
  EstimatorConfig,
  Likelihood,
  batch_entropy,
  draws_entropy,
  mask_prompt,
  scoring_draws_mean,
)
from dllm_rl.diffusion.scoring import ModelScorer
from dllm_rl.kernels.block_mask import block_causal_mask
from dllm_rl.models import transformer
from dllm_rl.models.layers import StaircaseSpec
from dllm_rl.models.logprob import logp_entropy_reference
from dllm_rl.types import SequenceBatch


def block_masks(key, seqs: SequenceBatch, cfg: EstimatorConfig):
  """Per-block rates t [K, B, nb] and masks [K, B, L] (subset of the valid completion)."""
  b, l = seqs.completion_BL.shape
  if cfg.block_size <= 0:
    raise ValueError(f"block_elbo needs a block-diffusion model: block_size={cfg.block_size}")
  if l % cfg.block_size:
    raise ValueError(f"completion length {l} is not a multiple of block_size={cfg.block_size}")
  nb = l // cfg.block_size
  k_t, k_m = jax.random.split(key)
  t_KBb = (1.0 - cfg.t_eps) * jax.random.uniform(k_t, (cfg.num_samples, b, nb)) + cfg.t_eps
  t_KBL = jnp.repeat(t_KBb, cfg.block_size, axis=-1)
  u_KBL = jax.random.uniform(k_m, (cfg.num_samples, b, l))
  return t_KBL, (u_KBL < t_KBL) & seqs.completion_valid_BL


def _positions(seqs: SequenceBatch):
  """Prompt positions from its valid tokens; the completion continues them."""
  p_pos = transformer.positions_from_valid(seqs.prompt_valid_BP)
  start = seqs.prompt_valid_BP.sum(-1, keepdims=True)
  c_pos = start + jnp.arange(seqs.completion_BL.shape[1])[None, :]
  return p_pos, c_pos


def _contribution(logp_BL, masked_BL, t_BL, valid_BL):
  length_B = jnp.maximum(valid_BL.sum(-1), 1).astype(jnp.float32)
  return jnp.where(masked_BL, logp_BL / t_BL, 0.0) / length_B[:, None]


def _block_draw(key, seqs: SequenceBatch, cfg: EstimatorConfig, mask_id: int) -> dict:
  k_mask, k_prompt = jax.random.split(key)
  t_KBL, masked_KBL = block_masks(k_mask, seqs, cfg)
  keys = jax.random.split(k_prompt, cfg.num_samples)
  prompt_KBP = jax.vmap(lambda k: mask_prompt(k, seqs, cfg.prompt_mask_prob, mask_id))(keys)
  return {"prompt_BP": prompt_KBP,
          "noisy_BL": jnp.where(masked_KBL, mask_id, seqs.completion_BL[None]),
          "scored_BL": masked_KBL, "t_BL": t_KBL}


def staircase_forward(scorer, seqs: SequenceBatch, draw: dict, cfg: EstimatorConfig, *,
                      completion_keys_BL=None):
  """One staircase pass on [prompt | clean completion | noisy completion], scored
  at the noisy copy's rows. The completion keys attended are ``completion_keys_BL``
  (default: the valid completion, i.e. nothing after the action)."""
  p, l = seqs.prompt_BP.shape[1], seqs.completion_BL.shape[1]
  p_pos, c_pos = _positions(seqs)
  positions_BN = jnp.concatenate([p_pos, c_pos, c_pos], axis=1)
  keys_BL = seqs.completion_valid_BL if completion_keys_BL is None else completion_keys_BL
  key_valid_BN = jnp.concatenate([seqs.prompt_valid_BP, keys_BL, keys_BL], axis=1)
  spec = StaircaseSpec(key_valid_BN, prompt_len=p, block_size=cfg.block_size,
                       impl=cfg.attention_impl, prompt_block_causal=cfg.prompt_block_causal)
  tokens_BN = jnp.concatenate([draw["prompt_BP"], seqs.completion_BL, draw["noisy_BL"]], axis=1)
  return scorer(tokens_BN, positions_BN, spec, p + l, seqs.completion_BL)


def _block_reduce(logp_KBL, ent_KBL, seqs: SequenceBatch, draws: dict,
                  cfg: EstimatorConfig) -> Likelihood:
  contrib_KBL = jax.vmap(_contribution, in_axes=(0, 0, 0, None))(
      logp_KBL, draws["scored_BL"], draws["t_BL"], seqs.completion_valid_BL)
  token_BL = contrib_KBL.mean(0)
  return Likelihood(token_BL=token_BL, seq_B=token_BL.sum(-1),
                    entropy_B=draws_entropy(ent_KBL, draws["scored_BL"]))


block_elbo = ESTIMATORS.register("block_elbo")(Estimator(
    draw=_block_draw, forward=staircase_forward, reduce=_block_reduce,
    doc="Σ_b ELBO_b for every block in one staircase forward pass per Monte-Carlo draw."))


def block_elbo_loop(logits_fn, seqs: SequenceBatch, key, cfg: EstimatorConfig,
                    mask_id: int) -> Likelihood:
  """Reference for :func:`block_elbo`: one forward per block b on
  [prompt | clean blocks < b | noisy block b] with a dense block-causal mask
  (same masks and rates for the same key)."""
  p, l = seqs.prompt_BP.shape[1], seqs.completion_BL.shape[1]
  bs = cfg.block_size
  k_mask, k_prompt = jax.random.split(key)
  t_KBL, masked_KBL = block_masks(k_mask, seqs, cfg)
  keys = jax.random.split(k_prompt, cfg.num_samples)
  p_pos, c_pos = _positions(seqs)
  contribs, ents = [], []
  for k in range(cfg.num_samples):
    prompt_BP = mask_prompt(keys[k], seqs, cfg.prompt_mask_prob, mask_id)
    logp_BL = jnp.zeros(seqs.completion_BL.shape, jnp.float32)
    ent_num = jnp.zeros(seqs.completion_BL.shape[:1], jnp.float32)
    for blk in range(l // bs):
      end = (blk + 1) * bs
      noisy = jnp.where(masked_KBL[k, :, blk * bs:end], mask_id,
                        seqs.completion_BL[:, blk * bs:end])
      comp = jnp.concatenate([seqs.completion_BL[:, :blk * bs], noisy], axis=1)
      tokens = jnp.concatenate([prompt_BP, comp], axis=1)
      positions = jnp.concatenate([p_pos, c_pos[:, :end]], axis=1)
      mask = block_causal_mask(seqs.prompt_valid_BP, end, bs, cfg.prompt_block_causal)
      logits = logits_fn(tokens, positions, mask)[:, p + blk * bs:p + end]
      logp, ent = logp_entropy_reference(logits, seqs.completion_BL[:, blk * bs:end])
      logp_BL = logp_BL.at[:, blk * bs:end].set(logp)
      ent_num = ent_num + jnp.where(masked_KBL[k, :, blk * bs:end], ent, 0.0).sum(-1)
    contribs.append(_contribution(logp_BL, masked_KBL[k], t_KBL[k], seqs.completion_valid_BL))
    ents.append(ent_num / jnp.maximum(masked_KBL[k].sum(-1), 1))
  token_BL = jnp.stack(contribs).mean(0)
  entropy_B = scoring_draws_mean(jnp.stack(ents), masked_KBL.any(-1))  # as draws_entropy
  return Likelihood(token_BL=token_BL, seq_B=token_BL.sum(-1), entropy_B=entropy_B)


def block_sft_loss(graphdef, params, batch: SequenceBatch, key, *, mask_id: int, t_eps: float,
                   block_size: int, attention_impl: str = "auto",
                   prompt_block_causal: bool = False, logits_chunk: int = 0):
  """Block-diffusion SFT: −Σ_b ELBO_b (one draw per sequence), mean over the batch."""
  cfg = EstimatorConfig(num_samples=1, t_eps=t_eps, block_size=block_size,
                        attention_impl=attention_impl, prompt_block_causal=prompt_block_causal)
  lik = block_elbo(ModelScorer(graphdef, params, logits_chunk), batch, key, cfg, mask_id)
  loss = -lik.seq_B.mean()
  return loss, {"loss": loss, "entropy": batch_entropy(lik.entropy_B)}
