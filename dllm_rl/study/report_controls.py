"""The stability report's control lines ("no claim"): GRPO changed one way against GRPO and
StableDRL against the changed GRPO (a KL term, shared masks), and GRPO below the lr grid
against its SFT start and StableDRL at the default lr. Each line pairs seeds
(:func:`dllm_rl.study.figures.paired_difference`)."""

from __future__ import annotations

from dllm_rl.study import figures as fig
from dllm_rl.study.arms import lr_tag


def _means(study: dict, arms: tuple[str, str], key: str, spec: str) -> str:
  """The run statistic ``key`` of two arms, each its mean over seeds, as "X and Y"."""
  got = [fig.interval(study, a, lambda r: r["stats"].get(key))["mean"] for a in arms]
  return " and ".join("—" if x is None else format(x, spec) for x in got)


def _grad_extremes(study: dict, arms: tuple[str, str]) -> str:
  """Per run of each of two arms (means over seeds): the largest pre-clip grad norm and the
  steps with gradient 0."""
  return (f"a run's largest pre-clip grad norm (mean over seeds)"
          f" {_means(study, arms, 'grad_norm_max', '.3g')}; its steps with gradient 0 (mean over"
          f" seeds) {_means(study, arms, 'zero_grad_steps', '.1f')}")


def _bypass(study: dict, arms: tuple[str, str]) -> str:
  """The two arms' bypass fractions (A < 0 and ρ̂ > 1 + ε; means over seeds)."""
  return ("bypass fraction (A < 0, ρ̂ > 1 + ε) "
          + _means(study, arms, "bypass_fraction_mean", ".2%"))


def _kl_term(arm: dict) -> str:
  beta = (arm.get("overrides") or {}).get("rl.kl_coef")
  return f"the KL term (β = {beta:g})" if beta is not None else "the KL term"


# GRPO control arm prefix → what the arm adds to GRPO (from its study record)
GRPO_CONTROLS = {"grpo_kl": _kl_term,  # d1's KL term to the SFT start
                 "grpo_antithetic": lambda arm: "shared masks"}  # ρ̂ = 1 at θ = θ_old


def grpo_control_verdicts(study: dict) -> list[tuple[str, str, str]]:
  """(comparison, "no claim", evidence) for each GRPO control arm (:data:`GRPO_CONTROLS`: a KL
  term, shared masks): against GRPO at the same lr (does the change prevent GRPO's collapse?)
  and StableDRL against it (is StableDRL's gain more than the change gives?): the paired
  test-accuracy difference, the collapses, a run's largest pre-clip grad norm and its steps
  with gradient 0 (means over seeds), and the bypass fraction. Not the spike count: a spike is
  relative to the run's median non-zero norm, and a KL term's gradient is non-zero after a
  collapse, where GRPO's alone is 0, so the two arms' medians are over different steps."""
  names = {a["name"] for a in study["arms"]}
  out = []
  for a in study["arms"]:
    prefix, _, tag = a["name"].partition("@")
    if prefix not in GRPO_CONTROLS:
      continue
    arm, change = a["name"], GRPO_CONTROLS[prefix](a)
    grpo, full = f"grpo@{tag}", f"stabledrl@{tag}"
    if grpo in names:
      p = fig.paired_difference(study, arm, grpo, fig.held_out_accuracy)
      out.append((f"{arm} vs {grpo} (control: GRPO with and without {change})", "no claim",
                  f"test accuracy with − without {change} {fig.fmt_paired(p)}; collapsed:"
                  f" {fig.collapsed(study, arm)} with, {fig.collapsed(study, grpo)} without;"
                  f" {_grad_extremes(study, (arm, grpo))}; {_bypass(study, (arm, grpo))}"))
    if full in names:
      p = fig.paired_difference(study, full, arm, fig.held_out_accuracy)
      out.append((f"{full} vs {arm} (control: StableDRL against GRPO with {change})", "no claim",
                  f"test accuracy StableDRL − GRPO with {change} {fig.fmt_paired(p)}; collapsed:"
                  f" StableDRL {fig.collapsed(study, full)}, GRPO with {change}"
                  f" {fig.collapsed(study, arm)}; {_grad_extremes(study, (full, arm))}"))
  return out


LOW_LR_CONTROL = "grpo_low"  # the control: GRPO below the lr grid


def _default_lr_tag(study: dict) -> str | None:
  """The lr tag of the study's default lr: its base config's ``rl.lr``, the middle of the
  grid the arms were built from (dllm_rl.study.arms.lr_grid; None when the study JSON has no
  base config). Not a study-wide ``--config.rl.lr``: every stability arm sets its own
  ``rl.lr``, which wins over the study's overrides (runner.arm_run_overrides)."""
  lr = ((study.get("base_config") or {}).get("rl") or {}).get("lr")
  return lr_tag(float(lr)) if lr is not None else None


def low_lr_control_verdicts(study: dict) -> list[tuple[str, str, str]]:
  """(comparison, "no claim", evidence) for each GRPO arm below the lr grid: its gain over the
  seed's SFT start (does GRPO learn where its step is small?) and StableDRL at the default lr
  against it (does StableDRL's claim hold against an lr-tuned GRPO?): paired test accuracy
  and the collapses."""
  names = {a["name"] for a in study["arms"]}
  tag = _default_lr_tag(study)
  full = f"stabledrl@{tag}"
  out = []
  for a in study["arms"]:
    if a["name"].partition("@")[0] != LOW_LR_CONTROL:
      continue
    low = a["name"]
    gain = fig.gain_over_start(study, low)
    out.append((f"{low} improves on the SFT start (control: GRPO below the lr grid)", "no claim",
                f"test accuracy {low} − SFT {fig.fmt_paired(gain)}; collapsed:"
                f" {fig.collapsed(study, low)}"))
    if full in names:
      p = fig.paired_difference(study, full, low, fig.held_out_accuracy)
      out.append((f"{full} vs {low} (control: StableDRL at the default lr against GRPO below"
                  " the grid)", "no claim",
                  f"test accuracy StableDRL − {low} {fig.fmt_paired(p)}; collapsed: StableDRL"
                  f" {fig.collapsed(study, full)}, {low} {fig.collapsed(study, low)}"))
  return out
