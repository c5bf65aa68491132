"""What each study runs: arms (config overrides from the seed's SFT checkpoint) and sizes.

Every arm starts from the embedded default config (``dllm_rl/config/defaults.py``)
and the same SFT checkpoint per seed, and changes only the keys listed here.
All arms use the official noise (``estimator.antithetic=False``: independent
masks for ℓ̂_old and each inner step), a 1-draw ELBO and μ = 2 (the embedded
default), except the antithetic arm and the baselines whose official code shares masks
between θ, θ_old and the reference (ESPO, coupled-GRPO).
"""

from __future__ import annotations

import dataclasses

from dllm_rl.config import defaults, recipes
from dllm_rl.registry import Registry

STUDIES: Registry = Registry("study")

DEFAULT_LR = 1e-4     # the embedded default's RL learning rate
AGGRESSIVE_LR = 3e-4  # where GRPO breaks on the embedded default (README "Results": the probe)
# GRPO collapses at the default lr under the official noise (the stability study), so the
# StepRS arms and their centered baseline share the stable loss.
STEPRS_LOSS = "stabledrl"


@dataclasses.dataclass(frozen=True)
class Arm:
  """One arm: a name, the overrides of the embedded default (``"rl.lr": 1e-3``), a short
  description, and optionally the arm whose calibrated β (``summary.json``) sets rl.beta_end."""

  name: str
  overrides: dict
  description: str
  calibrate_from: str | None = None


@dataclasses.dataclass(frozen=True)
class Size:
  """Run length of a study: RL steps per arm, validation every N steps, default seeds."""

  rl_steps: int
  eval_every: int
  seeds: int


FULL = Size(rl_steps=200, eval_every=20, seeds=3)
QUICK = Size(rl_steps=40, eval_every=10, seeds=1)


def _stability_arms(lr: float, tag: str) -> list[Arm]:
  base = {"rl.lr": lr, "rl.advantage": "centered"}
  return [
      Arm(f"grpo@{tag}", {**base, "rl.loss": "grpo"},
          "GRPO: conditional clip (ε = 0.2), fixed 1/G, sequence ratio"),
      Arm(f"stabledrl@{tag}", {**base, "rl.loss": "stabledrl", "rl.clip": "upper",
                               "rl.clip_C": 5.0},
          "StableDRL: unconditional upper clip C = 5 + self-normalisation"),
      Arm(f"clip_only@{tag}", {**base, "rl.loss": "stabledrl", "rl.clip": "upper",
                               "rl.self_normalize": False},
          "unconditional clip min(ρ̂, 5), fixed 1/G (no self-normalisation)"),
      Arm(f"selfnorm_only@{tag}", {**base, "rl.loss": "stabledrl", "rl.clip": "none"},
          "self-normalisation ρ̂/Σρ̂ (no clipping)"),
      Arm(f"stabledrl_antithetic@{tag}", {**base, "rl.loss": "stabledrl",
                                          "estimator.antithetic": True},
          "StableDRL with antithetic masks (θ, θ_old share masks)"),
  ]


@STUDIES.register("stability")
def stability() -> list[Arm]:
  """StableDRL's claim: GRPO with estimated ratios spikes and collapses; unconditional
  clipping + self-normalisation stays stable. At the default lr and an aggressive lr."""
  return _stability_arms(DEFAULT_LR, "lr1e-4") + _stability_arms(AGGRESSIVE_LR, "lr3e-4")


@STUDIES.register("steprs")
def steprs() -> list[Arm]:
  """StepRS's claim: a risk coefficient rising over denoising states explores more (pass@k)."""
  base = {"rl.lr": DEFAULT_LR, "rl.loss": STEPRS_LOSS}
  steprs_base = {**base, "rl.advantage": "steprs", "rl.beta_start": 0.0,
                 "rl.beta_schedule": "linear"}
  return [
      Arm("centered", {**base, "rl.advantage": "centered"},
          "centered advantages A = r − p̂ (the baseline)"),
      Arm("steprs", {**steprs_base, "rl.beta_end": 2.0}, "StepRS, β 0 → 2 linear"),
      Arm("steprs_calibrated", steprs_base,
          "StepRS, β 0 → β_cal linear (β_cal: w_β(p̄) = 1 at the start's training accuracy)",
          calibrate_from="steprs"),
      Arm("steprs_rms_matched", {**steprs_base, "rl.advantage": "steprs_rms_matched",
                                 "rl.beta_end": 2.0},
          "StepRS β 0 → 2 rescaled to the batch RMS of centered advantages"),
      Arm("risk_sensitive", {**base, "rl.advantage": "risk_sensitive", "rl.beta": 1.0},
          "constant β = 1 (the mean of the 0 → 2 schedule)"),
  ]


@STUDIES.register("baselines")
def baselines() -> list[Arm]:
  """The baselines a dLLM-RL paper is compared against, each with its official algorithm
  (loss, advantage, estimator and its noise, ε, KL: dllm_rl.config.recipes) over the
  embedded default, at its lr and μ = 2 (the recipes' official scale — lr, μ, G — is in
  configs/wd1.py, espo.py, coupled_grpo.py)."""
  base = {"rl.lr": DEFAULT_LR}
  default = defaults.get_config()
  return [
      Arm("grpo", {**base, "rl.loss": "grpo", "rl.advantage": "grpo"},
          "GRPO (d1's diffu-GRPO advantages (r − r̄)/σ): conditional clip ε = 0.2, sequence ratio"),
      Arm("stabledrl", {**base, "rl.loss": "stabledrl", "rl.advantage": "centered"},
          "StableDRL: unconditional upper clip C = 5 + self-normalisation"),
      Arm("wd1", {**base, **recipes.wd1(default)},
          "wd1: ratio-free −Σ (softmax(A) − softmax(−A)) ℓ̂, d1 one-step ℓ̂"),
      Arm("espo", {**base, **recipes.espo(default)},
          "ESPO: clipped exp(Δℓ̂ / L) on the coupled ELBO (2 pairs), RLOO, k2 KL"),
      Arm("coupled_grpo", {**base, **recipes.coupled_grpo(default)},
          "coupled-GRPO: d1 token loss on ½[log p(all masked) + w log p(pair)], RLOO, ε = 0.5"),
  ]
