"""The tables of a study report (:func:`dllm_rl.study.report.render`): one row per arm, mean ±
95% t-interval over its seeds (:mod:`dllm_rl.study.figures`), and the note under a table that
says what its columns measure. The per-run numbers the columns read (distinct answers, the SFT
start's pass@k) are the verdicts' too (:mod:`dllm_rl.study.report`)."""

from __future__ import annotations

from dllm_rl.study import figures as fig
from dllm_rl.study import stats


def group(a: dict) -> str:
  """The arm's group as the tables and verdicts name it (``stress``: its label)."""
  from dllm_rl.study.arms import STRESS_LABEL
  return {"stress": STRESS_LABEL}.get(a.get("group", "main"), a.get("group", "main"))


def distinct(r):
  """A run's distinct correct answers per test prompt (its pass@k samples)."""
  return r["summary"].get("rl_distinct_correct")


def diversity(r):
  """A run's distinct answers, correct or not, in its samples per test prompt."""
  return r["summary"].get("rl_diversity")


def sft_pass(k):
  """get(SFT start's summary) → its pass@k at T = 1."""
  return lambda s: (s.get("sft_pass_at_k") or {}).get(str(k))


def sft_of(study: dict, arm: str, get) -> dict:
  """Mean ± t-interval over the arm's seeds of get(their SFT start's summary) (one value
  when the testbed shares one start)."""
  runs = fig.runs(study, arm)[:1] if study.get("shared_sft") else fig.runs(study, arm)
  return stats.t_interval(list(map(fig.of_sft(study, get), runs)))


def stability_table(study: dict) -> str:
  """One row per arm: held-out test accuracy, validation accuracy, collapses, grad-norm spikes,
  the |log ρ̂| quantiles (:data:`RATIO_NOTE`) and the bypass fraction."""
  rows = ["| arm | group | held-out test acc. (end) | val acc. start → final | collapsed (seeds)"
          " | grad-norm spikes (> 5× median) | \\|log ρ̂\\| first inner step p50 / p90 / p99 / max"
          " | \\|log ρ̂\\| all inner steps p50 / p90 / p99 / max | bypass fraction (A < 0,"
          " ρ̂ > 1 + ε) |", "|" + " --- |" * 9]
  for a in study["arms"]:
    n = a["name"]
    st = lambda key: fig.interval(study, n, lambda r: r["stats"][key])
    quantile = lambda name: fig.fmt_g(fig.interval(study, n,
                                                   lambda r: fig.abs_log_ratio(r, name)))
    q = lambda when: " / ".join(quantile(f"{k}_{when}") for k in ("p50", "p90", "p99", "max"))
    rows.append(
        f"| {n} | {group(a)} | {fig.fmt(fig.interval(study, n, fig.held_out_accuracy))} |"
        f" {fig.fmt(st('start_val_accuracy'))}"
        f" → {fig.fmt(st('final_val_accuracy'))} | {fig.collapsed(study, n)} |"
        f" {fig.fmt(st('grad_spikes'), 1)} | {q('first')} | {q('all')} |"
        f" {fig.fmt(st('bypass_fraction_mean'), 4)} |")
  return "\n".join(rows)


RATIO_NOTE = ("|log ρ̂| columns: quantiles of |log ρ̂| over the batch's sequences at each RL"
              " step (at the first inner step θ = θ_old, so they are pure estimator noise), the"
              " median over steps of each per-step quantile, and the largest value of the run;"
              " mean ± t-interval over seeds.")


def _late(key: str):
  """get(run) → the mean of the per-step metric ``key`` over the second half of the run's RL
  steps (None where the records lack it: runs older than the metric)."""
  def get(r):
    steps = r.get("steps") or []
    last = max((x["step"] for x in steps), default=0)
    vals = [x[key] for x in steps if x["step"] > last / 2 and x.get(key) is not None]
    return sum(vals) / len(vals) if vals else None
  return get


def steprs_table(study: dict) -> str:
  """One row per arm, after a row for the SFT start (what exploration is measured
  against): greedy accuracy, pass@k at T = 1, distinct correct answers per prompt and
  distinct answers (correct or not) in the 8 samples, validation accuracy, the seeds whose
  run collapsed, and over the second half of RL the step's mean |A| and the policy's
  entropy (:data:`STEPRS_NOTE`)."""
  rows = ["| arm | group | greedy test acc. | pass@1 (T = 1) | pass@4 | pass@8 |"
          " distinct correct answers / prompt | distinct answers in 8 samples |"
          " val acc. start → final | collapsed (seeds) | mean \\|A\\|, 2nd half |"
          " entropy, 2nd half | β_end |",
          "|" + " --- |" * 13]
  first = study["arms"][0]["name"] if study["arms"] else None
  start = sft_of(study, first, lambda s: s.get("sft_accuracy")) if first else {"mean": None}
  if start["mean"] is not None:
    sft = lambda get, digits=3: fig.fmt(sft_of(study, first, get), digits)
    rows.append(f"| SFT start | — | {fig.fmt(start)} | {sft(sft_pass(1))} |"
                f" {sft(sft_pass(4))} |"
                f" {sft(sft_pass(8))} | — | {sft(lambda s: s.get('sft_diversity'), 2)} |"
                f" {sft(lambda s: s.get('sft_val_accuracy'))} | — | — | — | — |")
  for a in study["arms"]:
    n = a["name"]
    st = lambda key: fig.interval(study, n, lambda r: r["stats"][key])
    beta = fig.interval(study, n, lambda r: r["overrides"].get("rl.beta_end")) \
        if "steprs" in n else {"mean": None, "half_width": None}
    mean = lambda get, digits=3: fig.fmt(fig.interval(study, n, get), digits)
    rows.append(f"| {n} | {group(a)} | {mean(fig.held_out_accuracy)} |"
                f" {mean(fig.pass_at(1))} | {mean(fig.pass_at(4))} |"
                f" {mean(fig.pass_at(8))} | {mean(distinct, 2)} |"
                f" {mean(diversity, 2)} |"
                f" {fig.fmt(st('start_val_accuracy'))} → {fig.fmt(st('final_val_accuracy'))} |"
                f" {fig.collapsed(study, n)} | {mean(_late('adv_abs_mean'))} |"
                f" {mean(_late('entropy'))} |"
                f" {fig.fmt(beta, 2) if beta['mean'] is not None else '—'} |")
  return "\n".join(rows)


STEPRS_NOTE = ("mean |A| and entropy: each RL step's mean |advantage| over the batch's"
               " B·G·L completion positions, those after a completion's first EOS counting as 0"
               " (the advantage mass per position: the step's size at a given lr, and lower for"
               " an arm whose completions are shorter) and the policy's mean predictive entropy"
               " (nats)"
               " at the scored positions, averaged over the second half of the RL steps; mean ±"
               " t-interval over seeds.")


def baselines_table(study: dict) -> str:
  """One row per arm: held-out test accuracy, its paired gain over the seed's SFT start, pass@1
  and pass@8 at T = 1, and validation accuracy."""
  rows = ["| arm | held-out test acc. (end) | gain over the SFT start (per seed) | pass@1 (T = 1)"
          " | pass@8 | val acc. start → final |", "|" + " --- |" * 6]
  for a in study["arms"]:
    n = a["name"]
    mean = lambda get: fig.fmt(fig.interval(study, n, get))
    st = lambda key: mean(lambda r: r["stats"][key])
    rows.append(f"| {n} | {mean(fig.held_out_accuracy)} |"
                f" {fig.fmt_paired(fig.gain_over_start(study, n))} |"
                f" {mean(fig.pass_at(1))} | {mean(fig.pass_at(8))} |"
                f" {st('start_val_accuracy')} → {st('final_val_accuracy')} |")
  return "\n".join(rows)


# study → the note printed under its table
TABLE_NOTES = {"stability": RATIO_NOTE, "steprs": STEPRS_NOTE}
