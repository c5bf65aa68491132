"""wd1: the ratio-free weighted-likelihood policy loss.

wd1 (Tang, Dolga, Yoon, Bogunovic 2025, arXiv 2507.08838, "wd1: Weighted Policy
Optimization for Reasoning in Diffusion Language Models") replaces GRPO's ratio
ρ̂ = π_θ/π_old — which a dLLM can only estimate, with the errors amplified by the
exponential — by a weighted log-likelihood of the current policy alone. Its
objective (the paper's weighted policy-optimisation loss, positive samples
weighted up and negative samples "unlearnt"), as the official code computes it
(xiaohangt/wd1, ``wd1/trainers/rev_grpo_trainer.py``,
``RevDiffuGRPOTrainer.compute_loss``: the ``wll_d1_neg`` trainer of
``run/wll_NP_*.sh``), per group of G completions of one prompt:

    w⁺_i = exp(A_i) / Σ_j exp(A_j),      w⁻_i = exp(−A_i) / Σ_j exp(−A_j),
    L_wd1 = −Σ_i w⁺_i ℓ̂_θ(o_i) + Σ_i w⁻_i ℓ̂_θ(o_i) = −Σ_i (w⁺_i − w⁻_i) ℓ̂_θ(o_i),

with A_i = r_i − mean_G r (centered, the official advantages), ℓ̂_θ the d1
one-step estimate summed over the completion tokens through the first EOS
(``mean_field`` with ``reduction="sum"`` and prompt masking 0.15), and the mean
over groups (one group per device micro-batch in the official runs: 6 completions
per device, ``num_generations`` = 6). The old policy enters only as the sampler of
the completions: there is no ratio and no ℓ̂_old; the weights are constants
(functions of the rewards), so the gradient is −Σ_i (w⁺_i − w⁻_i) ∇ℓ̂_θ(o_i).

Properties the tests pin: w⁺, w⁻ ≥ 0 and each sums to 1 per group, so
Σ_i (w⁺_i − w⁻_i) = 0 and the loss does not change when the same constant is
added to every ℓ̂ of a group; for G = 2 and A = (a, −a) the loss is
−tanh(a)·(ℓ̂_1 − ℓ̂_2).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def wd1_weights(adv_BG):
  """(w⁺, w⁻): softmax over the group of A and of −A, float32, stop-gradient."""
  adv_BG = jax.lax.stop_gradient(jnp.asarray(adv_BG, jnp.float32))
  return jax.nn.softmax(adv_BG, axis=-1), jax.nn.softmax(-adv_BG, axis=-1)


def wd1_loss(logp_BG, adv_BG):
  """L_wd1 = −mean_B Σ_g (w⁺_g − w⁻_g) ℓ̂_θ(o_g) (module docstring); ``logp_BG`` is the
  differentiable ℓ̂_θ, ``adv_BG`` the per-sequence advantages."""
  w_pos_BG, w_neg_BG = wd1_weights(adv_BG)
  return -((w_pos_BG - w_neg_BG) * logp_BG).sum(-1).mean()
