"""Sandwiched Policy Gradient (SPG) policy loss.

SPG (Wang et al. 2025; facebookresearch/SPG ``SPGTrainer.compute_loss`` and
``_get_per_seq_logps``; reused by StableDRL ``compute_loss_spg``) maximises a
lower bound of log π for rewarded completions and an upper bound for
penalised ones, so that neither direction exploits the bound's slack:

    ℓ̂^SPG_i = ELBO_i                          if A_i > 0
            = ω·EUBO_i + (1 − ω)·ELBO_i        if A_i ≤ 0   (``logp_estimation="mix"``)

(SPG: ``reward_mask = advantages > 0``, so A = 0 takes the mixture; its
weight A·ℓ̂ is 0 either way). With ω = 1 this is SPG's ``"eubo"`` and with
ω = 0 plain ELBO. Loss, with completion lengths |o_i| (tokens through the
first EOS):

    L = −Σ_i |o_i|·A_i·ℓ̂^SPG_i / Σ_i |o_i|

SPG computes that sum over one device micro-batch, which in the official
configs is exactly one group (per_device_train_batch_size = num_generations),
and averages micro-batches by gradient accumulation; here it is computed per
group and averaged over the B groups. Advantages are constants (stop-gradient).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def spg_surrogate(elbo, eubo, adv, omega: float = 0.5):
  """ℓ̂^SPG: the ELBO where A > 0, ω·EUBO + (1 − ω)·ELBO where A ≤ 0 (any shape)."""
  return jnp.where(adv > 0, elbo, omega * eubo + (1.0 - omega) * elbo)


def _weighted_group_mean(obj_BG, lengths_BG):
  w_BG = jnp.ones_like(obj_BG) if lengths_BG is None else lengths_BG.astype(jnp.float32)
  per_group_B = (w_BG * obj_BG).sum(-1) / jnp.maximum(w_BG.sum(-1), 1e-8)
  return per_group_B.mean()


def spg_loss(elbo_BG, eubo_BG, adv_BG, *, omega: float = 0.5, lengths_BG=None):
  """Sequence-level SPG loss −mean_B [Σ_g w_g A_g ℓ̂^SPG_g / Σ_g w_g].

  ``elbo_BG``/``eubo_BG``: per-sequence bounds (``Likelihood.seq_B`` and
  ``extra["eubo_B"]`` of ``spg_block``, differentiable); ``adv_BG``: advantages
  (SPG and StableDRL use centered ones, r − mean_G r); ``lengths_BG``: the
  weights w (SPG: ``completion_mask.sum(1)``); None gives a plain mean.
  """
  adv_BG = jax.lax.stop_gradient(adv_BG).astype(jnp.float32)
  obj_BG = adv_BG * spg_surrogate(elbo_BG, eubo_BG, adv_BG, omega)
  return -_weighted_group_mean(obj_BG, lengths_BG)


def spg_loss_tokens(elbo_token_BGL, eubo_token_BGL, adv_BGL, mask_BGL, *, omega: float = 0.5,
                    lengths_BG=None):
  """Per-token SPG loss: −mean_B [Σ_g w_g Σ_k A_gk ℓ̂^SPG_gk / Σ_g w_g].

  Both bounds are sums of per-token terms (``token_BL`` and
  ``extra["eubo_token_BL"]`` of ``spg_block``), so each token gets
  ℓ̂^SPG_gk = ELBO_gk if A_gk > 0 else ω·EUBO_gk + (1 − ω)·ELBO_gk, weighted by
  its own advantage (StepRS). Tokens outside ``mask_BGL`` carry nothing. With
  A_gk = A_g for all k this equals :func:`spg_loss` in value and gradient.
  """
  adv_BGL = jax.lax.stop_gradient(adv_BGL).astype(jnp.float32)
  surr_BGL = spg_surrogate(elbo_token_BGL, eubo_token_BGL, adv_BGL, omega)
  obj_BG = jnp.where(mask_BGL, adv_BGL * surr_BGL, 0.0).sum(-1)
  return -_weighted_group_mean(obj_BG, lengths_BG)
