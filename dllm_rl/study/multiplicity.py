"""A report section's multiplicity: how many of its judged verdicts would read "reproduced" by
chance, and which of its "reproduced" lines Holm's step-down rule keeps family-wise."""

from __future__ import annotations

from dllm_rl.study import stats

_JUDGED = ("reproduced", "not reproduced", "inconclusive")  # stats.verdict's claim verdicts


def holm_kept(lines: list[tuple[str, str]]) -> set[str] | None:
  """The comparisons of a section's (comparison, verdict) lines that Holm's step-down rule
  (:func:`stats.holm`) keeps at a family-wise one-sided 2.5% over its judged comparisons
  ("no claim" and one-seed lines not counted), from each verdict's ``p_one_sided``
  (:class:`stats.Verdict`); None where a judged verdict carries none (a plain string)."""
  judged = [(what, v) for what, v in lines if v.startswith(_JUDGED)]
  ps = [getattr(v, "p_one_sided", None) for _, v in judged]
  if any(p is None for p in ps):
    return None
  return {what for (what, _), r in zip(judged, stats.holm(ps, 0.025)) if r}


def multiplicity_note(lines: list[tuple[str, str]]) -> str:
  """The section's multiplicity, from its (comparison, verdict) lines: of ``n`` judged
  comparisons (95% intervals; "no claim" and one-seed lines not counted), each reads
  "reproduced" (interval above 0) with probability 2.5% when the arms do not differ, so about
  0.025·n do by chance. Where some read "reproduced", which of them :func:`holm_kept` keeps:
  a reading alongside the verdicts, which it does not change. "" for fewer than two judged
  comparisons."""
  judged = [(what, v) for what, v in lines if v.startswith(_JUDGED)]
  if len(judged) < 2:
    return ""
  hits = [what for what, v in judged if v == "reproduced"]
  note = (f"Multiplicity: {len(judged)} comparisons are judged above, each on a 95% interval. "
          "Where the arms do not differ, each reads \"reproduced\" (its interval above 0) with"
          f" probability 2.5%, so about {0.025 * len(judged):.2f} of them would by chance"
          f" ({len(hits)} did): a lone \"reproduced\" among them is weaker evidence than the same"
          " line on its own.")
  kept = holm_kept(lines)
  if not hits or kept is None:
    return note
  held, lost = [w for w in hits if w in kept], [w for w in hits if w not in kept]
  if len(hits) == 1:
    what = ("keeps the one \"reproduced\" line" if held
            else f"does not keep the one \"reproduced\" line, {lost[0]}")
  else:
    what = (f"keeps {len(held)} of the {len(hits)} \"reproduced\" lines"
            + (f"; it does not keep {'; '.join(lost)}" if lost else ""))
  return (f"{note} Holm's step-down rule over the {len(judged)} (family-wise error 2.5%,"
          f" one-sided p-values of the paired t-tests) {what}.")
