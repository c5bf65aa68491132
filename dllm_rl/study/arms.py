"""What each study runs: arms (config overrides from the seed's SFT checkpoint) and sizes.

Every arm starts from the embedded default config (``dllm_rl/config/defaults.py``)
and the same SFT checkpoint per seed, and changes only the keys listed here.
Stability and StepRS main arms use the official StableDRL estimator
(:data:`OFFICIAL_ESTIMATOR`: SPG's block-random masking, K = 2 draws, prompt masking 0.15,
independent masks for ℓ̂_old and each inner step); the ``stress`` arms use a 1-draw
1/t-weighted ELBO, whose ratio noise is far heavier than the paper's. The baselines use each
method's official algorithm (``dllm_rl.config.recipes``), whose official code shares masks
between θ, θ_old and the reference for ESPO and coupled-GRPO.
"""

from __future__ import annotations

import dataclasses
import fnmatch

from dllm_rl.config import defaults, recipes
from dllm_rl.registry import Registry

STUDIES: Registry = Registry("study")

DEFAULT_LR = float(defaults.get_config().rl.lr)  # the embedded default's RL learning rate
LR_GRID = (DEFAULT_LR / 3, DEFAULT_LR, DEFAULT_LR * 3)  # the stability study's lr grid
AGGRESSIVE_LR = LR_GRID[-1]
# StableDRL's official likelihood estimator (JianyuanZhong/StableDRL, after SPG): block-random
# masks, the mean log-prob over masked tokens (no 1/t weight), K = 2, prompt masking 0.15.
OFFICIAL_ESTIMATOR = {"estimator.name": "spg_block", "estimator.num_samples": 2,
                      "estimator.prompt_mask_prob": 0.15, "estimator.antithetic": False}
# The stress test: a 1-draw, 1/t-weighted ELBO (|log ρ̂| of tens of nats at θ = θ_old).
STRESS_ESTIMATOR = {"estimator.name": "elbo", "estimator.num_samples": 1,
                    "estimator.prompt_mask_prob": 0.0, "estimator.antithetic": False}
STRESS_LABEL = "stress test: heavier ratio noise than the paper"
STEPRS_LOSS = "stabledrl"  # the StepRS arms and their centered baseline share the stable loss


@dataclasses.dataclass(frozen=True)
class Arm:
  """One arm: a name, the overrides of the embedded default (``"rl.lr": 1e-3``), a short
  description, and optionally the arm whose calibrated β (``summary.json``) sets rl.beta_end."""

  name: str
  overrides: dict
  description: str
  calibrate_from: str | None = None
  group: str = "main"  # main | stress (STRESS_LABEL) | control


@dataclasses.dataclass(frozen=True)
class Size:
  """Run length of a study: RL steps per arm, validation every N steps, default seeds."""

  rl_steps: int
  eval_every: int
  seeds: int


FULL = Size(rl_steps=200, eval_every=20, seeds=5)
QUICK = Size(rl_steps=40, eval_every=10, seeds=1)


def select(arms: list[Arm], patterns: list[str] | None) -> list[Arm]:
  """The arms whose names match one of the shell ``patterns`` (all when None)."""
  if not patterns:
    return arms
  return [a for a in arms if any(fnmatch.fnmatchcase(a.name, p) for p in patterns)]


def unmatched(studies: list[str], patterns: list[str] | None) -> str | None:
  """An error message when a pattern matches no arm of the named studies, else None."""
  names = [a.name for s in studies for a in STUDIES.get(s)()]
  bad = [p for p in patterns or () if not any(fnmatch.fnmatchcase(n, p) for n in names)]
  return (f"--arms: {', '.join(map(repr, bad))} matches no arm of {', '.join(studies)};"
          f" arms: {', '.join(names)}") if bad else None


def lr_tag(lr: float) -> str:
  return f"lr{lr:.0e}".replace("e-0", "e-")


def _stability_pair(lr: float, estimator: dict, suffix: str = "", group: str = "main") -> list[Arm]:
  base = {**estimator, "rl.lr": lr, "rl.advantage": "centered"}
  tag = lr_tag(lr)
  return [
      Arm(f"grpo{suffix}@{tag}", {**base, "rl.loss": "grpo"},
          "GRPO: conditional clip (ε = 0.2), fixed 1/G, sequence ratio", group=group),
      Arm(f"stabledrl{suffix}@{tag}", {**base, "rl.loss": "stabledrl", "rl.clip": "upper",
                                       "rl.clip_C": 5.0},
          "StableDRL: unconditional upper clip C = 5 + self-normalisation", group=group),
  ]


@STUDIES.register("stability")
def stability() -> list[Arm]:
  """StableDRL's claim: GRPO with estimated ratios spikes and collapses; unconditional
  clipping + self-normalisation stays stable. GRPO and StableDRL on the official estimator
  over a 3-value lr grid, the two ablations at the default lr, antithetic masks, and the
  1-draw-ELBO stress test at the default and the aggressive lr."""
  main = [a for lr in LR_GRID for a in _stability_pair(lr, OFFICIAL_ESTIMATOR)]
  base = {**OFFICIAL_ESTIMATOR, "rl.lr": DEFAULT_LR, "rl.advantage": "centered",
          "rl.loss": "stabledrl"}
  tag = lr_tag(DEFAULT_LR)
  ablations = [
      Arm(f"clip_only@{tag}", {**base, "rl.clip": "upper", "rl.self_normalize": False},
          "unconditional clip min(ρ̂, 5), fixed 1/G (no self-normalisation)"),
      Arm(f"selfnorm_only@{tag}", {**base, "rl.clip": "none"},
          "self-normalisation ρ̂/Σρ̂ (no clipping)"),
      Arm(f"stabledrl_antithetic@{tag}", {**base, "estimator.antithetic": True},
          "StableDRL with antithetic masks (θ, θ_old share masks: ρ̂ = 1 at θ = θ_old)",
          group="control"),
  ]
  stress = [a for lr in (DEFAULT_LR, AGGRESSIVE_LR)
            for a in _stability_pair(lr, STRESS_ESTIMATOR, "_elbo1", "stress")]
  return main + ablations + stress


@STUDIES.register("steprs")
def steprs() -> list[Arm]:
  """StepRS's claim: a risk coefficient rising over denoising states explores more (pass@k,
  distinct correct answers), against centered GRPO, with the paper's controls: RMS- and
  mass-matched scale, the reversed schedule (β high → low), a constant β, and the
  calibrated β."""
  base = {**OFFICIAL_ESTIMATOR, "rl.lr": DEFAULT_LR, "rl.loss": STEPRS_LOSS}
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
          "StepRS β 0 → 2 rescaled to the batch RMS of centered advantages", group="control"),
      Arm("steprs_mass_matched", {**steprs_base, "rl.advantage": "steprs_mass_matched",
                                  "rl.beta_end": 2.0},
          "StepRS β 0 → 2 rescaled to the batch mass Σ|A| of centered advantages",
          group="control"),
      Arm("steprs_reversed", {**steprs_base, "rl.beta_start": 2.0, "rl.beta_end": 0.0},
          "the schedule reversed: β 2 → 0 (high at the most-masked state)", group="control"),
      Arm("risk_sensitive", {**base, "rl.advantage": "risk_sensitive", "rl.beta": 1.0},
          "constant β = 1 (the mean of the 0 → 2 schedule)", group="control"),
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
      Arm("trajectory", {**base, **recipes.trajectory(default)},
          "TraceRL: per-token clipped ratios, each token scored in its own denoising state"),
  ]
