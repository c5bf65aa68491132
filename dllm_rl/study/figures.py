"""Per-arm figures of a study record (the JSON a study writes): an arm's runs in seed order,
t-intervals over its seeds, paired differences between two arms of the same seeds, its
collapses and spikes, and how the report writes them. Shared by the report's tables
(:mod:`dllm_rl.study.report_tables`), its verdicts (:mod:`dllm_rl.study.report`) and its
control lines (:mod:`dllm_rl.study.report_controls`)."""

from __future__ import annotations

from dllm_rl.study import stats


def runs(study: dict, arm: str) -> list[dict]:
  return sorted((r for r in study["runs"] if r["arm"] == arm), key=lambda r: r["seed"])


def interval(study, arm, get):
  return stats.t_interval([get(r) for r in runs(study, arm)])


def held_out_accuracy(r):
  """A run's held-out greedy test accuracy after its last RL step."""
  return r["summary"].get("rl_accuracy")


def pass_at(k):
  return lambda r: (r["summary"].get("rl_pass_at_k") or {}).get(str(k))


def abs_log_ratio(r, key: str):
  return (r["stats"].get("abs_log_ratio") or {}).get(key)


def by_seed(study: dict, arm: str, get) -> dict:
  return {r["seed"]: get(r) for r in runs(study, arm)}


def paired_difference(study: dict, arm_a: str, arm_b: str, get) -> dict:
  """:func:`stats.paired` of get(a) − get(b) over the seeds (arms of a seed share the SFT
  checkpoint and rollout keys, so the seeds pair them)."""
  return stats.paired(by_seed(study, arm_a, get), by_seed(study, arm_b, get))


def of_sft(study: dict, get):
  """get_run(run) → get(the summary of the run's seed's SFT start)."""
  sft = study.get("sft") or {}
  return lambda r: get(sft.get(str(r["seed"])) or {})


def sft_start(study: dict):
  """get(run) → the held-out test accuracy of the run's seed's SFT start."""
  return of_sft(study, lambda s: s.get("sft_accuracy"))


def gain_over_start(study: dict, arm: str) -> dict:
  """:func:`stats.paired` of the arm's held-out test accuracy − its seed's SFT start's."""
  return stats.paired(by_seed(study, arm, held_out_accuracy), by_seed(study, arm, sft_start(study)))


NOT_JUDGED = "not judged (no validation after step 0)"


def judged(r: dict) -> bool:
  """Whether collapse can be judged for run ``r``: it validated after step 0. A run shorter
  than its validation interval (``--rl_steps`` below ``--eval_every``) did not: its stats
  record ``final_val_accuracy`` None, and their ``collapsed`` False says nothing. (Stats
  without the field at all, as a constructed record may be, are taken at their word.)"""
  s = r.get("stats") or {}
  return "final_val_accuracy" not in s or s["final_val_accuracy"] is not None


def collapses(study: dict, arm: str) -> tuple[int, int]:
  """(seeds in which ``arm`` collapsed, seeds in which collapse could be judged: :func:`judged`)."""
  of_arm = [r for r in runs(study, arm) if judged(r)]
  return sum(bool((r.get("stats") or {}).get("collapsed")) for r in of_arm), len(of_arm)


def collapsed(study: dict, arm: str) -> str:
  """"k/n": the seeds in which ``arm`` collapsed, of its seeds; :data:`NOT_JUDGED` when none
  of its runs validated after step 0, and "k/m (n − m not judged: ...)" when some did not."""
  k, m = collapses(study, arm)
  n = len(runs(study, arm))
  if m == 0 and n > 0:
    return NOT_JUDGED
  if m < n:
    return f"{k}/{m} ({n - m} not judged: no validation after step 0)"
  return f"{k}/{m}"


def unjudged_note(study: dict) -> str | None:
  """A bold warning when some runs validated only at step 0 (``--rl_steps`` below
  ``--eval_every``): their collapse is not judged and their final validation accuracy is n/a,
  so the collapse counts and the reasons built on them rest on the other runs only; None when
  every run was judged."""
  unjudged = [r for r in study["runs"] if not judged(r)]
  if not unjudged:
    return None
  size, n = study["size"], len(study["runs"])
  rest = ("the collapse columns and verdicts below say \"not judged\"" if len(unjudged) == n
          else "the collapse counts below are of the other runs")
  why = (f" (--rl_steps={size['rl_steps']} is below --eval_every={size['eval_every']})"
         if size["rl_steps"] < size["eval_every"] else "")
  return (f"**{len(unjudged)} of {n} runs validated only at step 0{why}: their collapse is not"
          f" judged and their final validation accuracy is n/a; {rest}.**")


def spikes(study: dict, arm: str) -> float:
  """Mean grad-norm spikes per run of ``arm`` over its seeds (0 when it has none)."""
  return interval(study, arm, lambda r: r["stats"]["grad_spikes"])["mean"] or 0.0


def fmt(iv: dict, digits: int = 3, kind: str = "f") -> str:
  """"mean ± half-width" (the mean alone with one seed; "n/a" without a value) in the format
  ``.{digits}{kind}``."""
  if iv["mean"] is None:
    return "n/a"
  if iv["half_width"] is None:
    return f"{iv['mean']:.{digits}{kind}}"
  return f"{iv['mean']:.{digits}{kind}} ± {iv['half_width']:.{digits}{kind}}"


def fmt_g(iv: dict) -> str:
  """Like fmt, in 3 significant digits (ratios span many orders of magnitude)."""
  return fmt(iv, 3, "g")


def fmt_paired(p: dict, digits: int = 3) -> str:
  if p["mean"] is None:
    return "n/a"
  return (f"{fmt(p, digits)} (per seed {', '.join(f'{d:+.{digits}f}' for d in p['diffs'])};"
          f" {p['wins']} up, {p['losses']} down, {p['ties']} tied)")
