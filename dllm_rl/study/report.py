"""docs/results.md from the study JSON: tables (mean ± 95% t-interval across seeds:
:mod:`dllm_rl.study.report_tables`), plots, the exact command, the machine, the wall time, and
one verdict per claim, computed here from the tables' numbers (the control lines:
:mod:`dllm_rl.study.report_controls`; the files beside it: :mod:`dllm_rl.study.report_files`)."""

from __future__ import annotations

import collections

from dllm_rl.study import figures as fig
from dllm_rl.study import report_tables as tables
from dllm_rl.study import stats
from dllm_rl.study.multiplicity import multiplicity_note
from dllm_rl.study.report_controls import grpo_control_verdicts, low_lr_control_verdicts


def cell(text: str) -> str:
  """``text`` as a markdown table cell: its pipes escaped, so they do not split the cell."""
  return text.replace("|", "\\|")


def seeds_label(study: dict) -> str:
  """"N seed(s)", naming the range when it does not start at seed 0 (``--first_seed``)."""
  n, first = study["seeds"], study.get("first_seed") or 0
  return f"{n} seed(s)" + (f" (seeds {first}–{first + n - 1})" if first else "")


# The smallest accuracy difference of interest (2 points): inside ±this is "no difference".
MIN_EFFECT = 0.02
# Centered GRPO "did not narrow" the policy: it keeps ≥ 90% of the start's distinct answers.
NARROWING = 0.9


def _stuck_note(study: dict, arms: tuple[str, ...]) -> str:
  """Which runs of ``arms`` ended in the absorbing all-zero state, and, where the runs
  recorded it, how many of those rollouts the verifier could not parse."""
  parts, malformed = [], []
  for arm in arms:
    stuck = [(r, at) for r in fig.runs(study, arm)
             if (at := stats.all_wrong_from(r.get("steps") or [])) is not None]
    if stuck:
      at_steps = ", ".join(f"{r['seed']} (from step {at})" for r, at in stuck)
      parts.append(f"{arm} seed(s) {at_steps}")
    malformed += [x["malformed_fraction"] for r, at in stuck for x in r["steps"]
                  if x["step"] >= at and "malformed_fraction" in x]
  note = (f"; of those, {' and '.join(parts)} failed every rollout to the end: every"
          " group's rewards equal, so the advantages and the gradient were 0 and nothing could"
          " bring the policy back" if parts else "")
  if malformed:
    note += (f" ({100 * sum(malformed) / len(malformed):.0f}% of those rollouts malformed:"
             " the output format collapsed)")
  return note


def _collapse_reason(other: str, collapses: tuple[int, int, int, int], if_stable: str,
                     if_rare: str) -> str:
  """How StableDRL's collapses compare with the ``other`` arm's; ``collapses``: (other
  collapsed, other seeds, StableDRL collapsed, StableDRL seeds); ``if_stable`` follows the
  statement that the other arm never collapsed, ``if_rare`` the statement that it collapsed
  rarely: in at most one seed or a tenth of them, and no more often than StableDRL did + 1.
  The counts are of the seeds whose collapse could be judged (figures.collapses): with none
  of an arm, collapse is not judged, and no statement about it is made."""
  oc, on, sc, sn = collapses
  if on == 0 or sn == 0:
    unjudged = " and ".join(arm for arm, n in ((other, on), ("StableDRL", sn)) if n == 0)
    return (f"collapse {fig.NOT_JUDGED} for {unjudged}: the runs are shorter than the"
            " validation interval (--rl_steps below --eval_every)")
  if oc == 0:
    return f"{other} did not collapse in any seed (0/{on}){if_stable}"
  if oc == on and sc == sn:
    return f"both collapsed in every seed ({oc}/{on}): the lr is too high for either"
  if oc <= max(1, on // 10) and oc <= sc + 1:
    return f"{other} collapsed in only {oc}/{on} seeds (StableDRL in {sc}/{sn}){if_rare}"
  return f"{other} collapsed in {oc}/{on} seeds, StableDRL in {sc}/{sn}"


def weak_start(study: dict) -> str | None:
  """The warm-up's failure, when some seed's SFT start stopped below ``sft.target_accuracy``
  (validation accuracy at its last evaluation; the study's overrides, else its base config):
  the first likely reason of every verdict, since RL from a start that rarely answers
  correctly sees almost no reward. None when every start reached it (or no target is set)."""
  base_sft = (study.get("base_config") or {}).get("sft") or {}
  target = (study.get("overrides") or {}).get("sft.target_accuracy",
                                              base_sft.get("target_accuracy"))
  if not target:
    return None
  sft = study.get("sft") or {}
  short = {seed: s for seed, s in sft.items()
           if s.get("sft_val_accuracy") is not None and s["sft_val_accuracy"] < target}
  if not short:
    return None
  val = ", ".join(f"{s['sft_val_accuracy']:.3f}" for s in short.values())
  test = ", ".join(f"{s['sft_accuracy']:.3f}" for s in short.values()
                   if s.get("sft_accuracy") is not None)
  steps = sorted({s["sft_steps"] for s in short.values() if s.get("sft_steps") is not None})
  return (f"the SFT start of {len(short)}/{len(sft)} seed(s) stopped below its warm-up target"
          f" (validation {val} < {target:g}"
          + (f" after {', '.join(map(str, steps))} steps" if steps else "")
          + (f"; test {test}" if test else "")
          + "): RL from a start that rarely answers correctly sees almost no reward, so the"
          " arms had little to learn and little to lose")


def _with_weak_start(study: dict, why: str) -> str:
  weak = weak_start(study)
  return f"{weak}; {why}" if weak else why


def _stability_reason(study: dict, stabledrl: str, grpo: str,
                      collapses: tuple[int, int, int, int]) -> str:
  """The likely reason a StableDRL-over-GRPO comparison did not reproduce, from its numbers;
  ``collapses``: (GRPO collapsed, GRPO seeds, StableDRL collapsed, StableDRL seeds)."""
  bypass = fig.interval(study, grpo, lambda r: r["stats"]["bypass_fraction_mean"])["mean"] or 0.0
  p99 = fig.interval(study, grpo, lambda r: fig.abs_log_ratio(r, "p99_first"))["mean"]
  why = _collapse_reason("GRPO", collapses,
                         ": there was no instability for StableDRL to remove at this lr",
                         ": there was little instability for StableDRL to remove at this lr")
  why += f"; GRPO's bypass (A < 0, ρ̂ > 1 + ε) hit {bypass:.2%} of sequences"
  if p99 is not None:
    why += f", p99 |log ρ̂| at θ = θ_old {p99:.3g} nats"
  sc, s_spikes, g_spikes = collapses[2], fig.spikes(study, stabledrl), fig.spikes(study, grpo)
  if sc > 0 and s_spikes < g_spikes:
    why += (f"; StableDRL's {sc} collapse(s) came with {s_spikes:.1f} grad-norm spikes per run"
            f" against GRPO's {g_spikes:.1f}: a drift, not the ratio-driven instability"
            " StableDRL removes (the lr may be too high for this start)")
  control = f"{NO_EUBO}@{stabledrl.partition('@')[2]}"
  if sc > 0 and any(a["name"] == control for a in study["arms"]):
    p = fig.paired_difference(study, control, stabledrl, fig.held_out_accuracy)
    cc, cn = fig.collapses(study, control)
    why += (f"; the {control} control (the ELBO, not SPG's EUBO surrogate, as the gradient term"
            f" of A < 0) collapsed in {cc}/{cn} seeds and ended {fig.fmt_paired(p)} above"
            " StableDRL")
    if p["half_width"] is not None and p["mean"] - p["half_width"] > 0 and cc < sc:
      why += ": SPG's EUBO surrogate, which GRPO's loss does not use, drives these collapses"
  return _with_weak_start(study, why)


def stability_verdicts(study: dict) -> list[tuple[str, str, str]]:
  """(comparison, verdict, evidence) for every GRPO / StableDRL pair of the study: the claim
  "StableDRL ends with higher held-out accuracy than GRPO" on paired seeds
  (:func:`stats.verdict`, smallest difference of interest :data:`MIN_EFFECT`), with the
  collapse counts and, when it does not reproduce, the likely reason."""
  out = []
  for a in study["arms"]:
    name = a["name"]
    if not name.startswith("stabledrl") or "antithetic" in name:
      continue
    grpo = name.replace("stabledrl", "grpo", 1)
    if not any(x["name"] == grpo for x in study["arms"]):
      continue
    p = fig.paired_difference(study, name, grpo, fig.held_out_accuracy)
    verdict = stats.verdict(p, MIN_EFFECT, "StableDRL's accuracy")
    collapses = (*fig.collapses(study, grpo), *fig.collapses(study, name))
    evidence = (f"test accuracy StableDRL − GRPO {fig.fmt_paired(p)}; collapsed: GRPO"
                f" {fig.collapsed(study, grpo)}, StableDRL {fig.collapsed(study, name)}")
    if verdict != "reproduced":
      evidence += f". Likely reason: {_stability_reason(study, name, grpo, collapses)}"
    out.append((f"{name} vs {grpo} ({tables.group(a)})", verdict, evidence))
  return out


ABLATIONS = {  # ablation arm prefix → the StableDRL component it drops
    "clip_only": "self-normalisation", "selfnorm_only": "unconditional clipping"}
ANTITHETIC = "stabledrl_antithetic"  # the control: θ and θ_old share masks (ρ̂ = 1 at θ_old)
NO_EUBO = "stabledrl_no_eubo"  # the control: the ELBO, not SPG's EUBO surrogate, for A < 0


def _ablation_reason(study: dict, ablation: str, full: str, dropped: str,
                     collapses: tuple[int, int, int, int]) -> str:
  """The likely reason StableDRL did not beat one of its single-component ablations;
  ``collapses``: (ablation collapsed, its seeds, StableDRL collapsed, StableDRL seeds)."""
  kept = collapses[1] - collapses[0]
  why = _collapse_reason(ablation, collapses, f" either: without {dropped} the other component"
                         " alone kept training stable at this lr and size",
                         f": without {dropped} the other component alone kept training stable"
                         f" in {kept} of {collapses[1]} seeds at this lr and size")
  return _with_weak_start(study, why + (
      f"; grad-norm spikes per run {ablation} {fig.spikes(study, ablation):.1f},"
      f" StableDRL {fig.spikes(study, full):.1f}"))


def ablation_verdicts(study: dict) -> list[tuple[str, str, str]]:
  """(comparison, verdict, evidence) for StableDRL's two components: the claim "StableDRL
  (unconditional clipping + self-normalisation) ends with higher held-out accuracy than each
  single-component ablation at the same lr" on paired seeds; and two controls (no claim: the
  paired difference, collapses and spikes): antithetic masks against independent ones (and,
  with GRPO on antithetic masks at the same lr, StableDRL against it on the same masks), and
  the ELBO against SPG's EUBO surrogate as the gradient term of negative advantages; with
  GRPO at the same lr, that ELBO arm against GRPO too (the same gradient term, StableDRL's
  clipped, self-normalised weights against GRPO's conditional clip)."""
  names = {a["name"] for a in study["arms"]}
  out = []
  for a in study["arms"]:
    prefix, _, tag = a["name"].partition("@")
    full = f"stabledrl@{tag}"
    if full not in names:
      continue
    if prefix in ABLATIONS:
      p = fig.paired_difference(study, full, a["name"], fig.held_out_accuracy)
      verdict = stats.verdict(p, MIN_EFFECT, "StableDRL's accuracy")
      collapses = (*fig.collapses(study, a["name"]), *fig.collapses(study, full))
      evidence = (f"test accuracy StableDRL − {a['name']} {fig.fmt_paired(p)}; collapsed:"
                  f" {a['name']} {fig.collapsed(study, a['name'])}, StableDRL"
                  f" {fig.collapsed(study, full)}")
      if verdict != "reproduced":
        evidence += (". Likely reason: "
                     + _ablation_reason(study, a["name"], full, ABLATIONS[prefix], collapses))
      out.append((f"{full} vs {a['name']} (ablation: without {ABLATIONS[prefix]})", verdict,
                  evidence))
    elif prefix == ANTITHETIC:
      p = fig.paired_difference(study, a["name"], full, fig.held_out_accuracy)
      out.append((f"{a['name']} vs {full} (control)", "no claim",
                  f"test accuracy shared − independent masks {fig.fmt_paired(p)}; collapsed:"
                  f" {fig.collapsed(study, a['name'])} with shared masks,"
                  f" {fig.collapsed(study, full)} with independent ones"))
      grpo_shared = f"grpo_antithetic@{tag}"  # the same masks under GRPO's conditional clip
      if grpo_shared in names:
        q = fig.paired_difference(study, a["name"], grpo_shared, fig.held_out_accuracy)
        out.append((f"{a['name']} vs {grpo_shared} (control: StableDRL's weights against"
                    " GRPO's clip, both on shared masks)", "no claim",
                    f"test accuracy StableDRL − GRPO, both with shared masks"
                    f" {fig.fmt_paired(q)}; collapsed: StableDRL"
                    f" {fig.collapsed(study, a['name'])},"
                    f" GRPO {fig.collapsed(study, grpo_shared)}"))
    elif prefix == NO_EUBO:
      p = fig.paired_difference(study, a["name"], full, fig.held_out_accuracy)
      out.append((f"{a['name']} vs {full} (control)", "no claim",
                  f"test accuracy ELBO − SPG surrogate (ω = 0.5) for A < 0 {fig.fmt_paired(p)};"
                  f" collapsed: {fig.collapsed(study, a['name'])} with the"
                  f" ELBO, {fig.collapsed(study, full)} with the surrogate;"
                  f" grad-norm spikes per run {fig.spikes(study, a['name']):.1f} and"
                  f" {fig.spikes(study, full):.1f}"))
      grpo = f"grpo@{tag}"
      if grpo in names:  # the same gradient term as GRPO's: what StableDRL's weights add
        p = fig.paired_difference(study, a["name"], grpo, fig.held_out_accuracy)
        out.append((f"{a['name']} vs {grpo} (control: StableDRL's weights on GRPO's gradient"
                    " term)", "no claim",
                    f"test accuracy {a['name']} − GRPO {fig.fmt_paired(p)}; collapsed:"
                    f" {fig.collapsed(study, a['name'])} and {fig.collapsed(study, grpo)};"
                    f" grad-norm spikes per run {fig.spikes(study, a['name']):.1f} and"
                    f" {fig.spikes(study, grpo):.1f}"))
  return out


def _final_val(r):
  return (r.get("stats") or {}).get("final_val_accuracy")


def _steprs_reason(study: dict, arm: str = "steprs", opposite: bool = False,
                   base: str = "centered") -> str:
  """The likely reason ``arm`` did not beat ``base`` in :func:`steprs_verdicts`, from the
  study's numbers (the first that apply, joined). ``opposite``: the verdict found the arm
  decidedly lower, which no seed-to-seed spread explains."""
  base8 = fig.interval(study, "centered", fig.pass_at(8))["mean"]
  distinct = fig.interval(study, "centered", tables.distinct)["mean"]
  reasons = []
  if base8 is not None and base8 > 0.95:
    reasons.append(f"centered GRPO's pass@8 is already {base8:.3f} (no headroom)")
  if distinct is not None and distinct <= 1.05:
    from dllm_rl.tasks import TASKS
    task = (study.get("base_config") or {}).get("task", {}).get("name", "arithmetic")
    if not (task in TASKS and TASKS.get(task).many_answers):
      reasons.append(f"{distinct:.2f} distinct correct answers per prompt: the task has one"
                     " correct answer, so exploration has nothing to find")
    elif base8 is None or distinct <= base8 + 1e-6:  # one answer per solved prompt
      reasons.append(f"centered GRPO finds {distinct:.2f} distinct correct answers per prompt"
                     f" (≤ 1): the `{task}` task has many, but the SFT start writes one form"
                     " per prompt (its training answers do) and RL at this length did not"
                     " find others, so exploration has not yet had anything to reward")
    # else: distinct > pass@8, so some prompts get several correct answers: not the reason
  kept = fig.interval(study, "centered", tables.diversity)["mean"]
  start = tables.sft_of(study, "centered", lambda s: s.get("sft_diversity"))["mean"]
  if kept is not None and start and kept >= NARROWING * start:
    p1 = fig.interval(study, "centered", fig.pass_at(1))["mean"]
    p1_start = tables.sft_of(study, "centered", tables.sft_pass(1))
    moved = (f", and its pass@1 at T = 1 is {p1:.3f} against the start's"
             f" {p1_start['mean']:.3f}" if p1 is not None and p1_start["mean"] is not None
             else "")
    reasons.append(f"centered GRPO kept {kept:.2f} distinct answers in 8 samples (the SFT start"
                   f" {start:.2f}){moved}: RL at this length did not narrow the sampling"
                   " policy, so there was no lost exploration for StepRS to recover")
  narrower = fig.paired_difference(study, arm, "centered", tables.diversity)
  if narrower["half_width"] is not None and narrower["mean"] + narrower["half_width"] < 0:
    ours, theirs = (fig.interval(study, a, tables.diversity)["mean"] for a in (arm, "centered"))
    reasons.append(f"{arm} narrowed the sampling policy more than centered GRPO ({ours:.2f}"
                   f" against {theirs:.2f} distinct answers in 8 samples; paired"
                   f" {fig.fmt(narrower, 2)}): its weights did not keep the exploration they are"
                   " meant to")
  learned = fig.paired_difference(study, arm, base, _final_val)
  if learned["half_width"] is not None and learned["mean"] + learned["half_width"] < 0:
    ours, theirs = (fig.interval(study, a, _final_val)["mean"] for a in (arm, base))
    reasons.append(f"{arm} learned less than {base}: its final greedy validation accuracy"
                   f" is {ours:.3f} against {theirs:.3f} (paired {fig.fmt(learned)}): its"
                   " weights cost accuracy, not only exploration")
  fell = {a: fig.collapses(study, a) for a in (arm, base)}
  if any(k for k, _ in fell.values()):
    reasons.append(f"runs collapsed ({arm} {fig.collapsed(study, arm)} seeds, {base}"
                   f" {fig.collapsed(study, base)}: validation accuracy fell below the SFT"
                   " start and stayed there): those seeds' differences measure the collapse,"
                   " not the weights' effect on exploration" + _stuck_note(study, (arm, base)))
  weak = weak_start(study)
  return "; ".join(([weak] if weak else []) + reasons) or (
      "none of the report's computed reasons applies: the arm is decidedly lower here"
      if opposite else "the effect is smaller than the seed-to-seed spread at this size")


STEPRS_COMPARISONS = (  # (arm, baseline, metric): the claim is arm > baseline on the metric
    ("steprs", "centered", "pass@8"), ("steprs", "centered", "distinct"),
    ("steprs_calibrated", "centered", "pass@8"),
    ("steprs", "steprs_reversed", "pass@8"), ("steprs", "risk_sensitive", "pass@8"),
    ("steprs_rms_matched", "centered", "pass@8"), ("steprs_mass_matched", "centered", "pass@8"),
)


def steprs_verdicts(study: dict) -> list[tuple[str, str, str]]:
  """(comparison, verdict, evidence): StepRS raises pass@8 and the number of distinct correct
  answers over centered GRPO; the schedule's direction and its state dependence matter
  (StepRS over the reversed schedule and over a constant β); the effect survives rescaling
  (RMS- and mass-matched)."""
  names = {a["name"] for a in study["arms"]}
  out = []
  for arm, base, metric in STEPRS_COMPARISONS:
    if arm not in names or base not in names:
      continue
    get = tables.distinct if metric == "distinct" else fig.pass_at(8)
    p = fig.paired_difference(study, arm, base, get)
    verdict = stats.verdict(p, MIN_EFFECT if metric != "distinct" else 0.1, f"{arm}'s {metric}")
    evidence = f"{metric} {arm} − {base} {fig.fmt_paired(p)}"
    if verdict != "reproduced":
      lower = p["half_width"] is not None and p["mean"] + p["half_width"] < 0  # below 0
      evidence += f". Likely reason: {_steprs_reason(study, arm, lower, base)}"
    out.append((f"{arm} vs {base}, {metric}", verdict, evidence))
  return out


def baselines_verdicts(study: dict) -> list[tuple[str, str, str]]:
  """(comparison, verdict, evidence): each algorithm ends above its seed's SFT start (held-out
  test accuracy, paired by seed)."""
  out = []
  for a in study["arms"]:
    n = a["name"]
    gain = fig.gain_over_start(study, n)
    out.append((f"{n} improves on the SFT start",
                stats.verdict(gain, MIN_EFFECT, f"{n}'s accuracy"),
                f"test accuracy {n} − SFT {fig.fmt_paired(gain)}"))
  return out


CAVEATS = {
    "stability": (
        "At this size (0.1M parameters, 8-token completions of which ~5 are scored) log ρ̂ at"
        " the first inner step is pure mask noise of a short sequence, with either estimator"
        " (the |log ρ̂| quantile columns measure it); the ratio-bypass mechanism needs A < 0"
        " and ρ̂ > 1.2, which the bypass fraction column measures. Grad norms are pre-clip:"
        " `rl.grad_clip = 1.0` bounds every update, so a spike changes the direction more"
        " than the size of a step, and Adam rescales"
        " gradients, so collapse at a high lr is not only the loss's doing. A zero grad norm"
        " (every group's rewards equal, e.g. after collapse to 0 reward) is excluded from the"
        " median."),
    "steprs": (
        "Completions are 8 tokens unmasked over 8 states with one correct answer per prompt"
        " (3-digit addition), so there is little room for diverse correct answers: pass@k gains"
        " from exploration are hard to show. 256 test prompts give about ±3 points of noise per"
        " run."),
    "baselines": (
        "Each baseline runs its official algorithm (loss, advantage, estimator, ε, KL;"
        " dllm_rl/config/recipes.py) at the embedded default's lr, μ and group size, not its"
        " official scale (configs/wd1.py, espo.py, coupled_grpo.py, trajectory.py): a gain"
        " here says the algorithm learns this task, not how it ranks at 8B. 256 test prompts"
        " give about ±3 points of noise per run."),
}


def _stability_report_verdicts(study: dict) -> list[tuple[str, str, str]]:
  """Every line of the stability report: the GRPO / StableDRL pairs, the ablations and their
  controls, then the GRPO controls (:mod:`dllm_rl.study.report_controls`)."""
  return (stability_verdicts(study) + ablation_verdicts(study) + grpo_control_verdicts(study)
          + low_lr_control_verdicts(study))


# study → (table, verdicts)
REPORTS = {"stability": (tables.stability_table, _stability_report_verdicts),
           "steprs": (tables.steprs_table, steprs_verdicts),
           "baselines": (tables.baselines_table, baselines_verdicts)}


def _mean_step_ms(study: dict) -> float:
  steps = [r["summary"]["rl_step_seconds"] for r in study["runs"]
           if r["summary"].get("rl_step_seconds")]
  return 1e3 * sum(steps) / max(len(steps), 1)


def compute_seconds(studies: list[dict]) -> float:
  """Wall seconds the runs took when they ran: each seed's SFT once + every arm."""
  sft = {k: v.get("wall_seconds", 0.0) for st in studies for k, v in st["sft"].items()}
  return sum(sft.values()) + sum(r["wall_seconds"] for st in studies for r in st["runs"])


def run_provenance(studies: list[dict]) -> str:
  """The code commits and machines the runs trained on, with their counts, most runs first
  ("56eb2dd, Linux x86_64, 2 CPU cores (...): 40 runs; not recorded: 90 runs"); runs from
  before run records kept them count as "not recorded"."""
  counts = collections.Counter(
      f"{r['commit']}, {r.get('machine', 'n/a')}" if r.get("commit") else "not recorded"
      for st in studies for r in st["runs"])
  return "; ".join(f"{k}: {n} run{'s' * (n != 1)}"
                   for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def testbed_name(meta: dict, studies: list[dict]) -> str:
  """The study's testbed (the JSON of a study from before testbeds: the embedded default)."""
  from dllm_rl.config import testbeds
  return meta.get("testbed") or studies[0].get("testbed") or testbeds.DEFAULT


def testbed_description(meta: dict, studies: list[dict]) -> str:
  from dllm_rl.config import testbeds
  name = testbed_name(meta, studies)
  return testbeds.testbed(name).description if name in testbeds.TESTBEDS else "unregistered"


def run_config(study: dict, run: dict):
  """A run's config: the study's recorded base config (else the embedded default) with the
  run's overrides."""
  import ml_collections

  from dllm_rl.study.runner import make_config
  base = study.get("base_config")
  return make_config(run["overrides"], ml_collections.ConfigDict(base) if base else None)


def render(studies: list[dict], meta: dict, image_dir_rel: str) -> str:
  quick = meta.get("quick")
  out = ["# Results: the papers' claims at small scale", "",
         f"Generated by `{meta['command']}` (do not edit by hand; rerun the command).", ""]
  if quick:  # 1 seed unless --seeds says otherwise (the studies of one command share it)
    n = studies[0]["seeds"]
    out += [f"**This is the `--quick` run ({n} seed{'s' * (n != 1)}, fewer steps): it checks"
            " that the study runs end to end; it does not establish any claim. The full study"
            " (≥ 3 seeds) is the command without `--quick`.**", ""]
  out += ["| | |", "| --- | --- |",
          f"| testbed | `{testbed_name(meta, studies)}`:"
          f" {cell(testbed_description(meta, studies))} |",
          f"| machine | {meta['machine']} |",
          f"| load average (1 min) at start / end | {meta['load_start']} / {meta['load_end']} |",
          f"| jax | {meta['jax']} |",
          f"| code (git commit) | {meta.get('commit', 'n/a')} |",
          *([f"| first written by (git commit) | {meta.get('first_commit', 'n/a')} |",
             "| re-rendered | from the stored study JSON by `python -m dllm_rl.study.rerender`"
             " on the code above: tables, verdicts and plots; the runs, and the invocation's"
             " machine, load, start and wall time below, are the original's |"]
            if meta.get("rerendered") else []),
          f"| code and machine of the runs (git commit, machine: runs) |"
          f" {run_provenance(studies)} |",
          *[f"| runs reused (--reuse_from) | {cell(c['line'])} |"
            for c in (meta.get("reused") or {}).values()],
          f"| started (UTC) | {meta['started']} |",
          f"| wall time of this invocation | {meta['wall_seconds']:.0f} s |",
          f"| compute recorded in the JSON (SFT + every arm, summed over the invocations that"
          f" produced them) | {compute_seconds(studies):.0f} s |", ""]
  c = run_config(studies[0], studies[0]["runs"][0])  # the sizes every run shares
  shared = any(st.get("shared_sft") for st in studies)
  sft_seed = next((st["sft_seed"] for st in studies if st.get("sft_seed") is not None), 0)
  start = (f" one for all seeds (seed {sft_seed}'s warm-up: this testbed's is too long to"
           " repeat per seed, so the seeds vary the RL randomness only, not the SFT start)"
           if shared else " one per seed")
  out += ["Every arm starts from the same SFT checkpoint of the testbed"
          f" `{testbed_name(meta, studies)}`"
          f" ({testbed_description(meta, studies)}),{start}, and changes only the listed"
          " keys. Unless an arm's overrides say otherwise: official noise (independent masks"
          f" for ℓ̂_old and every inner step), {c.estimator.num_samples}-draw"
          f" {c.estimator.name.upper()}, μ = {c.rl.inner_steps}, {c.rl.batch_prompts} prompts ×"
          f" {c.rl.group_size} completions, centered advantages. Intervals: mean ± 95%"
          " Student-t half-width across seeds (none with one seed). Validation accuracy:"
          f" greedy, on {c.task.val_size} training-distribution"
          " prompts never trained on; test accuracy: greedy on the"
          f" {c.task.test_size} test prompts after the last step; pass@k from"
          f" {c.eval.num_samples} samples per test prompt at T = {c.eval.temperature:g}."
          " Collapse: validation accuracy below the SFT start by more than 2 binomial standard"
          f" errors (2·sqrt(p(1 − p)/n), {stats.binomial_margin(0.3, c.task.val_size):.3f} at"
          f" p = 0.3, n = {c.task.val_size}) from some evaluation on, for at least two"
          " evaluations. Spike: a step whose max grad norm (pre-clip, over the μ inner steps)"
          f" exceeds {stats.SPIKE_FACTOR:g}× the run's median.", ""]
  for study in studies:
    name = study["study"]
    out += [f"## `{name}`", "", f"{seeds_label(study)}, {study['size']['rl_steps']} RL steps"
            f" per arm, validation every {study['size']['eval_every']} steps; compute recorded"
            f" for its arms {sum(r['wall_seconds'] for r in study['runs']):.0f} s (mean RL step"
            f" {_mean_step_ms(study):.0f} ms).", ""]
    if note := fig.unjudged_note(study):
      out += [note, ""]
    if study.get("overrides"):
      out += [f"Extra overrides: `{study['overrides']}`.", ""]
    out += ["| arm | what | overrides |", "| --- | --- | --- |"]
    out += [f"| {a['name']} | {cell(a['description'])} | `{a['overrides']}` |"
            for a in study["arms"]]
    out += [""]
    table, verdicts_of = REPORTS[name]
    out += [table(study), ""]
    if name in tables.TABLE_NOTES:
      out += [tables.TABLE_NOTES[name], ""]
    out += [f"![{name} curves]({image_dir_rel}/{name}_curves.png)", ""]
    if name == "stability":
      out += [f"![{name} grad-norm spikes]({image_dir_rel}/{name}_spikes.png)", ""]
    lines = verdicts_of(study)
    out += ["Verdicts (computed from the table's numbers by `dllm_rl/study/report.py`; the claim"
            f" is that the first arm is higher; differences inside ±{MIN_EFFECT:g} count as"
            " none):", ""]
    out += [f"* **{what}: {verdict}.** {evidence}." for what, verdict, evidence in lines]
    if note := multiplicity_note([(what, verdict) for what, verdict, _ in lines]):
      out += ["", note]
    out += ["", f"Caveats: {caveat(name, testbed_name(meta, studies), c)}", ""]
  return "\n".join(out)


def caveat(name: str, testbed: str, c) -> str:
  """The study's caveat: :data:`CAVEATS` (written for the embedded default) on ``arithmetic``;
  on another testbed, its sizes from the run config ``c``."""
  if testbed == "arithmetic":
    return CAVEATS[name]
  return (f"Testbed `{testbed}`: completions of {c.data.completion_len} tokens in"
          f" {c.data.completion_len // c.sampler.block_len} blocks of {c.sampler.block_len}"
          f" ({c.sampler.steps} denoising states); the scored action runs through the first EOS."
          f" {c.task.test_size} test prompts give about"
          f" ±{100 * stats.binomial_margin(0.3, c.task.test_size) / 2:.0f} points of noise per"
          " run (one binomial standard error at p = 0.3). Grad norms are pre-clip"
          f" (`rl.grad_clip = {c.rl.grad_clip:g}`).")
