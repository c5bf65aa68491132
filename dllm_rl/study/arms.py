"""What each study runs: arms (config overrides from the seed's SFT checkpoint) and sizes.

Every arm starts from the testbed's base config (``--testbed``: ``dllm_rl/config/testbeds.py``;
the embedded default ``dllm_rl/config/defaults.py`` unless chosen) and the same SFT checkpoint
per seed, and changes only the keys listed here; a study is a function of that base config
(its learning rates are the base's ``rl.lr``, ÷3 / ×3 of it, and ÷10 / ÷30 for the stability
study's ``grpo_low`` control; an arm's ``rl.lr`` wins over a study-wide ``--config.rl.lr``).
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

import ml_collections

from dllm_rl.config import recipes, testbeds
from dllm_rl.errors import ConfigError
from dllm_rl.registry import Registry

STUDIES: Registry = Registry("study")  # name -> f(base config) -> list[Arm]
OFFICIAL_ESTIMATOR = recipes.OFFICIAL_ESTIMATOR  # StableDRL's own (SPG block masking, K = 2)
# The stress test: a 1-draw, 1/t-weighted ELBO (|log ρ̂| of tens of nats at θ = θ_old).
STRESS_ESTIMATOR = {"estimator.name": "elbo", "estimator.num_samples": 1,
                    "estimator.prompt_mask_prob": 0.0, "estimator.antithetic": False}
STRESS_LABEL = "stress test: heavier ratio noise than the paper"
STEPRS_LOSS = "stabledrl"  # the StepRS arms and their centered baseline share the stable loss
D1_KL_COEF = 0.04  # d1's diffu-GRPO KL coefficient β (the grpo_kl control; StableDRL uses none)
LOW_LR_DIVISORS = (10, 30)  # the control: GRPO at the default lr ÷ 10 and ÷ 30, below the grid


@dataclasses.dataclass(frozen=True)
class Arm:
  """One arm: a name, the overrides of the base config (``"rl.lr": 1e-3``), a short
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


def size(testbed: str, quick: bool) -> Size:
  """The study's run lengths on ``testbed`` (full, or ``--quick``)."""
  bed = testbeds.testbed(testbed)
  return Size(*(bed.quick if quick else bed.full))


FULL = size(testbeds.DEFAULT, quick=False)
QUICK = size(testbeds.DEFAULT, quick=True)


def lr_grid(base: ml_collections.ConfigDict) -> tuple[float, float, float]:
  """The stability study's lr grid: the base's RL lr ÷ 3, itself, × 3 (the aggressive one)."""
  lr = float(base.rl.lr)
  return (lr / 3, lr, lr * 3)


def select(arms: list[Arm], patterns: list[str] | None) -> list[Arm]:
  """The arms whose names match one of the shell ``patterns`` (all when None), with the arms
  they calibrate from (``steprs_calibrated`` takes its β from the ``steprs`` run), in the
  study's order."""
  if not patterns:
    return arms
  chosen = {a.name for a in arms if any(fnmatch.fnmatchcase(a.name, p) for p in patterns)}
  chosen |= {a.calibrate_from for a in arms if a.name in chosen and a.calibrate_from}
  return [a for a in arms if a.name in chosen]


def unmatched(studies: list[str], patterns: list[str] | None,
              base: ml_collections.ConfigDict | None = None) -> str | None:
  """The problem with ``--arms`` when a pattern matches no arm of the named studies (over
  ``base``, default the embedded default), else None."""
  base = base if base is not None else testbeds.testbed(testbeds.DEFAULT).get_config()
  names = [a.name for s in studies for a in STUDIES.get(s)(base)]
  bad = [p for p in patterns or () if not any(fnmatch.fnmatchcase(n, p) for n in names)]
  return (f"{', '.join(map(repr, bad))} matches no arm of {', '.join(studies)};"
          f" arms: {', '.join(names)}") if bad else None


def shadowed_overrides(study: str, arms: list[Arm], overrides: dict) -> list[ConfigError]:
  """A ConfigError for each study-wide override that every one of ``arms`` sets itself: an
  arm's own value wins (runner.arm_run_overrides), so the override would change no RL run
  (``--config.rl.lr`` moves no arm of the lr grid, which follows the base config)."""
  if not arms:
    return []
  return [ConfigError(key, f"every arm of {study} sets {key} itself (e.g. {arms[0].name}:"
                      f" {arms[0].overrides[key]!r}), so this study-wide override would change"
                      " no run; the arms' values follow the testbed's base config (--testbed)")
          for key in overrides if all(key in a.overrides for a in arms)]


# The RL settings the study sets from its own flags (runner.arm_run_overrides): a study-wide
# --config override of one would change every run while the report states the flag's value.
SIZED = {"rl.steps": "--rl_steps", "rl.eval_every": "--eval_every",
         "checkpoint.save_every": "--rl_steps (a run saves at its end)",
         "rl.log_every": "nothing: the study records every step"}


def sized_overrides(overrides: dict) -> list[ConfigError]:
  """A ConfigError for each study-wide override of a :data:`SIZED` key, naming the flag that
  sets it."""
  return [ConfigError(key, f"the study sets it for every run (its report states the size);"
                      f" use {SIZED[key]}") for key in overrides if key in SIZED]


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
def stability(config: ml_collections.ConfigDict) -> list[Arm]:
  """StableDRL's claim: GRPO with estimated ratios spikes and collapses; unconditional
  clipping + self-normalisation stays stable. GRPO and StableDRL on the official estimator
  over a 3-value lr grid, the two ablations at the default lr, two StableDRL controls there
  (antithetic masks; the ELBO instead of SPG's EUBO surrogate for negative advantages), GRPO
  with d1's KL term at the low and the default lr (a control: does the usual remedy already
  prevent GRPO's collapse?), GRPO with antithetic masks at those lrs (a control: is the
  ratio's mask noise what collapses GRPO?), GRPO at the default lr ÷ 10 and ÷ 30 (a control:
  does GRPO learn below the grid?), and the 1-draw-ELBO stress test at the default and the
  aggressive lr."""
  grid = lr_grid(config)
  lr = grid[1]
  main = [a for g in grid for a in _stability_pair(g, OFFICIAL_ESTIMATOR)]
  base = {**OFFICIAL_ESTIMATOR, "rl.lr": lr, "rl.advantage": "centered",
          "rl.loss": "stabledrl"}
  tag = lr_tag(lr)
  ablations = [
      Arm(f"clip_only@{tag}", {**base, "rl.clip": "upper", "rl.self_normalize": False},
          "unconditional clip min(ρ̂, 5), fixed 1/G (no self-normalisation)"),
      Arm(f"selfnorm_only@{tag}", {**base, "rl.clip": "none"},
          "self-normalisation ρ̂/Σρ̂ (no clipping)"),
      Arm(f"stabledrl_antithetic@{tag}", {**base, "estimator.antithetic": True},
          "StableDRL with antithetic masks (θ, θ_old share masks: ρ̂ = 1 at θ = θ_old)",
          group="control"),
      Arm(f"stabledrl_no_eubo@{tag}", {**base, "estimator.spg_omega": 0.0},
          "StableDRL with the ELBO as every sample's gradient term (SPG's EUBO surrogate for"
          " A < 0 off: ω = 0)", group="control"),
  ]
  grpo = lambda g: _stability_pair(g, OFFICIAL_ESTIMATOR)[0].overrides  # GRPO's, at lr g
  kl = [Arm(f"grpo_kl@{lr_tag(g)}", {**grpo(g), "rl.kl_coef": D1_KL_COEF},
            f"GRPO with d1's KL term to the SFT start (β = {D1_KL_COEF:g}, k3)", group="control")
        for g in grid[:2]]
  shared = [Arm(f"grpo_antithetic@{lr_tag(g)}", {**grpo(g), "estimator.antithetic": True},
                "GRPO with antithetic masks (θ, θ_old share masks: ρ̂ = 1 at θ = θ_old)",
                group="control") for g in grid[:2]]
  low = [Arm(f"grpo_low@{lr_tag(lr / k)}", grpo(lr / k),
             f"GRPO at the default lr ÷ {k} (below the grid)", group="control")
         for k in LOW_LR_DIVISORS]
  stress = [a for g in (lr, grid[-1])
            for a in _stability_pair(g, STRESS_ESTIMATOR, "_elbo1", "stress")]
  return main + ablations + kl + shared + low + stress


@STUDIES.register("steprs")
def steprs(config: ml_collections.ConfigDict) -> list[Arm]:
  """StepRS's claim: a risk coefficient rising over denoising states explores more (pass@k,
  distinct correct answers), against centered GRPO, with the paper's controls: RMS- and
  mass-matched scale, the reversed schedule (β high → low), a constant β, and the
  calibrated β."""
  base = {**OFFICIAL_ESTIMATOR, "rl.lr": float(config.rl.lr), "rl.loss": STEPRS_LOSS}
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
def baselines(config: ml_collections.ConfigDict) -> list[Arm]:
  """The baselines a dLLM-RL paper is compared against, each with its official algorithm
  (loss, advantage, estimator and its noise, ε, KL: dllm_rl.config.recipes) over the
  base config, at its lr and μ (the recipes' official scale — lr, μ, G — is in
  configs/wd1.py, espo.py, coupled_grpo.py)."""
  base = {"rl.lr": float(config.rl.lr)}
  return [
      Arm("grpo", {**base, "rl.loss": "grpo", "rl.advantage": "grpo"},
          "GRPO (d1's diffu-GRPO advantages (r − r̄)/σ): conditional clip ε = 0.2,"
          " sequence ratio"),
      Arm("stabledrl", {**base, "rl.loss": "stabledrl", "rl.advantage": "centered"},
          "StableDRL: unconditional upper clip C = 5 + self-normalisation"),
      Arm("wd1", {**base, **recipes.wd1(config)},
          "wd1: ratio-free −Σ (softmax(A) − softmax(−A)) ℓ̂, d1 one-step ℓ̂"),
      Arm("espo", {**base, **recipes.espo(config)},
          "ESPO: clipped exp(Δℓ̂ / L) on the coupled ELBO (2 pairs), RLOO, k2 KL"),
      Arm("coupled_grpo", {**base, **recipes.coupled_grpo(config)},
          "coupled-GRPO: d1 token loss on ½[log p(all masked) + w log p(pair)], RLOO, ε = 0.5"),
      Arm("trajectory", {**base, **recipes.trajectory(config)},
          "TraceRL: per-token clipped ratios, each token scored in its own denoising state"),
  ]
