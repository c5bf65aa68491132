"""docs/results.md from the study JSON: tables (mean ± 95% t-interval across seeds),
plots, the exact command, the machine, the wall time, and one verdict per claim."""

from __future__ import annotations

import os
import shutil

from dllm_rl.study import stats


def _fmt(iv: dict, digits: int = 3) -> str:
  if iv["mean"] is None:
    return "n/a"
  if iv["half_width"] is None:
    return f"{iv['mean']:.{digits}f}"
  return f"{iv['mean']:.{digits}f} ± {iv['half_width']:.{digits}f}"


def _fmt_g(iv: dict) -> str:
  """Like _fmt, in 3 significant digits (ratios span many orders of magnitude)."""
  if iv["mean"] is None:
    return "n/a"
  if iv["half_width"] is None:
    return f"{iv['mean']:.3g}"
  return f"{iv['mean']:.3g} ± {iv['half_width']:.3g}"


def _runs(study: dict, arm: str) -> list[dict]:
  return sorted((r for r in study["runs"] if r["arm"] == arm), key=lambda r: r["seed"])


def _iv(study, arm, get):
  return stats.t_interval([get(r) for r in _runs(study, arm)])


def _test(r):
  return r["summary"].get("rl_accuracy")


def _pass(k):
  return lambda r: (r["summary"].get("rl_pass_at_k") or {}).get(str(k))


def paired_difference(study: dict, arm_a: str, arm_b: str, get) -> dict:
  """t-interval of the per-seed difference get(a) − get(b) (arms of a seed share the SFT
  checkpoint and rollout keys, so the seeds pair them)."""
  a = {r["seed"]: get(r) for r in _runs(study, arm_a)}
  b = {r["seed"]: get(r) for r in _runs(study, arm_b)}
  return stats.t_interval([a[s] - b[s] for s in sorted(a) if s in b
                           and a[s] is not None and b[s] is not None])


def stability_table(study: dict) -> str:
  rows = ["| arm | held-out test acc. (end) | val acc. start → final | best val acc. | collapsed"
          " (seeds) | grad-norm spikes (> 5× median) | max/median grad norm | max ρ̂ |"
          " bypass fraction (A < 0, ρ̂ > 1 + ε) |", "|" + " --- |" * 9]
  for a in study["arms"]:
    n = a["name"]
    runs = _runs(study, n)
    st = lambda key: _iv(study, n, lambda r: r["stats"][key])
    collapsed = sum(r["stats"]["collapsed"] for r in runs)
    rows.append(
        f"| {n} | {_fmt(_iv(study, n, _test))} | {_fmt(st('start_val_accuracy'))} → "
        f"{_fmt(st('final_val_accuracy'))} | {_fmt(st('best_val_accuracy'))} | "
        f"{collapsed}/{len(runs)} | {_fmt(st('grad_spikes'), 1)} | {_fmt(st('spike_ratio'), 1)} |"
        f" {_fmt_g(st('ratio_max'))} | {_fmt(st('bypass_fraction_mean'), 4)} |")
  return "\n".join(rows)


def steprs_table(study: dict) -> str:
  rows = ["| arm | greedy test acc. | pass@1 (T = 1) | pass@4 | pass@8 | val acc. start → final |"
          " calibrated β_end |", "|" + " --- |" * 7]
  for a in study["arms"]:
    n = a["name"]
    st = lambda key: _iv(study, n, lambda r: r["stats"][key])
    beta = _iv(study, n, lambda r: r["overrides"].get("rl.beta_end")) if a["calibrate_from"] \
        else {"mean": None, "half_width": None}
    rows.append(f"| {n} | {_fmt(_iv(study, n, _test))} | {_fmt(_iv(study, n, _pass(1)))} | "
                f"{_fmt(_iv(study, n, _pass(4)))} | {_fmt(_iv(study, n, _pass(8)))} | "
                f"{_fmt(st('start_val_accuracy'))} → {_fmt(st('final_val_accuracy'))} | "
                f"{_fmt(beta, 2) if beta['mean'] is not None else '—'} |")
  return "\n".join(rows)


def stability_verdict(study: dict) -> tuple[str, str]:
  """(verdict, evidence): GRPO collapses where StableDRL does not.

  Reproduced: at some lr GRPO collapsed in more than half of the seeds and StableDRL in
  fewer than half. Not reproduced: at every lr GRPO collapsed no more often than StableDRL
  (not testable when both collapsed in every seed at every lr). Otherwise inconclusive.
  Fewer than 3 seeds: not established (with what the seeds indicate).
  """
  seeds = study["seeds"]
  lines, grpo_worse, separated, all_both = [], False, False, True
  for tag in sorted({a["name"].split("@")[1] for a in study["arms"]}):
    g, s = _runs(study, f"grpo@{tag}"), _runs(study, f"stabledrl@{tag}")
    gc, sc = sum(r["stats"]["collapsed"] for r in g), sum(r["stats"]["collapsed"] for r in s)
    spikes = paired_difference(study, f"grpo@{tag}", f"stabledrl@{tag}",
                               lambda r: r["stats"]["grad_spikes"])
    acc = paired_difference(study, f"grpo@{tag}", f"stabledrl@{tag}", _test)
    lines.append(f"at {tag}: GRPO collapsed in {gc}/{len(g)} seeds, StableDRL in {sc}/{len(s)};"
                 f" spikes GRPO − StableDRL {_fmt(spikes, 1)}; test accuracy GRPO − StableDRL"
                 f" {_fmt(acc)}")
    grpo_worse |= gc > sc
    separated |= 2 * gc > len(g) and 2 * sc < len(s)
    all_both &= gc == len(g) and sc == len(s)
  evidence = "; ".join(lines)
  if seeds < 3:
    return (f"not established ({seeds} seed(s); the claim needs ≥ 3)"
            f"{' — indicative: GRPO collapsed where StableDRL did not' if grpo_worse else ''}",
            evidence)
  if separated:
    return "reproduced (collapse)", evidence
  if all_both:
    return "not testable at this size (both collapse in every seed at every lr tried)", evidence
  if not grpo_worse:
    return "not reproduced at this size", evidence
  return "inconclusive (GRPO collapsed more often, but not in most seeds)", evidence


def steprs_verdict(study: dict) -> tuple[str, str]:
  """(verdict, evidence): StepRS raises pass@k over centered GRPO."""
  seeds = study["seeds"]
  diffs = {k: paired_difference(study, "steprs", "centered", _pass(k)) for k in (1, 4, 8)}
  evidence = "; ".join(f"pass@{k} StepRS − centered {_fmt(d)}" for k, d in diffs.items())
  d8 = diffs[8]
  if seeds < 3 or d8["half_width"] is None:
    return f"not established ({seeds} seed(s); the claim needs ≥ 3)", evidence
  if d8["mean"] - d8["half_width"] > 0:
    return "reproduced (pass@8)", evidence
  if d8["mean"] + d8["half_width"] < 0:
    return "not reproduced (pass@8 lower)", evidence
  return "not shown at this size (the 95% interval of the pass@8 difference includes 0)", evidence


CAVEATS = {
    "stability": (
        "At this size (0.1M parameters, 8-token completions of which ~5 are scored, a 1-draw"
        " ELBO) log ρ̂ at the first inner step is pure mask noise of a short sequence; the"
        " ratio-bypass mechanism needs A < 0 and ρ̂ > 1.2, which the bypass fraction column"
        " measures. Grad norms are pre-clip: `rl.grad_clip = 1.0` bounds every update, so a"
        " spike changes the direction more than the size of a step, and Adam rescales"
        " gradients, so collapse at a high lr is not only the loss's doing. A zero grad norm"
        " (every group's rewards equal, e.g. after collapse to 0 reward) is excluded from the"
        " median."),
    "steprs": (
        "Completions are 8 tokens unmasked over 8 states with one correct answer per prompt"
        " (3-digit addition), so there is little room for diverse correct answers: pass@k gains"
        " from exploration are hard to show. 256 test prompts give about ±3 points of noise per"
        " run."),
}


def _mean_step_ms(study: dict) -> float:
  steps = [r["summary"]["rl_step_seconds"] for r in study["runs"]
           if r["summary"].get("rl_step_seconds")]
  return 1e3 * sum(steps) / max(len(steps), 1)


def compute_seconds(studies: list[dict]) -> float:
  """Wall seconds the runs took when they ran: each seed's SFT once + every arm."""
  sft = {k: v.get("wall_seconds", 0.0) for st in studies for k, v in st["sft"].items()}
  return sum(sft.values()) + sum(r["wall_seconds"] for st in studies for r in st["runs"])


def render(studies: list[dict], meta: dict, image_dir_rel: str) -> str:
  quick = meta.get("quick")
  out = ["# Results: the papers' claims at small scale", "",
         f"Generated by `{meta['command']}` (do not edit by hand; rerun the command).", ""]
  if quick:
    out += ["**This is the `--quick` run (1 seed, fewer steps): it checks that the study runs"
            " end to end; it does not establish any claim. The full study (≥ 3 seeds) is the"
            " command without `--quick`.**", ""]
  out += ["| | |", "| --- | --- |",
          f"| machine | {meta['machine']} |",
          f"| load average (1 min) at start / end | {meta['load_start']} / {meta['load_end']} |",
          f"| jax | {meta['jax']} |",
          f"| started (UTC) | {meta['started']} |",
          f"| wall time of this invocation | {meta['wall_seconds']:.0f} s |",
          f"| compute recorded in the JSON (SFT + every arm, summed over the invocations that"
          f" produced them) | {compute_seconds(studies):.0f} s |", ""]
  from dllm_rl.study.runner import make_config
  c = make_config(studies[0]["runs"][0]["overrides"])  # the sizes every run shares
  out += ["Every arm starts from the same SFT checkpoint of the embedded default's task (3-digit"
          " addition, `dllm_rl/config/defaults.py`), one per seed, and changes only the listed"
          " keys. Official noise (independent masks for ℓ̂_old and every inner step),"
          f" {c.estimator.num_samples}-draw {c.estimator.name.upper()}, μ = {c.rl.inner_steps},"
          f" {c.rl.batch_prompts} prompts × {c.rl.group_size} completions, centered advantages"
          " unless stated. Intervals: mean ± 95% Student-t half-width across seeds (none with"
          f" one seed). Validation accuracy: greedy, on {c.task.val_size} training-distribution"
          " prompts never trained on; test accuracy: greedy on the"
          f" {c.task.test_size} test prompts after the last step; pass@k from"
          f" {c.eval.num_samples} samples per test prompt at T = {c.eval.temperature:g}."
          " Collapse: validation accuracy below the SFT start by more than 2 binomial standard"
          f" errors (2·sqrt(p(1 − p)/n), {stats.binomial_margin(0.3, c.task.val_size):.3f} at"
          f" p = 0.3, n = {c.task.val_size}) from some evaluation on, for at least two"
          " evaluations. Spike: a step whose max grad norm (pre-clip, over the μ inner steps)"
          f" exceeds {stats.SPIKE_FACTOR:g}× the run's median.", ""]
  verdicts = []
  for study in studies:
    name = study["study"]
    out += [f"## `{name}`", "", f"{study['seeds']} seed(s), {study['size']['rl_steps']} RL steps"
            f" per arm, validation every {study['size']['eval_every']} steps; compute recorded"
            f" for its arms {sum(r['wall_seconds'] for r in study['runs']):.0f} s (mean RL step"
            f" {_mean_step_ms(study):.0f} ms).", ""]
    if study.get("overrides"):
      out += [f"Extra overrides: `{study['overrides']}`.", ""]
    out += ["| arm | what | overrides |", "| --- | --- | --- |"]
    out += [f"| {a['name']} | {a['description']} | `{a['overrides']}` |" for a in study["arms"]]
    out += [""]
    out += [stability_table(study) if name == "stability" else steprs_table(study), ""]
    out += [f"![{name} curves]({image_dir_rel}/{name}_curves.png)", ""]
    if name == "stability":
      out += [f"![{name} grad-norm spikes]({image_dir_rel}/{name}_spikes.png)", ""]
    verdict, evidence = (stability_verdict if name == "stability" else steprs_verdict)(study)
    verdicts.append((name, verdict, evidence))
    out += [f"**Verdict: {verdict}.** {evidence}.", "", f"Caveats: {CAVEATS[name]}", ""]
  return "\n".join(out)


def write(studies: list[dict], meta: dict, workdir: str, results_md: str) -> str:
  """Write ``results_md`` and copy the plots and study JSON beside it
  (``<results dir>/results/``)."""
  base = os.path.dirname(os.path.abspath(results_md))
  image_dir = os.path.join(base, "results")
  os.makedirs(image_dir, exist_ok=True)
  for study in studies:
    for suffix in ("_curves.png", "_spikes.png", ".json"):
      src = os.path.join(workdir, study["study"] + suffix)
      if os.path.exists(src):
        shutil.copyfile(src, os.path.join(image_dir, os.path.basename(src)))
  with open(results_md, "w") as fh:
    fh.write(render(studies, meta, "results"))
  return results_md
