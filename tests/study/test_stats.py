"""The study's statistics: t-interval, grad-norm spikes, collapse detection."""

import math

import numpy as np
import pytest

from dllm_rl.study import stats


def test_t_interval_matches_the_t_quantile_by_hand():
  x = [0.2, 0.4, 0.3]
  iv = stats.t_interval(x)
  s = np.std(x, ddof=1)
  # t_{0.975, 2} = 4.302652729...
  assert iv["mean"] == pytest.approx(0.3)
  assert iv["half_width"] == pytest.approx(4.302652729911275 * s / math.sqrt(3), rel=1e-9)
  assert iv["n"] == 3
  # wider with fewer seeds at the same spread, narrower with more
  assert stats.t_interval([0.2, 0.4])["half_width"] > iv["half_width"]


def test_t_interval_with_one_or_no_value_has_no_width():
  assert stats.t_interval([0.5]) == {"mean": 0.5, "half_width": None, "n": 1}
  assert stats.t_interval([None, 0.5])["n"] == 1
  assert stats.t_interval([])["mean"] is None


def test_spike_ratio_and_count_use_the_median_of_nonzero_norms():
  g = [1.0, 1.0, 2.0, 1.0, 12.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # zeros: steps without signal
  assert stats.spike_ratio(g) == pytest.approx(12.0)  # median of non-zero = 1
  assert stats.count_spikes(g) == 1                    # 12 > 5 × 1; 2 is not
  assert stats.count_spikes(g, factor=1.5) == 2
  assert stats.count_spikes([1.0, float("nan"), 1.0]) == 1  # a non-finite norm is a spike
  assert stats.spike_ratio([0.0, 0.0]) is None
  assert stats.count_spikes([0.0, 0.0]) == 0


def test_collapse_needs_accuracy_to_stay_below_the_start():
  steps = [0, 10, 20, 30, 40]
  assert stats.collapse_step(steps, [0.3, 0.2, 0.1, 0.0, 0.0], start=0.3) == 10
  # recovers above the start: the dip is not a collapse
  assert stats.collapse_step(steps, [0.3, 0.1, 0.0, 0.35, 0.4], start=0.3) is None
  # dips, recovers, then falls for good: collapse from the last fall
  assert stats.collapse_step(steps, [0.3, 0.1, 0.4, 0.2, 0.1], start=0.3) == 30
  # one low final evaluation is noise, not a collapse
  assert stats.collapse_step(steps, [0.3, 0.4, 0.4, 0.4, 0.2], start=0.3) is None
  assert stats.collapse_step(steps, [0.3, 0.4, 0.4, 0.4, 0.2], start=0.3, min_evals=1) == 40
  # the margin tolerates evaluation noise
  assert stats.collapse_step(steps, [0.3, 0.29, 0.28, 0.29, 0.28], start=0.3, margin=0.03) is None


def test_binomial_margin_is_z_standard_errors():
  assert stats.binomial_margin(0.3, 256) == pytest.approx(2 * math.sqrt(0.21 / 256))
  assert stats.binomial_margin(0.0, 256) == 0.0
  assert stats.binomial_margin(0.3, 256, z=1.0) < stats.binomial_margin(0.3, 64, z=1.0)


def _study(acc: dict, collapses: dict | None = None, spikes: dict | None = None):
  """A synthetic stability study: {arm: [test accuracy per seed]}, collapses likewise,
  spikes {arm: grad-norm spikes of every run}."""
  collapses, spikes = collapses or {}, spikes or {}
  runs = [{"arm": arm, "seed": s, "summary": {"rl_accuracy": a},
           "stats": {"collapsed": bool((collapses.get(arm) or [0] * len(accs))[s]),
                     "grad_spikes": spikes.get(arm, 0), "bypass_fraction_mean": 0.01,
                     "abs_log_ratio": {"p99_first": 0.5}}}
          for arm, accs in acc.items() for s, a in enumerate(accs)]
  return {"seeds": max(len(v) for v in acc.values()), "arms": [{"name": a} for a in acc],
          "runs": runs}


def test_stability_verdicts_follow_the_paired_numbers():
  from dllm_rl.study.report import stability_verdicts
  grpo = [0.30, 0.40, 0.35, 0.20, 0.25]
  up = [g + d for g, d in zip(grpo, [0.10, 0.12, 0.08, 0.11, 0.09])]
  v = stability_verdicts(_study({"grpo@a": grpo, "stabledrl@a": up,
                                 "grpo_elbo1@a": grpo, "stabledrl_elbo1@a": grpo}))
  assert [x[0].split(" (")[0] for x in v] == ["stabledrl@a vs grpo@a",
                                               "stabledrl_elbo1@a vs grpo_elbo1@a"]
  assert v[0][1] == "reproduced" and "5 up, 0 down" in v[0][2]
  assert v[1][1].startswith("not reproduced (no difference")  # identical arms: d = 0
  assert "Likely reason: GRPO did not collapse in any seed" in v[1][2]
  down = [g - d for g, d in zip(grpo, [0.10, 0.12, 0.08, 0.11, 0.09])]
  v = stability_verdicts(_study({"grpo@a": grpo, "stabledrl@a": down},
                                {"grpo@a": [1, 1, 1, 1, 1], "stabledrl@a": [1, 1, 1, 1, 1]}))
  assert v[0][1].startswith("not reproduced (the opposite holds")
  assert "both collapsed in every seed" in v[0][2]
  noisy = [g + d for g, d in zip(grpo, [0.10, -0.05, 0.08, -0.02, 0.04])]
  v = stability_verdicts(_study({"grpo@a": grpo, "stabledrl@a": noisy}))
  assert v[0][1].startswith("inconclusive (the interval includes 0; about ")
  assert stability_verdicts(_study({"grpo@a": [0.3], "stabledrl@a": [0.5]}))[0][1].startswith(
      "not established")


def test_stability_reason_names_stabledrl_collapses_without_spikes_a_drift():
  from dllm_rl.study.report import stability_verdicts
  grpo = [0.30, 0.40, 0.35, 0.20, 0.25]
  noisy = [g + d for g, d in zip(grpo, [0.10, -0.05, 0.08, -0.02, -0.4])]
  collapsed = {"grpo@a": [1, 1, 0, 0, 0], "stabledrl@a": [0, 1, 0, 1, 1]}
  v = stability_verdicts(_study({"grpo@a": grpo, "stabledrl@a": noisy}, collapsed,
                                {"grpo@a": 5, "stabledrl@a": 0}))
  assert v[0][1].startswith("inconclusive")
  assert ("StableDRL's 3 collapse(s) came with 0.0 grad-norm spikes per run against GRPO's"
          " 5.0: a drift") in v[0][2]
  v = stability_verdicts(_study({"grpo@a": grpo, "stabledrl@a": noisy}, collapsed,
                                {"grpo@a": 1, "stabledrl@a": 2}))  # spikes too: no such line
  assert "a drift" not in v[0][2]


def test_stability_reason_names_the_no_eubo_control_when_it_removes_the_collapses():
  from dllm_rl.study.report import stability_verdicts
  grpo = [0.30, 0.40, 0.35, 0.20, 0.25]
  drift = [g + d for g, d in zip(grpo, [0.10, -0.05, 0.08, -0.02, -0.4])]
  collapsed = {"grpo@a": [1, 1, 0, 0, 0], "stabledrl@a": [0, 1, 0, 1, 1]}
  arms = {"grpo@a": grpo, "stabledrl@a": drift,
          "stabledrl_no_eubo@a": [x + 0.3 for x in drift]}
  v = stability_verdicts(_study(arms, collapsed, {"grpo@a": 5, "stabledrl@a": 0}))
  assert len(v) == 1  # the control is not a GRPO / StableDRL pair of its own
  assert ("the stabledrl_no_eubo@a control (the ELBO, not SPG's EUBO surrogate, as the gradient"
          " term of A < 0) collapsed in 0/5 seeds and ended 0.300") in v[0][2]
  assert "SPG's EUBO surrogate, which GRPO's loss does not use, drives these collapses" in v[0][2]
  arms["stabledrl_no_eubo@a"] = [x + d for x, d in zip(drift, [0.3, -0.3, 0.2, -0.2, 0.1])]
  v = stability_verdicts(_study(arms, collapsed, {"grpo@a": 5, "stabledrl@a": 0}))
  assert "collapsed in 0/5 seeds and ended" in v[0][2] and "drives these" not in v[0][2]


def test_ablation_verdicts_compare_stabledrl_with_each_single_component():
  from dllm_rl.study.report import ablation_verdicts
  full = [0.50, 0.55, 0.45, 0.60, 0.52]
  worse = [f - d for f, d in zip(full, [0.10, 0.12, 0.08, 0.11, 0.09])]
  better = [f + 0.2 for f in full]
  study = _study({"stabledrl@a": full, "clip_only@a": worse, "selfnorm_only@a": full,
                  "stabledrl_antithetic@a": worse, "selfnorm_only@b": worse,
                  "stabledrl_no_eubo@a": better},
                 {"clip_only@a": [1, 1, 0, 1, 1], "stabledrl@a": [0, 0, 0, 1, 1]},
                 {"stabledrl@a": 0, "stabledrl_no_eubo@a": 0})
  v = ablation_verdicts(study)
  # selfnorm_only@b has no stabledrl@b to pair with: no line
  assert [x[0] for x in v] == [
      "stabledrl@a vs clip_only@a (ablation: without self-normalisation)",
      "stabledrl@a vs selfnorm_only@a (ablation: without unconditional clipping)",
      "stabledrl_antithetic@a vs stabledrl@a (control)",
      "stabledrl_no_eubo@a vs stabledrl@a (control)"]
  assert v[0][1] == "reproduced" and "collapsed: clip_only@a 4/5, StableDRL 2/5" in v[0][2]
  assert v[1][1].startswith("not reproduced (no difference")  # identical: d = 0
  assert "selfnorm_only@a did not collapse in any seed (0/5) either" in v[1][2]
  assert "without unconditional clipping" in v[1][2]
  assert v[2][1] == "no claim" and "-0.100" in v[2][2] and "0 up, 5 down" in v[2][2]
  assert v[3][1] == "no claim" and "ELBO − SPG surrogate (ω = 0.5) for A < 0 0.200" in v[3][2]
  assert "collapsed: 0/5 with the ELBO, 2/5 with the surrogate" in v[3][2]
  # with GRPO at that lr, the ELBO arm against GRPO: StableDRL's weights on GRPO's term
  study = _study({"stabledrl@a": full, "stabledrl_no_eubo@a": better, "grpo@a": worse},
                 {"grpo@a": [1, 1, 0, 0, 0]}, {"grpo@a": 4, "stabledrl_no_eubo@a": 0})
  v = ablation_verdicts(study)
  assert [x[0] for x in v] == [
      "stabledrl_no_eubo@a vs stabledrl@a (control)",
      "stabledrl_no_eubo@a vs grpo@a (control: StableDRL's weights on GRPO's gradient term)"]
  assert v[1][1] == "no claim" and "stabledrl_no_eubo@a − GRPO 0.300" in v[1][2]
  assert "5 up, 0 down" in v[1][2] and "collapsed: 0/5 and 2/5" in v[1][2]
  assert "grad-norm spikes per run 0.0 and 4.0" in v[1][2]
  # with GRPO on shared masks at that lr, StableDRL on shared masks against it: the weights
  study = _study({"stabledrl@a": full, "stabledrl_antithetic@a": worse, "grpo_antithetic@a": full},
                 {"stabledrl_antithetic@a": [0, 0, 0, 1, 1]}, {})
  v = ablation_verdicts(study)
  assert [x[0] for x in v] == [
      "stabledrl_antithetic@a vs stabledrl@a (control)",
      "stabledrl_antithetic@a vs grpo_antithetic@a (control: StableDRL's weights against GRPO's"
      " clip, both on shared masks)"]
  assert v[1][1] == "no claim" and "StableDRL − GRPO, both with shared masks -0.100" in v[1][2]
  assert "0 up, 5 down" in v[1][2] and "collapsed: StableDRL 2/5, GRPO 0/5" in v[1][2]


def test_grpo_control_lines_pair_each_control_with_grpo_and_stabledrl_at_its_lr():
  from dllm_rl.study.report_controls import grpo_control_verdicts
  grpo = [0.10, 0.05, 0.00, 0.08, 0.02]
  kl = [g + d for g, d in zip(grpo, [0.20, 0.30, 0.25, 0.00, 0.10])]
  full = [k + 0.1 for k in kl]
  study = _study({"grpo@a": grpo, "grpo_kl@a": kl, "stabledrl@a": full, "grpo_kl@b": kl},
                 {"grpo@a": [1] * 5, "grpo_kl@a": [0, 0, 0, 1, 0]},
                 {"grpo@a": 9, "grpo_kl@a": 1, "stabledrl@a": 0})
  for arm in study["arms"]:
    if arm["name"].startswith("grpo_kl"):
      arm["overrides"] = {"rl.kl_coef": 0.04}
  top, zero = {"grpo@a": 300.0, "grpo_kl@a": 20.0, "stabledrl@a": 2.0}, {"grpo@a": 120}
  for r in study["runs"]:
    r["stats"].update(grad_norm_max=top.get(r["arm"], 1.0), zero_grad_steps=zero.get(r["arm"], 0))
  v = grpo_control_verdicts(study)
  # grpo_kl@b has neither grpo@b nor stabledrl@b: no line
  assert [x[0] for x in v] == [
      "grpo_kl@a vs grpo@a (control: GRPO with and without the KL term (β = 0.04))",
      "stabledrl@a vs grpo_kl@a (control: StableDRL against GRPO with the KL term (β = 0.04))"]
  assert all(x[1] == "no claim" for x in v)
  assert "with − without the KL term (β = 0.04) 0.170" in v[0][2]
  assert "4 up, 0 down, 1 tied" in v[0][2]
  assert ("collapsed: 1/5 with, 5/5 without; a run's largest pre-clip grad norm (mean over seeds)"
          " 20 and 300;") in v[0][2]
  assert "its steps with gradient 0 (mean over seeds) 0.0 and 120.0" in v[0][2]
  assert "StableDRL − GRPO with the KL term (β = 0.04) 0.100" in v[1][2]
  assert "collapsed: StableDRL 0/5, GRPO with the KL term (β = 0.04) 1/5" in v[1][2]
  assert ("a run's largest pre-clip grad norm (mean over seeds) 2 and 20; its steps with"
          " gradient 0 (mean over seeds) 0.0 and 0.0") in v[1][2]
  assert "bypass fraction (A < 0, ρ̂ > 1 + ε) 1.00% and 1.00%" in v[0][2]
  # shared masks: the same two lines, named by what the arm changes
  study = _study({"grpo@a": grpo, "grpo_antithetic@a": kl, "stabledrl@a": full})
  for r in study["runs"]:
    r["stats"].update(grad_norm_max=1.0, zero_grad_steps=0,
                      bypass_fraction_mean=0.0 if r["arm"] == "grpo_antithetic@a" else 0.1)
  v = grpo_control_verdicts(study)
  assert [x[0] for x in v] == [
      "grpo_antithetic@a vs grpo@a (control: GRPO with and without shared masks)",
      "stabledrl@a vs grpo_antithetic@a (control: StableDRL against GRPO with shared masks)"]
  assert "with − without shared masks 0.170" in v[0][2]
  assert "bypass fraction (A < 0, ρ̂ > 1 + ε) 0.00% and 10.00%" in v[0][2]


def test_low_lr_control_lines_compare_grpo_below_the_grid_with_its_start_and_stabledrl():
  from dllm_rl.study.report_controls import low_lr_control_verdicts
  low = [0.45, 0.40, 0.50, 0.42, 0.44]
  full = [x + 0.1 for x in low]
  study = _study({"stabledrl@lr2e-4": full, "grpo_low@lr2e-5": low, "stabledrl@lr6e-4": low},
                 {"grpo_low@lr2e-5": [0, 0, 0, 0, 1]})
  study["base_config"] = {"rl": {"lr": 2e-4}}
  study["sft"] = {str(s): {"sft_accuracy": x - 0.05} for s, x in enumerate(low)}
  v = low_lr_control_verdicts(study)
  assert [x[0] for x in v] == [
      "grpo_low@lr2e-5 improves on the SFT start (control: GRPO below the lr grid)",
      "stabledrl@lr2e-4 vs grpo_low@lr2e-5 (control: StableDRL at the default lr against GRPO"
      " below the grid)"]
  assert all(x[1] == "no claim" for x in v)
  assert "grpo_low@lr2e-5 − SFT 0.050" in v[0][2] and "collapsed: 1/5" in v[0][2]
  assert "StableDRL − grpo_low@lr2e-5 0.100" in v[1][2] and "5 up, 0 down" in v[1][2]
  assert "collapsed: StableDRL 0/5, grpo_low@lr2e-5 1/5" in v[1][2]
  # a study-wide --config.rl.lr does not move the grid (every arm sets its own rl.lr, built
  # from the base config): the default is still the base's lr, not the aggressive arm's 6e-4
  study["overrides"] = {"rl.lr": 6e-4}
  assert low_lr_control_verdicts(study)[1][0].startswith("stabledrl@lr2e-4 vs grpo_low@lr2e-5")
  # another testbed's base lr (chain: 2e-5) names its own default arm
  study = _study({"stabledrl@lr2e-5": full, "grpo_low@lr2e-6": low})
  study["base_config"] = {"rl": {"lr": 2e-5}}
  study["sft"] = {str(s): {"sft_accuracy": x} for s, x in enumerate(low)}
  assert [x[0].split(" (")[0] for x in low_lr_control_verdicts(study)] == [
      "grpo_low@lr2e-6 improves on the SFT start", "stabledrl@lr2e-5 vs grpo_low@lr2e-6"]
  # without a base config (an older JSON) there is no default arm to compare: the gain only
  del study["base_config"]
  assert len(low_lr_control_verdicts(study)) == 1


def test_the_stability_arms_ignore_a_study_wide_lr_so_the_report_reads_the_base_lr():
  """What the report's default-lr tag relies on: the arms' own rl.lr wins over the study's."""
  from dllm_rl.config.defaults import get_config
  from dllm_rl.study import arms as arms_lib
  from dllm_rl.study.runner import arm_run_overrides
  base = get_config()
  full = next(a for a in arms_lib.STUDIES.get("stability")(base) if a.name == "stabledrl@lr2e-4")
  assert arm_run_overrides(0, arms_lib.QUICK, {"rl.lr": 6e-4}, full.overrides)["rl.lr"] == 2e-4


@pytest.mark.parametrize("collapsed, reason", [
    ([0] * 9 + [1], "clip_only@a collapsed in only 1/10 seeds (StableDRL in 0/10): without"
                    " self-normalisation the other component alone kept training stable in 9"
                    " of 10 seeds"),
    ([0] * 8 + [1, 1], "clip_only@a collapsed in 2/10 seeds, StableDRL in 0/10;"),
    ([0] * 10, "clip_only@a did not collapse in any seed (0/10) either")])
def test_ablation_reason_names_a_rare_collapse_as_rare(collapsed, reason):
  from dllm_rl.study.report import ablation_verdicts
  full = [0.50, 0.55, 0.45, 0.60, 0.52, 0.48, 0.51, 0.57, 0.44, 0.53]
  same = [f + d for f, d in zip(full, [0.003, -0.004, 0.002, -0.001, 0.0] * 2)]
  v = ablation_verdicts(_study({"stabledrl@a": full, "clip_only@a": same},
                               {"clip_only@a": collapsed}))
  assert v[0][1].startswith("not reproduced (no difference") and reason in v[0][2]


def test_steprs_verdicts_compare_pass_at_8_and_distinct_answers():
  from dllm_rl.study.report import steprs_verdicts
  def run(arm, s, p8, distinct):
    return {"arm": arm, "seed": s, "summary": {"rl_pass_at_k": {"8": p8},
                                               "rl_distinct_correct": distinct}}
  runs = [run("centered", s, 0.5, 1.0) for s in range(4)]
  runs += [run("steprs", s, 0.5 + 0.05 + 0.01 * s, 1.0) for s in range(4)]
  study = {"arms": [{"name": "centered"}, {"name": "steprs"}], "runs": runs}
  v = {what: verdict for what, verdict, _ in steprs_verdicts(study)}
  assert v["steprs vs centered, pass@8"] == "reproduced"
  assert v["steprs vs centered, distinct"].startswith("not reproduced (no difference")
  reason = [e for w, _, e in steprs_verdicts(study) if "distinct" in w][0]
  assert "1.00 distinct correct answers per prompt: the task has one" in reason
  # a many-answer task (chain) whose policies find one answer per solved prompt (distinct =
  # pass@8): the reason says so; where some prompts get several (distinct > pass@8) it does not
  one = [run(r["arm"], r["seed"], 0.9, 0.9) for r in runs]
  chain = {**study, "runs": one, "base_config": {"task": {"name": "chain"}}}
  reason = [e for w, _, e in steprs_verdicts(chain) if "distinct" in w][0]
  assert "the `chain` task has many, but the SFT start writes one form" in reason
  several = {**study, "base_config": {"task": {"name": "chain"}}}  # distinct 1.0 > pass@8 0.5
  reason = [e for w, _, e in steprs_verdicts(several) if "distinct" in w][0]
  assert "writes one form" not in reason
  sudoku = {**study, "base_config": {"task": {"name": "sudoku"}}}  # one solution per puzzle
  reason = [e for w, _, e in steprs_verdicts(sudoku) if "distinct" in w][0]
  assert "1.00 distinct correct answers per prompt: the task has one" in reason


def test_steprs_report_names_a_policy_rl_did_not_narrow_and_shows_the_start():
  from dllm_rl.study.report import steprs_verdicts
  from dllm_rl.study.report_tables import steprs_table
  def run(arm, s, p8, diversity):
    return {"arm": arm, "seed": s, "overrides": {},
            "summary": {"rl_accuracy": 0.6, "rl_pass_at_k": {"1": 0.33, "4": 0.7, "8": p8},
                        "rl_distinct_correct": 2.3, "rl_diversity": diversity},
            "stats": {"start_val_accuracy": 0.4, "final_val_accuracy": 0.8}}
  noisy = [0.01, -0.03, 0.02, -0.01]
  runs = [run("centered", s, 0.9, 7.4) for s in range(4)]
  runs += [run("steprs", s, 0.9 + d, 7.5) for s, d in enumerate(noisy)]
  start = {"sft_accuracy": 0.25, "sft_val_accuracy": 0.39, "sft_diversity": 7.8,
           "sft_pass_at_k": {"1": 0.26, "4": 0.66, "8": 0.86}}
  study = {"arms": [{"name": "centered"}, {"name": "steprs"}], "runs": runs,
           "shared_sft": True, "sft": {str(s): start for s in range(4)},
           "base_config": {"task": {"name": "sum_split"}}}
  reason = [e for w, v, e in steprs_verdicts(study) if w == "steprs vs centered, pass@8"
            and v.startswith("inconclusive")][0]
  assert ("centered GRPO kept 7.40 distinct answers in 8 samples (the SFT start 7.80), and its"
          " pass@1 at T = 1 is 0.330 against the start's 0.260") in reason
  table = steprs_table(study).splitlines()
  assert table[2] == ("| SFT start | — | 0.250 | 0.260 | 0.660 | 0.860 | — | 7.80 | 0.390 | — |"
                      " — | — | — |")
  assert table[3].startswith("| centered | main | 0.600 ± 0.000 |")
  assert "| 7.40 ± 0.00 |" in table[3]
  assert table[3].endswith("| 0/4 | n/a | n/a | — |")  # no per-step metrics recorded
  # mean |A| and entropy over the second half of the RL steps (steps 3-4 of 4: 0.2 and 0.4)
  steps = [{"step": t, "adv_abs_mean": 0.1 * t, "entropy": 1.0 - 0.1 * t} for t in range(5)]
  with_steps = {**study, "runs": [{**r, "steps": steps} for r in runs]}
  assert steprs_table(with_steps).splitlines()[4].endswith(
      "| 0.350 ± 0.000 | 0.650 ± 0.000 | — |")
  # a policy RL narrowed (7.8 → 3 distinct answers): that reason is not given
  narrowed = {**study, "runs": [{**r, "summary": {**r["summary"], "rl_diversity": 3.0}}
                                for r in runs]}
  reason = [e for w, _, e in steprs_verdicts(narrowed) if w == "steprs vs centered, pass@8"][0]
  assert "did not narrow" not in reason and "seed-to-seed spread" in reason
  # StepRS narrowed it more than centered GRPO on every seed: the reason says so, with numbers
  more = {**narrowed, "runs": [{**r, "summary": {**r["summary"], "rl_diversity": 2.5 + 0.1 * (
      r["seed"] % 2)}} if r["arm"] == "steprs" else r for r in narrowed["runs"]]}
  reason = [e for w, _, e in steprs_verdicts(more) if w == "steprs vs centered, pass@8"][0]
  assert ("steprs narrowed the sampling policy more than centered GRPO (2.55 against 3.00"
          " distinct answers in 8 samples; paired -0.45 ± 0.09)") in reason
  assert "seed-to-seed spread" not in reason
  # decidedly lower with no computed reason: not blamed on the seed-to-seed spread
  lower = {**narrowed, "runs": [{**r, "summary": {**r["summary"], "rl_pass_at_k": {
      **r["summary"]["rl_pass_at_k"], "8": 0.8 + 0.01 * (r["seed"] % 2)}}}
      if r["arm"] == "steprs" else r for r in narrowed["runs"]]}
  (verdict, reason), = [(v, e) for w, v, e in steprs_verdicts(lower)
                        if w == "steprs vs centered, pass@8"]
  assert verdict.startswith("not reproduced (the opposite holds")
  assert "none of the report's computed reasons applies: the arm is decidedly lower" in reason
  # ... and where its greedy validation accuracy ended decidedly below the baseline's, it
  # learned less: that is the reason (against the comparison's own baseline)
  worse = {**lower, "runs": [{**r, "stats": {**r["stats"], "final_val_accuracy": 0.7 + 0.01 * (
      r["seed"] % 2)}} if r["arm"] == "steprs" else r for r in lower["runs"]]}
  (reason,) = [e for w, _, e in steprs_verdicts(worse) if w == "steprs vs centered, pass@8"]
  assert ("steprs learned less than centered: its final greedy validation accuracy is 0.705"
          " against 0.800 (paired -0.095 ± 0.009)") in reason
  assert "none of the report's computed reasons" not in reason and "collapsed" not in reason
  # a seed whose StepRS run collapsed: the table counts it and the reason names it
  fell = {**lower, "runs": [{**r, "stats": {**r["stats"], "collapsed": True}}
                            if r["arm"] == "steprs" and r["seed"] == 2 else r
                            for r in lower["runs"]]}
  assert "| 1/4 |" in steprs_table(fell).splitlines()[4]
  (reason,) = [e for w, _, e in steprs_verdicts(fell) if w == "steprs vs centered, pass@8"]
  assert "runs collapsed (steprs 1/4 seeds, centered 0/4" in reason
  assert "failed every rollout" not in reason  # no per-step records: nothing claimed
  # ... and where that run's rollouts all failed from step 6 to the end (no gradient), the
  # reason says it stayed there; its malformed fraction, where recorded, names the format
  dead = [{"step": t, "grad_norm": 0.0 if t >= 6 else 1.0, "accuracy": 0.0 if t >= 6
           else 0.4, **({"malformed_fraction": 0.75 + 0.25 * (t > 6)} if t >= 6 else {})}
          for t in range(1, 11)]
  stuck = {**fell, "runs": [{**r, "steps": dead} if r["arm"] == "steprs" and r["seed"] == 2
                            else r for r in fell["runs"]]}
  (reason,) = [e for w, _, e in steprs_verdicts(stuck) if w == "steprs vs centered, pass@8"]
  assert ("of those, steprs seed(s) 2 (from step 6) failed every rollout to the end: every group's"
          " rewards equal, so the advantages and the gradient were 0") in reason
  assert "(95% of those rollouts malformed: the output format collapsed)" in reason
  solved = [{**x, "accuracy": 1.0} for x in dead]  # every group solved: not that state
  done = {**fell, "runs": [{**r, "steps": solved} if r["arm"] == "steprs" else r
                           for r in fell["runs"]]}
  (reason,) = [e for w, _, e in steprs_verdicts(done) if w == "steprs vs centered, pass@8"]
  assert "failed every rollout" not in reason


def test_signal_lost_step_is_the_start_of_a_final_zero_gradient_stretch():
  steps = list(range(1, 11))
  assert stats.signal_lost_step(steps, [1, 1, 0, 1, 0, 0, 0, 0, 0, 0]) == 5
  assert stats.signal_lost_step(steps, [0, 0, 0, 0, 0, 0, 0, 0, 0, 1]) is None  # it moved again
  assert stats.signal_lost_step(steps, [1.0] * 10) is None
  assert stats.signal_lost_step(steps, [0.0] * 10) == 1
  # a short stretch at the end (below min_fraction of the steps) is not one
  assert stats.signal_lost_step(list(range(100)), [1.0] * 95 + [0.0] * 5) is None
  assert stats.signal_lost_step(list(range(100)), [1.0] * 90 + [0.0] * 10) == 90
  with pytest.raises(ValueError, match="10 steps but 9 gradient norms"):
    stats.signal_lost_step(steps, [0.0] * 9)


def test_paired_differences_interval_and_sign_count():
  a = {0: 0.50, 1: 0.40, 2: 0.45, 3: None, 4: 0.30}
  b = {0: 0.40, 1: 0.40, 2: 0.35, 3: 0.20, 5: 0.10}
  p = stats.paired(a, b)
  assert p["seeds"] == [0, 1, 2]            # seed 3 (None) and the unpaired 4, 5 dropped
  assert p["diffs"] == pytest.approx([0.1, 0.0, 0.1])
  assert (p["wins"], p["losses"], p["ties"]) == (2, 0, 1)
  d = np.array([0.1, 0.0, 0.1])
  assert p["mean"] == pytest.approx(d.mean())
  assert p["half_width"] == pytest.approx(4.302652729911275 * d.std(ddof=1) / math.sqrt(3))
  # the pairing matters: unpaired intervals of the same numbers are much wider
  unpaired = stats.t_interval([0.5, 0.4, 0.45])["half_width"] + stats.t_interval(
      [0.4, 0.4, 0.35])["half_width"]
  assert p["half_width"] < unpaired


def test_quantiles_of_log_ratios():
  x = list(range(101))  # 0..100: the q-quantile is 100 q exactly
  q = stats.quantiles(x + [float("inf"), None])
  assert q == {"p50": 50.0, "p90": 90.0, "p99": 99.0, "max": 100.0}
  assert stats.quantiles([]) == {"p50": None, "p90": None, "p99": None, "max": None}


def test_verdict_rules_on_constructed_comparisons():
  mk = lambda diffs: stats.paired(dict(enumerate(diffs)), dict.fromkeys(range(len(diffs)), 0.0))
  assert stats.verdict(mk([0.10, 0.12, 0.08, 0.11, 0.09]), 0.02, "x") == "reproduced"
  assert stats.verdict(mk([-0.10, -0.12, -0.08, -0.11, -0.09]), 0.02, "x").startswith(
      "not reproduced (the opposite holds")
  eq = stats.verdict(mk([0.001, -0.002, 0.0, 0.002, -0.001]), 0.02, "x")
  assert eq.startswith("not reproduced (no difference as large as 0.02")
  inc = stats.verdict(mk([0.10, -0.05, 0.08, -0.02, 0.04]), 0.02, "x")
  assert inc.startswith("inconclusive (the interval includes 0")
  assert stats.verdict(mk([0.1]), 0.02, "x").startswith("not established")


def test_an_effect_no_thousand_seeds_resolve_is_not_given_a_seed_count():
  """seeds_to_decide reports "more than 1000" as 1001: the verdict says so rather than
  "about 1001 seeds"."""
  noisy = stats.paired({0: 0.5, 1: -0.5, 2: 0.001}, {0: 0.0, 1: 0.0, 2: 0.0})
  got = stats.verdict(noisy, 1e-4, "x")
  assert got.startswith("inconclusive (the interval includes 0; more than 1000 seeds would")


def test_seeds_to_decide_is_the_least_n_whose_interval_excludes_zero():
  from scipy.stats import t
  n = stats.seeds_to_decide(0.1, 0.05)
  assert t.ppf(0.975, n - 1) * 0.1 / math.sqrt(n) < 0.05
  assert t.ppf(0.975, n - 2) * 0.1 / math.sqrt(n - 1) >= 0.05
  assert stats.seeds_to_decide(None, 0.05) is None and stats.seeds_to_decide(0.1, 0.0) is None
  assert stats.seeds_to_decide(1.0, 1e-4) == 1001


def test_baselines_verdicts_pair_each_arm_with_its_seeds_sft_start():
  from dllm_rl.study.report import baselines_verdicts
  from dllm_rl.study.report_tables import baselines_table
  sft = {"0": {"sft_accuracy": 0.30}, "1": {"sft_accuracy": 0.40}, "2": {"sft_accuracy": 0.35}}
  runs = [{"arm": "wd1", "seed": s, "summary": {"rl_accuracy": a},
           "stats": {"start_val_accuracy": 0.3, "final_val_accuracy": 0.5}}
          for s, a in enumerate([0.50, 0.62, 0.54])]
  study = {"arms": [{"name": "wd1"}], "runs": runs, "sft": sft}
  (what, verdict, evidence), = baselines_verdicts(study)
  assert verdict == "reproduced" and "+0.200, +0.220, +0.190" in evidence
  assert "| wd1 | 0.553" in baselines_table(study)


def test_report_header_names_the_code_and_machine_of_the_runs():
  from dllm_rl.study.report import run_provenance
  study = _study({"grpo@a": [0.3, 0.4, 0.5], "stabledrl@a": [0.3, 0.4, 0.5]})
  for r, commit in zip(study["runs"], ["abc", "abc", "abc", "def", None, None]):
    if commit:
      r.update(commit=commit, machine="box")
  assert run_provenance([study]) == "abc, box: 3 runs; not recorded: 2 runs; def, box: 1 run"


def test_a_start_below_its_warm_up_target_leads_every_likely_reason():
  from dllm_rl.study.report import stability_verdicts, steprs_verdicts, weak_start
  grpo = [0.30, 0.40, 0.35]
  study = _study({"grpo@a": grpo, "stabledrl@a": grpo})
  study["base_config"] = {"sft": {"target_accuracy": 0.25}}
  study["sft"] = {"0": {"sft_val_accuracy": 0.3, "sft_accuracy": 0.28, "sft_steps": 900},
                  "1": {"sft_val_accuracy": 0.0, "sft_accuracy": 0.031, "sft_steps": 1500},
                  "2": {"sft_val_accuracy": 0.26, "sft_accuracy": 0.3, "sft_steps": 700}}
  why = weak_start(study)
  assert why.startswith("the SFT start of 1/3 seed(s) stopped below its warm-up target"
                        " (validation 0.000 < 0.25 after 1500 steps; test 0.031)")
  (v,) = stability_verdicts(study)
  assert v[1].startswith("not reproduced") and f"Likely reason: {why}; GRPO did not" in v[2]
  study["overrides"] = {"sft.target_accuracy": 0.0}  # the study's override wins: no target
  assert weak_start(study) is None
  assert "warm-up target" not in stability_verdicts(study)[0][2]
  study["overrides"] = {}
  study["sft"]["1"]["sft_val_accuracy"] = 0.25  # every start reached it
  assert weak_start(study) is None
  steprs = _study({"centered": grpo, "steprs": grpo})
  steprs["base_config"] = {"sft": {"target_accuracy": 0.25}}
  steprs["sft"] = {"0": {"sft_val_accuracy": 0.1, "sft_accuracy": 0.1, "sft_steps": 10}}
  assert "Likely reason: the SFT start of 1/1 seed(s)" in steprs_verdicts(steprs)[0][2]


def test_the_multiplicity_note_counts_the_judged_comparisons_only():
  """A section judging n comparisons on 95% intervals says that about 0.025·n of them would read
  "reproduced" by chance where no arm differs, and how many did; "no claim" and one-seed
  ("not established") lines are not judged, and one judged line needs no note."""
  from dllm_rl.study import multiplicity
  verdicts = ["reproduced", "inconclusive (the interval includes 0; ...)", "no claim",
              "not reproduced (no difference as large as 0.02: ...)", "reproduced",
              "not established (1 seed(s); a paired interval needs ≥ 2)"]
  note = multiplicity.multiplicity_note([(f"c{i}", v) for i, v in enumerate(verdicts)])
  assert note.startswith("Multiplicity: 4 comparisons are judged above")
  assert "about 0.10 of them would by chance (2 did)" in note
  assert "Holm" not in note  # plain strings carry no p-values
  assert multiplicity.multiplicity_note([("a", "reproduced"), ("b", "no claim"),
                                   ("c", "not established (1 seed(s))")]) == ""


def test_one_sided_p_agrees_with_the_verdicts_interval():
  """p < 0.025 exactly when the 95% interval lies above 0 ("reproduced"): the t statistic
  against t_{0.975, n−1}; hand-checked values: mean 1, sd 1, n = 5 gives t = √5 ≈ 2.236,
  P(T_4 ≥ 2.236) ≈ 0.0445; a constant positive difference gives 0, fewer than 2 seeds None."""
  from dllm_rl.study.stats import one_sided_p, paired, verdict
  c = paired({s: 1.0 + d for s, d in enumerate([-1.0, 1.0, 0.5, -0.5, 0.0])},
             dict.fromkeys(range(5), 0.0))
  assert c["mean"] == pytest.approx(1.0) and c["sd"] == pytest.approx(math.sqrt(0.625))
  t = 1.0 / (math.sqrt(0.625) / math.sqrt(5))
  assert one_sided_p(c) == pytest.approx(_t_sf(t, 4))
  rng = np.random.default_rng(0)
  for _ in range(200):
    n = int(rng.integers(2, 9))
    diffs = rng.normal(rng.uniform(-1, 1), rng.uniform(0.1, 2), n)
    c = paired(dict(enumerate(diffs)), dict.fromkeys(range(n), 0.0))
    v = verdict(c, 0.02, "x")
    assert v.p_one_sided == one_sided_p(c)
    assert (v == "reproduced") == (v.p_one_sided < 0.025)
  assert one_sided_p(paired({0: 2.0, 1: 2.0}, {0: 1.0, 1: 1.0})) == 0.0
  assert one_sided_p(paired({0: 2.0}, {0: 1.0})) is None


def _t_sf(t: float, df: int) -> float:
  from scipy import stats
  return float(stats.t.sf(t, df))


def test_holm_steps_down_and_stops_at_the_first_kept_hypothesis():
  """Holm at 0.05 on four p-values: sorted 0.01 ≤ 0.05/4, 0.015 ≤ 0.05/3, 0.03 > 0.05/2
  stops, so 0.04 (≤ 0.05/1 on its own) stands too; the input order is kept."""
  from dllm_rl.study.stats import holm
  assert holm([0.03, 0.01, 0.04, 0.015], 0.05) == [False, True, False, True]
  assert holm([0.001, 0.001], 0.025) == [True, True]
  assert holm([0.02], 0.025) == [True] and holm([], 0.025) == []


def test_the_multiplicity_note_says_which_reproduced_lines_holm_keeps():
  """With the verdicts' p-values: a strong "reproduced" line survives Holm over the section's
  judged comparisons, a marginal one (p just under 0.025, one of seven) does not; the verdict
  lines themselves are unchanged."""
  from dllm_rl.study import multiplicity
  from dllm_rl.study.stats import Verdict
  lines = [("strong", Verdict("reproduced", 1e-5)), ("marginal", Verdict("reproduced", 0.012)),
           *[(f"n{i}", Verdict("inconclusive (the interval includes 0; ...)", 0.3))
             for i in range(5)], ("ctl", "no claim")]
  note = multiplicity.multiplicity_note(lines)
  assert "7 comparisons are judged" in note and "(2 did)" in note
  assert note.endswith("keeps 1 of the 2 \"reproduced\" lines; it does not keep marginal.")
  lone = multiplicity.multiplicity_note([lines[1], *lines[2:4]])
  assert lone.endswith("does not keep the one \"reproduced\" line, marginal.")
  assert multiplicity.multiplicity_note([lines[0], *lines[2:4]]).endswith(
      "keeps the one \"reproduced\" line.")
  both = multiplicity.multiplicity_note([lines[0], (lines[1][0], Verdict("reproduced", 0.002))])
  assert both.endswith("keeps 2 of the 2 \"reproduced\" lines.")


def test_holm_never_rejects_a_nan_p_value_and_keeps_the_others_order():
  """A NaN p-value (a NaN paired difference) counts in m but is never rejected, and does not
  scramble the order of the others: 0.001 ≤ 0.025/3 and 0.01 ≤ 0.025/2 are rejected."""
  from dllm_rl.study.stats import holm
  nan = float("nan")
  assert holm([0.01, nan, 0.001], 0.025) == [True, False, True]
  assert holm([nan, 0.001], 0.025) == [False, True]
  assert holm([nan], 0.025) == [False]


def test_runs_without_validation_after_step_0_are_not_judged_not_counted_as_not_collapsed():
  """``--rl_steps`` below ``--eval_every``: every run's stats say collapsed False with
  final_val_accuracy None. The report counted them "0/5 collapsed" and reasoned "GRPO did not
  collapse in any seed"; now the column, the evidence and the reason say not judged."""
  from dllm_rl.study import figures as fig
  from dllm_rl.study.report import stability_verdicts
  from dllm_rl.study.report_tables import stability_table
  grpo = [0.30, 0.40, 0.35, 0.20, 0.25]
  study = _study({"grpo@a": grpo, "stabledrl@a": grpo})
  study["size"] = {"rl_steps": 3, "eval_every": 20}
  for r in study["runs"]:
    r["stats"].update(start_val_accuracy=0.3, final_val_accuracy=None)
  assert fig.collapses(study, "grpo@a") == (0, 0)
  assert fig.collapsed(study, "grpo@a") == "not judged (no validation after step 0)"
  assert "| not judged (no validation after step 0) |" in stability_table(study)
  (_, verdict, evidence), = stability_verdicts(study)
  assert "did not collapse" not in evidence and "0/5" not in evidence
  assert ("collapsed: GRPO not judged (no validation after step 0), StableDRL not judged"
          in evidence)
  assert ("Likely reason: collapse not judged (no validation after step 0) for GRPO and"
          " StableDRL: the runs are shorter than the validation interval" in evidence)
  assert fig.unjudged_note(study).startswith(
      "**10 of 10 runs validated only at step 0 (--rl_steps=3 is below --eval_every=20)")
  study["runs"][0]["stats"]["final_val_accuracy"] = 0.5  # one run judged: counted apart
  assert fig.collapsed(study, "grpo@a") == "0/1 (4 not judged: no validation after step 0)"
  for r in study["runs"]:
    r["stats"]["final_val_accuracy"] = 0.5
  assert fig.collapsed(study, "grpo@a") == "0/5" and fig.unjudged_note(study) is None
