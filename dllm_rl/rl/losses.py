"""Policy losses for estimated likelihood ratios, registered by name.

Sequence-level forms take [B, G] arrays (B prompts, G completions per prompt)
of ℓ̂_θ (``logp``, differentiable), ℓ̂_old and advantages, and return a scalar:
per group, then the mean over groups. Per-token forms take per-token
likelihood contributions ``token_BGL`` (which sum to ℓ̂_θ over L) and per-token
advantages ``adv_BGL``; with an advantage that is constant over L they have the
same value (StableDRL) or the same gradient (GRPO) as the sequence form, and
with StepRS advantages every token's contribution gets its own weight.

Registered losses share the signature

    fn(lik, lik_old, adv_BGL, mask_BGL, lengths_BG, cfg: LossConfig) -> (loss, metrics)

where ``lik``/``lik_old`` are :class:`~dllm_rl.diffusion.estimators.Likelihood`
reshaped to [B, G, ...] (so ``lik.token_BL`` holds [B, G, L] and ``lik.seq_B``
[B, G]) and ``lengths_BG`` counts completion tokens through the first EOS.
Ratios, weights and advantages are float32.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from dllm_rl.registry import Registry
from dllm_rl.rl.spg_loss import (spg_loss, spg_loss_tokens,  # noqa: F401  (public here too)
                                  spg_surrogate)
from dllm_rl.rl.wd1_loss import wd1_loss, wd1_weights  # noqa: F401  (public here too)

LOSSES: Registry = Registry("policy loss", key="rl.loss")
CLIP_MODES = ("upper", "symmetric", "none")
KL_ESTIMATORS = ("k1", "k2", "k3")  # kl_penalty kinds (Schulman)
KL_LEVELS = ("sequence", "token")  # rl.kl_level: kl_penalty | kl_penalty_tokens


@dataclasses.dataclass(frozen=True)
class LossConfig:
  clip: str = "upper"   # stabledrl: "upper" min(ρ, C) | "symmetric" clip(ρ, 1 − ε, 1 + ε)
                        # | "none" ρ (self-normalisation only)
  clip_C: float = 5.0
  eps: float = 0.2
  spg_omega: float = 0.5
  self_normalize: bool = True  # stabledrl: w = c(ρ)/Σ_group c(ρ); False: w = c(ρ)/G (ablation)


def _sg(x):
  return jax.lax.stop_gradient(x)


# ----------------------------------------------------------------------------- GRPO


def grpo(logp_BG, logp_old_BG, adv_BG, eps: float = 0.2):
  """GRPO with conditional clipping and a fixed 1/G (DESIGN "Policy losses"):

      L = −mean_B (1/G) Σ_i min(ρ̂_i A_i, clip(ρ̂_i, 1 − ε, 1 + ε) A_i),
      ρ̂_i = exp(ℓ̂_θ(o_i) − ℓ̂_old(o_i)).

  When A_i < 0 and ρ̂_i > 1 + ε the unclipped term is selected: the gradient
  weight ρ̂_i is unbounded (the "bypass" behind loss spikes).
  """
  return -clipped_objective(logp_BG - _sg(logp_old_BG), adv_BG, eps).mean(-1).mean()


def grpo_active(ratio, adv, eps: float):
  """Where min(ρA, clip(ρ)A) selects a term with gradient (the unclipped one)."""
  return ((adv > 0) & (ratio <= 1 + eps)) | ((adv < 0) & (ratio >= 1 - eps))


def clipped_objective(log_ratio, adv, eps: float):
  """PPO's clipped objective min(ρA, clip(ρ, 1 − ε, 1 + ε)A), ρ = exp(``log_ratio``),
  elementwise, written as the term it selects: ρA where the unclipped term is active
  (:func:`grpo_active`), the constant clip(sg ρ)A elsewhere. Same value and gradient as the
  min, except where ρ overflows float32 (log ρ > 88.7) in a clipped position: there the min's
  gradient is 0 · ∞ = NaN (as in the official PyTorch code), this one's 0. An overflowing
  unclipped (bypassed) term stays ±∞: that is the method's own unbounded weight.
  """
  ratio_sg = jnp.exp(_sg(log_ratio))
  active = grpo_active(ratio_sg, adv, eps)
  # exp of 0 where inactive: the unused branch holds no ∞ for where's gradient to multiply by 0.
  ratio = jnp.exp(jnp.where(active, log_ratio, 0.0))
  return jnp.where(active, ratio * adv, jnp.clip(ratio_sg, 1 - eps, 1 + eps) * adv)


def grpo_tokens(token_BGL, logp_old_BG, adv_BGL, mask_BGL, eps: float = 0.2):
  """Per-token form of :func:`grpo` with the sequence ratio ρ̂_i:

      L = −mean_B (1/G) Σ_i Σ_k sg(ρ̂_i · 1[unclipped term active for A_ik]) A_ik ℓ̂_ik.

  Its gradient equals grpo's when A_ik = A_i (because Σ_k ℓ̂_ik = ℓ̂_i); its
  value is this surrogate's, not the clipped objective's.
  """
  logp_BG = token_BGL.sum(-1)
  ratio_BG = jnp.exp(_sg(logp_BG - logp_old_BG))
  ratio_BG1 = ratio_BG[..., None]
  # where, not a product: a clipped term with an overflowing ratio gives 0, not inf · 0 = NaN.
  coef_BGL = _sg(jnp.where(grpo_active(ratio_BG1, adv_BGL, eps), ratio_BG1, 0.0))
  return -jnp.where(mask_BGL, coef_BGL * adv_BGL * token_BGL, 0.0).sum(-1).mean(-1).mean()


def grpo_token_level(token_BGL, token_old_BGL, adv_BGL, mask_BGL, eps: float = 0.2):
  """d1 / diffu-GRPO token-level variant: per-token ratios ρ̂_ik, the clipped
  objective summed over tokens and divided by the total completion length."""
  obj = clipped_objective(token_BGL - _sg(token_old_BGL), adv_BGL, eps)
  return -jnp.where(mask_BGL, obj, 0.0).sum() / jnp.maximum(mask_BGL.sum(), 1)


# ------------------------------------------------------------------------------ ESPO


def espo(logp_BG, logp_old_BG, adv_BG, length: int, eps: float = 0.2):
  """ESPO (Ou et al. 2025, arXiv 2512.03759, "Principled RL for Diffusion LLMs Emerges
  from a Sequence-Level Perspective"): the whole completion is one action, its
  log-likelihood the sequence ELBO ℓ̂ (a sum over tokens), and the importance ratio is
  normalised per token before PPO's clip:

      ρ̂_i = exp((ℓ̂_θ(o_i) − ℓ̂_old(o_i)) / L),
      L_ESPO = −mean_i min(ρ̂_i A_i, clip(ρ̂_i, 1 − ε, 1 + ε) A_i),

  the mean over all B·G sequences, as the official ``ESPOTrainer.compute_loss``
  (ML-GSAI/ESPO ``espo/espo_trainer.py``: ``coef_1 = exp((elbo − old_elbo) /
  logits_to_keep)``, ``−min(...).sum() / batch_size``), where L = ``length`` is
  the generated length (``logits_to_keep``, the same for every sequence). That
  is GRPO's clipped objective (:func:`grpo`) on ℓ̂ / L. Its KL term, β·mean_i
  (ℓ̂_θ − ℓ̂_ref)² / 2 / L, is the step's ``kl_estimator="k2"`` with
  ``kl_coef`` = β / L.
  """
  return grpo(logp_BG / length, logp_old_BG / length, adv_BG, eps)


# ------------------------------------------------------------------------ StableDRL


def stabledrl_weights(log_ratio_BG, clip: str = "upper", C: float = 5.0, eps: float = 0.2,
                      self_normalize: bool = True):
  """StableDRL self-normalised, unconditionally clipped weights (stop-gradient):

      w_i = c(ρ̂_i) / Σ_{j ∈ group} c(ρ̂_j),
      c(ρ) = min(ρ, C)                  ("upper", official code; a softmax over min(log ρ̂, log C))
      c(ρ) = clip(ρ, 1 − ε, 1 + ε)      ("symmetric")
      c(ρ) = ρ                          ("none": self-normalisation only; a softmax over log ρ̂)

  applied whatever the sign of the advantage: w ≥ 0 and Σ_g w = 1.

  ``self_normalize=False`` is the ablation that keeps only the unconditional
  clip: w_i = c(ρ̂_i)/G with the fixed 1/G of GRPO, so Σ_g w ≠ 1 and the update
  is no longer a convex combination (StableDRL, arXiv 2603.06743, separates the
  two ingredients, unconditional clipping and self-normalisation, in its
  ablations). It needs a bounding clip: with ``clip="none"`` the weight ρ̂/G
  would be unbounded, so that combination is refused.
  """
  log_ratio_BG = _sg(log_ratio_BG.astype(jnp.float32))
  if clip not in CLIP_MODES:
    raise ValueError(f"unknown StableDRL clip mode {clip!r}; choose from {CLIP_MODES}")
  if clip == "none" and not self_normalize:
    raise ValueError("StableDRL with clip='none' and self_normalize=False has unbounded weights"
                     " ρ̂/G; keep one of the two")
  if clip == "symmetric":
    c = jnp.clip(jnp.exp(log_ratio_BG), 1 - eps, 1 + eps)
    return c / (c.sum(-1, keepdims=True) if self_normalize else c.shape[-1])
  log_c = jnp.minimum(log_ratio_BG, jnp.log(C)) if clip == "upper" else log_ratio_BG
  if self_normalize:
    return jax.nn.softmax(log_c, axis=-1)
  return jnp.exp(log_c) / log_c.shape[-1]


def stabledrl(logp_BG, logp_old_BG, adv_BG, clip: str = "upper", C: float = 5.0,
              eps: float = 0.2, self_normalize: bool = True):
  """StableDRL: L = −mean_B Σ_i sg(w_i) · A_i · ℓ̂_θ(o_i), w from :func:`stabledrl_weights`.

  The update lies in the convex hull of the per-sample gradients, its norm
  bounded by max_i |A_i|·‖∇ℓ̂_i‖ whatever the ratio noise (with self-normalisation).
  """
  w = stabledrl_weights(logp_BG - logp_old_BG, clip, C, eps, self_normalize)
  return -(w * adv_BG * logp_BG).sum(-1).mean()


def stabledrl_tokens(token_BGL, logp_old_BG, adv_BGL, mask_BGL, clip: str = "upper",
                     C: float = 5.0, eps: float = 0.2, surrogate_BGL=None,
                     self_normalize: bool = True):
  """Per-token StableDRL: −mean_B Σ_i sg(w_i) Σ_k A_ik ℓ̂'_ik.

  The weights come from the ratio of the per-token estimate ``token_BGL``
  (Σ_k = ℓ̂_θ, the ELBO); the gradient term ℓ̂' is ``surrogate_BGL`` when given
  (the SPG surrogate of the official code, :func:`spg_surrogate`), else
  ``token_BGL`` itself.
  """
  w = stabledrl_weights(token_BGL.sum(-1) - logp_old_BG, clip, C, eps, self_normalize)
  grad_term_BGL = token_BGL if surrogate_BGL is None else surrogate_BGL
  per_seq = jnp.where(mask_BGL, adv_BGL * grad_term_BGL, 0.0).sum(-1)
  return -(w * per_seq).sum(-1).mean()


# ------------------------------------------------------------------------------- KL


_EXP_LINEAR_FROM = 20.0  # exp(d) continues linearly above this (finite, still increasing)
_LOG_RATIO_REPORT = 30.0  # ratio statistics are computed on log ρ̂ clipped to ±this


def _exp_safe(d):
  """exp(d) for d ≤ 20, its tangent line above: finite for sum-reduced estimates,
  where a sequence log-ratio of hundreds of nats would overflow float32."""
  c = _EXP_LINEAR_FROM
  return jnp.where(d <= c, jnp.exp(jnp.minimum(d, c)), math.exp(c) * (1.0 + d - c))


def kl_terms(logp, logp_ref, kind: str = "k3"):
  """Schulman's KL(π_θ ‖ π_ref) estimator k1 / k2 / k3, elementwise, d = ``logp_ref`` −
  ``logp`` in float32: −d, d²/2, e^d − d − 1 (e^d continued linearly above d = 20 by
  :func:`_exp_safe`, so it stays finite, with a finite gradient)."""
  d = (logp_ref - logp).astype(jnp.float32)
  if kind == "k1":
    return -d
  if kind == "k2":
    return 0.5 * d * d
  if kind == "k3":
    return _exp_safe(d) - d - 1.0
  raise ValueError(f"unknown KL estimator {kind!r}; choose from {KL_ESTIMATORS}")


def kl_penalty(logp_BG, logp_ref_BG, kind: str = "k3"):
  """Sequence-level KL(π_θ ‖ π_ref): :func:`kl_terms` on ℓ̂ per sequence, the batch mean."""
  return kl_terms(logp_BG, logp_ref_BG, kind).mean()


def kl_penalty_tokens(token_BGL, token_ref_BGL, mask_BGL, kind: str = "k3"):
  """Token-level KL(π_θ ‖ π_ref): :func:`kl_terms` per action token (per-token
  log-probabilities on the same masks), summed over the batch's action tokens and divided by
  their number, TRL / DiffuCoder's ``per_token_kl`` with the loss's
  ``(x · mask).sum() / mask.sum()``."""
  mask = mask_BGL.astype(jnp.float32)
  return (kl_terms(token_BGL, token_ref_BGL, kind) * mask).sum() / jnp.maximum(mask.sum(), 1.0)


# ---------------------------------------------------------------- registered forms


def sequence_advantage(adv_BGL, mask_BGL):
  """A sequence's advantage: the mean of its tokens' advantages over the action (A_i
  itself for the sequence-level advantages, which are constant over the tokens)."""
  n = jnp.maximum(mask_BGL.sum(-1), 1)
  return jnp.where(mask_BGL, adv_BGL, 0.0).sum(-1) / n


def ratio_metrics(log_ratio_BG, adv_BGL, mask_BGL, eps: float) -> dict:
  """Ratio statistics and the GRPO bypass fraction (A < 0 and ρ̂ > 1 + ε) of the sequence
  ratio ρ̂ = exp(ℓ̂_θ − ℓ̂_old); a loss that clips another ratio (ESPO's per-token-normalised
  one, grpo_token's per-token ones) reports its own ``bypass_fraction``, which the step keeps.

  ``log_ratio_max`` is exact; mean/max/std of ρ̂ are computed on log ρ̂ clipped
  to ±30 (ρ̂ ≤ 1.1e13), so they stay finite when sum-reduced estimators give
  log-ratios of hundreds of nats. ``abs_log_ratio_p{50,90,99}`` are quantiles of |log ρ̂|
  over the batch's sequences (exact, unclipped): the ratio noise the clamped maximum hides.
  """
  log_ratio = _sg(log_ratio_BG).astype(jnp.float32)
  abs_q = jnp.quantile(jnp.abs(log_ratio).reshape(-1), jnp.array([0.5, 0.9, 0.99]))
  ratio = jnp.exp(jnp.clip(log_ratio, -_LOG_RATIO_REPORT, _LOG_RATIO_REPORT))
  adv_seq = sequence_advantage(adv_BGL, mask_BGL)
  return {
      "ratio_mean": ratio.mean(), "ratio_max": ratio.max(), "ratio_std": ratio.std(),
      "log_ratio_max": log_ratio.max(),
      "abs_log_ratio_p50": abs_q[0], "abs_log_ratio_p90": abs_q[1],
      "abs_log_ratio_p99": abs_q[2], "abs_log_ratio_max": jnp.abs(log_ratio).max(),
      "bypass_fraction": ((adv_seq < 0) & (log_ratio > math.log1p(eps))).mean(),
  }


def grpo_bypassed(ratio, adv, eps: float):
  """Where GRPO's clip is bypassed (the unclipped term is selected, its weight unbounded):
  A < 0 and ρ̂ > 1 + ε."""
  return (adv < 0) & (ratio > 1 + eps)


def grpo_clipped(ratio, adv, eps: float):
  """Where GRPO's clip takes effect (the clipped term is selected and carries no
  gradient): A > 0 and ρ̂ > 1 + ε, or A < 0 and ρ̂ < 1 − ε. The other side of
  the clip range is not clipped: that is the bypass."""
  return ((adv > 0) & (ratio > 1 + eps)) | ((adv < 0) & (ratio < 1 - eps))


def checked_output(name: str, out):
  """The ``(loss, metrics)`` of the registered loss ``name`` (``rl.loss``), checked against
  the contract of this module's docstring: a pair, a float32 scalar loss (the mean over the
  batch: the step differentiates it) and a dict of metrics holding ``clip_fraction``. Shapes
  and dtypes are static, so a loss that breaks it fails when the step is traced, with a
  TypeError naming ``rl.loss`` instead of an error from deep inside JAX's grad."""
  where = f"rl.loss={name!r} (registered in LOSSES, dllm_rl/rl/losses.py)"
  if not (isinstance(out, tuple) and len(out) == 2):
    raise TypeError(f"{where} returned {type(out).__name__}; a registered loss returns a"
                    " (loss, metrics) pair")
  loss, metrics = out
  if jnp.shape(loss) != () or jnp.result_type(loss) != jnp.float32:
    raise TypeError(f"{where} returned a {jnp.result_type(loss)} loss of shape"
                    f" {jnp.shape(loss)}; it must be a float32 scalar (reduce over B, G and L"
                    " inside the loss)")
  if not isinstance(metrics, dict) or "clip_fraction" not in metrics:
    got = sorted(metrics) if isinstance(metrics, dict) else type(metrics).__name__
    raise TypeError(f"{where} returned metrics {got}; they must be a dict holding"
                    " 'clip_fraction' (zeros for a loss without a clip)")
  return loss, metrics


@LOSSES.register("grpo")
def _grpo(lik, lik_old, adv_BGL, mask_BGL, lengths_BG, cfg: LossConfig):
  del lengths_BG
  ratio_BG = jnp.exp(_sg(lik.seq_B - lik_old.seq_B))
  loss = grpo_tokens(lik.token_BL, lik_old.seq_B, adv_BGL, mask_BGL, cfg.eps)
  clipped = grpo_clipped(ratio_BG[..., None], adv_BGL, cfg.eps) & mask_BGL
  return loss, {"clip_fraction": clipped.sum() / jnp.maximum(mask_BGL.sum(), 1)}


@LOSSES.register("grpo_token")
def _grpo_token(lik, lik_old, adv_BGL, mask_BGL, lengths_BG, cfg: LossConfig):
  del lengths_BG
  ratio = jnp.exp(_sg(lik.token_BL - lik_old.token_BL))
  loss = grpo_token_level(lik.token_BL, lik_old.token_BL, adv_BGL, mask_BGL, cfg.eps)
  n = jnp.maximum(mask_BGL.sum(), 1)
  clipped = grpo_clipped(ratio, adv_BGL, cfg.eps) & mask_BGL
  bypassed = grpo_bypassed(ratio, adv_BGL, cfg.eps) & mask_BGL  # per token, as it clips
  return loss, {"clip_fraction": clipped.sum() / n, "bypass_fraction": bypassed.sum() / n}


@LOSSES.register("stabledrl")
def _stabledrl(lik, lik_old, adv_BGL, mask_BGL, lengths_BG, cfg: LossConfig):
  """StableDRL. With an estimator that also gives an EUBO (``spg_block``, the
  official setup) the gradient term is the SPG surrogate, ELBO where A > 0 and
  ω·EUBO + (1 − ω)·ELBO elsewhere (ω = ``spg_omega``; 0 = ELBO only); the
  ratio always uses the ELBO."""
  del lengths_BG
  surrogate = None
  if "eubo_token_BL" in lik.extra:
    surrogate = spg_surrogate(lik.token_BL, lik.extra["eubo_token_BL"], adv_BGL, cfg.spg_omega)
  loss = stabledrl_tokens(lik.token_BL, lik_old.seq_B, adv_BGL, mask_BGL, cfg.clip, cfg.clip_C,
                          cfg.eps, surrogate_BGL=surrogate, self_normalize=cfg.self_normalize)
  ratio = jnp.exp(_sg(lik.seq_B - lik_old.seq_B))
  if cfg.clip == "upper":
    clipped = ratio > cfg.clip_C
  elif cfg.clip == "symmetric":
    clipped = (ratio < 1 - cfg.eps) | (ratio > 1 + cfg.eps)
  else:
    clipped = jnp.zeros_like(ratio, bool)
  return loss, {"clip_fraction": clipped.mean()}


@LOSSES.register("spg")
def _spg(lik, lik_old, adv_BGL, mask_BGL, lengths_BG, cfg: LossConfig):
  """SPG (per-token form): ELBO for A > 0, ω·EUBO + (1 − ω)·ELBO otherwise,
  length-weighted per group. Needs the ``spg_block`` estimator (its EUBO)."""
  del lik_old
  loss = spg_loss_tokens(lik.token_BL, lik.extra["eubo_token_BL"], adv_BGL, mask_BGL,
                         omega=cfg.spg_omega, lengths_BG=lengths_BG)
  return loss, {"clip_fraction": jnp.zeros(())}


@LOSSES.register("wd1")
def _wd1(lik, lik_old, adv_BGL, mask_BGL, lengths_BG, cfg: LossConfig):
  """wd1 (:mod:`dllm_rl.rl.wd1_loss`): −Σ_i (w⁺_i − w⁻_i) ℓ̂_θ(o_i) per group, w± =
  softmax_G(±A). Ratio-free: ℓ̂_old is not used. Per-token advantages (StepRS) enter
  through each sequence's mean advantage (:func:`sequence_advantage`)."""
  del lik_old, lengths_BG, cfg
  logp_BG = jnp.where(mask_BGL, lik.token_BL, 0.0).sum(-1)
  loss = wd1_loss(logp_BG, sequence_advantage(adv_BGL, mask_BGL))
  return loss, {"clip_fraction": jnp.zeros(())}


@LOSSES.register("espo")
def _espo(lik, lik_old, adv_BGL, mask_BGL, lengths_BG, cfg: LossConfig):
  """ESPO (:func:`espo`): the sequence ratio exp((ℓ̂_θ − ℓ̂_old) / L) with L the generated
  length (``data.completion_len``), PPO-clipped at ε. ℓ̂ must be a sum over tokens
  (``estimator.reduction="sum"``, checked by validation). Per-token advantages enter
  through each sequence's mean advantage."""
  del lengths_BG
  length = mask_BGL.shape[-1]
  adv_BG = sequence_advantage(adv_BGL, mask_BGL)
  loss = espo(lik.seq_B, lik_old.seq_B, adv_BG, length, cfg.eps)
  ratio_BG = jnp.exp(_sg(lik.seq_B - lik_old.seq_B) / length)
  return loss, {"clip_fraction": grpo_clipped(ratio_BG, adv_BG, cfg.eps).mean(),
                "bypass_fraction": grpo_bypassed(ratio_BG, adv_BG, cfg.eps).mean()}
