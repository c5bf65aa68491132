"""LLaDA supervised fine-tuning objective for masked diffusion.

    L_SFT = −E_t [ (1/t) Σ_{i masked} log p_θ(x0_i | x_t) ] / L_answer

(LLaDA, Nie et al. 2025, Eq. (5) / SFT guideline): each sequence's masked
log-likelihood is reweighted by 1/t and normalised by its completion length
(answer + EOS fill); the batch loss is the mean over sequences.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dllm_rl.diffusion import masking
from dllm_rl.models import logprob, transformer
from dllm_rl.types import SequenceBatch


def sequence_inputs(prompt_BP, prompt_valid_BP, completion_BL):
  """Concatenate prompt and completion; positions and key-padding mask [B, 1, N]."""
  tokens_BN = jnp.concatenate([prompt_BP, completion_BL], axis=1)
  valid_BN = jnp.concatenate(
      [prompt_valid_BP, jnp.ones(completion_BL.shape, bool)], axis=1)
  positions_BN = transformer.positions_from_valid(valid_BN)
  return tokens_BN, positions_BN, valid_BN[:, None, :]


def sft_loss(graphdef, params, batch: SequenceBatch, key: jax.Array, *, mask_id: int,
             t_eps: float, logits_chunk: int = 0):
  """Masked-diffusion SFT loss and metrics for one batch (one (t, mask) draw per sequence).

  The head and log-softmax run at the completion rows only, ``logits_chunk`` rows
  at a time (dllm_rl.models.logprob)."""
  k_t, k_m = jax.random.split(key)
  b, p = batch.prompt_BP.shape
  t_B = masking.sample_t(k_t, b, t_eps)
  noisy_BL, masked_BL = masking.forward_mask(
      k_m, batch.completion_BL, batch.completion_valid_BL, t_B, mask_id)
  tokens_BN, positions_BN, mask_B1N = sequence_inputs(
      batch.prompt_BP, batch.prompt_valid_BP, noisy_BL)
  h_BND, head_DV = transformer.apply_hidden(graphdef, params, tokens_BN, positions_BN, mask_B1N)
  logp_BL, _ = logprob.logp_entropy(h_BND[:, p:], head_DV, batch.completion_BL, logits_chunk)
  length_B = jnp.maximum(batch.completion_valid_BL.sum(-1), 1).astype(jnp.float32)
  nll_B = -(jnp.where(masked_BL, logp_BL, 0.0).sum(-1) / t_B) / length_B
  loss = nll_B.mean()
  n_masked = jnp.maximum(masked_BL.sum(), 1)
  metrics = {
      "loss": loss,
      "masked_nll": -jnp.where(masked_BL, logp_BL, 0.0).sum() / n_masked,
      "masked_fraction": masked_BL.sum() / jnp.maximum(batch.completion_valid_BL.sum(), 1),
  }
  return loss, metrics
