"""``python -m dllm_rl.study.claims [DOCS] [--out=FILE]``: every verdict of the committed study
reports on one page, recomputed on this code from their JSON.

A study report ``DOCS/<name>.md`` keeps its study JSON in ``DOCS/<name>/<study>.json.gz``
(:func:`dllm_rl.study.report_files.write`; ``.json`` from older code). This reads every such JSON
(``--quick`` smoke runs excepted: they claim nothing), recomputes its verdicts with the report's
own rules (:data:`dllm_rl.study.report.REPORTS`: StableDRL over GRPO and its ablations, StepRS
over centered GRPO and its controls, each baseline over its SFT start) and writes one table of
them, each row linking the report that holds its full evidence (tables, plots, the likely
reason). The numbers are the runs' as stored; only the verdict rules are this code's, so a
report written by older report code may word a verdict differently from this page.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import json
import os
import re
import sys

from dllm_rl.study import multiplicity, report, report_files

DEFAULT_DOCS = "docs"
DEFAULT_OUT = "claims.md"  # inside DOCS
_LIKELY = ". Likely reason: "


def find_reports(docs: str) -> list[tuple[str, list[dict]]]:
  """(report markdown path, its study dicts) for every ``DOCS/<name>.md`` whose folder
  ``DOCS/<name>/`` holds the JSON of a registered study, sorted by name; ``--quick`` runs
  are left out."""
  out = []
  for md in sorted(glob.glob(os.path.join(docs, "*.md"))):
    folder = os.path.splitext(md)[0]
    studies = []
    for name in report.REPORTS:  # the report's own order: stability, steprs, baselines
      found = report_files.load_study_json(folder, name)
      if found is not None:
        path, study = found
        if study.get("study") != name:
          raise ValueError(f"{path}: holds study {study.get('study')!r}, not {name!r}")
        if not study.get("quick"):
          studies.append(study)
    if studies:
      out.append((md, studies))
  return out


def report_commit(md_path: str) -> str:
  """The code commit the report's header names (``| code (git commit) | X |``): the code that
  wrote the report, not necessarily the code its reused runs trained on; "—" when absent."""
  with open(md_path) as fh:
    m = re.search(r"^\| code \(git commit\) \| ([^|]+?) \|", fh.read(), re.M)
  return m.group(1) if m else "—"


@dataclasses.dataclass
class Claim:
  """One verdict of one study: where it comes from, what it compares, and the runs it rests
  on (``runs``: the compared arms' ``(arm, seed)`` → that run's summary, as JSON text)."""

  report: str
  report_commit: str
  run_commits: str  # the commits the compared runs trained on (run.json "commit"), if recorded
  testbed: str
  study: str
  seeds: int
  shared_sft: bool
  comparison: str
  verdict: str
  evidence: str
  runs: dict
  covered_by: str = ""  # "superseded by X" / "the same runs as X": left out of the counts
  sft_seed: int | None = None  # the seed of the shared SFT start, when not 0 (--sft_seed)
  first_seed: int = 0  # the study's first seed, when not 0 (--first_seed)
  # a "reproduced" claim: whether Holm's rule over its report section keeps it (None: other)
  holm_kept: bool | None = None


def compared_arms(comparison: str) -> tuple[str, ...]:
  """The arm names a verdict's comparison names: "A vs B (group)", "A vs B, metric" or "A
  improves on the SFT start"."""
  m = re.match(r"(\S+) vs (\S+?)(?:,| \(|$)", comparison)
  if m:
    return m.group(1), m.group(2)
  m = re.match(r"(\S+) improves on the SFT start", comparison)
  if m:
    return (m.group(1),)
  raise ValueError(f"claims: cannot read the arms of the comparison {comparison!r}")


# Summary keys that a rerun of the same run changes (timings, where its plot was written):
# left out when runs are matched across reports.
_VOLATILE_SUFFIXES = ("_seconds", "_per_second", "_plot")


def run_identity(summary: dict) -> str:
  """What makes two runs the same run: their summary without timings and paths (a run
  retrained bit for bit on another day has other wall times)."""
  return json.dumps({k: v for k, v in summary.items() if not k.endswith(_VOLATILE_SUFFIXES)},
                    sort_keys=True)


def claims_of(md: str, study: dict) -> list[Claim]:
  """Every verdict of ``study`` (of report ``md``) by the report's rules, its evidence
  without the likely reason."""
  out = []
  seeds = len({r["seed"] for r in study["runs"]})
  first_seed = min((r["seed"] for r in study["runs"]), default=0)
  written_at, testbed = report_commit(md), report.testbed_name({}, [study])
  lines = report.REPORTS[study["study"]][1](study)
  kept = multiplicity.holm_kept([(what, verdict) for what, verdict, _ in lines])
  for comparison, verdict, evidence in lines:
    holm = None if verdict != "reproduced" or kept is None else comparison in kept
    arms = compared_arms(comparison)
    compared = [r for r in study["runs"] if r["arm"] in arms]
    runs = {(r["arm"], r["seed"]): run_identity(r["summary"]) for r in compared}
    commits = sorted({r.get("commit") or "not recorded" for r in compared})
    out.append(Claim(md, written_at, ", ".join(commits), testbed, study["study"], seeds,
                     bool(study.get("shared_sft")), comparison, verdict,
                     evidence.split(_LIKELY)[0], runs, sft_seed=study.get("sft_seed"),
                     first_seed=first_seed, holm_kept=holm))
  return out


def mark_covered(claims: list[Claim]) -> list[Claim]:
  """A claim whose runs all reappear, identical, in the same comparison of another report
  on the same testbed is covered by it: "superseded by" the one with more runs, or "the
  same runs as" the first report (by name) holding exactly these runs."""
  for c in claims:
    for o in claims:
      if (o is c or o.covered_by or o.testbed != c.testbed or o.comparison != c.comparison
          or not c.runs.items() <= o.runs.items()):
        continue
      if len(o.runs) > len(c.runs):
        c.covered_by = f"superseded by {os.path.basename(o.report)}"
      elif o.report < c.report:
        c.covered_by = f"the same runs as {os.path.basename(o.report)}"
      if c.covered_by:
        break
  return claims


def render(claims: list[Claim], out_dir: str, command: str, commit: str) -> str:
  """The claims page: a count of the verdicts by kind (covered claims left out), then one row
  per claim."""
  counted = [c for c in claims if not c.covered_by]
  kinds = collections.Counter(c.verdict.split(" (")[0] for c in counted)
  kept = sum(c.holm_kept is True for c in counted)
  out = ["# Claims: every verdict of the committed studies", "",
         f"Generated by `{command}` on code {commit} (do not edit by hand; rerun the command)."
         " Each row's numbers are those stored in its report's JSON: runs trained at the"
         " commits of the \"runs at\" column (\"not recorded\" for runs from before run"
         " records kept their commit), reported at the commit of \"report at\"; its verdict"
         " is recomputed by this code's rules"
         " (`dllm_rl/study/report.py`), so a report written by older code may word it"
         " differently. The report holds the evidence: tables, plots and, where a claim does"
         " not reproduce, the likely reason. A claim whose runs reappear in a larger study of"
         " another report is marked superseded, and one whose runs another report already"
         " shows is marked as the same runs; neither is counted. A \"reproduced\" verdict"
         " says whether Holm's step-down rule over its report section's judged comparisons"
         " (family-wise one-sided 2.5%, the report's multiplicity line) keeps it.", "",
         "Verdicts: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
         + f"; Holm's rule keeps {kept} of the {kinds['reproduced']} \"reproduced\".", "",
         "| report | report at | runs at | testbed | study | claim | verdict | evidence |",
         "|" + " --- |" * 8]
  for c in claims:
    link = os.path.relpath(c.report, out_dir)
    verdict = f"({c.covered_by}) {c.verdict}" if c.covered_by else f"**{c.verdict}**"
    if c.holm_kept is not None:
      verdict += "; Holm: kept" if c.holm_kept else "; Holm: not kept"
    study = (f"{c.study}, {c.seeds} seeds"
             + (f" ({c.first_seed}–{c.first_seed + c.seeds - 1})" if c.first_seed else "")
             + (", one SFT start" if c.shared_sft else "")
             + (f" (seed {c.sft_seed}'s)" if c.shared_sft and c.sft_seed else ""))
    row = (f"[{link}]({link})", c.report_commit, c.run_commits, f"`{c.testbed}`", study,
           c.comparison, verdict, c.evidence)
    out.append("| " + " | ".join(map(report.cell, row)) + " |")
  return "\n".join(out) + "\n"


def out_problem(out: str) -> str | None:
  """Why ``--out`` cannot be written (a folder; a missing parent folder; a study report,
  which it would replace: a report's ``.md`` sits beside its JSON folder), else None."""
  if os.path.isdir(out):
    return "is a folder: name the .md file to write"
  parent = os.path.dirname(os.path.abspath(out))
  if not os.path.isdir(parent):
    return f"its folder {parent} does not exist"
  if os.path.isdir(os.path.splitext(out)[0]) and os.path.basename(out) != DEFAULT_OUT:
    return "is a study report (its JSON folder is beside it): name another file"
  return None


def main(argv: list[str]) -> int:
  if {"-h", "--help"} & set(argv[1:]):
    print(__doc__.strip())
    return 0
  args = [a for a in argv[1:] if not a.startswith("--out=")]
  outs = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--out=")]
  if len(args) > 1 or any(a.startswith("-") for a in args):
    print("usage: python -m dllm_rl.study.claims [DOCS] [--out=FILE]", file=sys.stderr)
    return 2
  docs = args[0] if args else DEFAULT_DOCS
  if not os.path.isdir(docs):
    what = "a file, not the folder of reports" if os.path.isfile(docs) else "no such directory"
    print(f"claims: {docs}: {what}", file=sys.stderr)
    return 2
  out = outs[-1] if outs else os.path.join(docs, DEFAULT_OUT)
  problem = out_problem(out)
  if problem:
    print(f"claims: --out={out}: {problem}", file=sys.stderr)
    return 2
  try:
    reports = find_reports(docs)
    claims = mark_covered([c for md, studies in reports for st in studies
                           for c in claims_of(md, st)])
  except ValueError as e:
    print(f"claims: {e}", file=sys.stderr)
    return 2
  if not reports:
    print(f"claims: no study report in {docs} (DOCS/<name>.md beside DOCS/<name>/<study>.json.gz)",
          file=sys.stderr)
    return 2
  from dllm_rl.study.provenance import git_commit
  command = " ".join(["python -m dllm_rl.study.claims"] + argv[1:])
  text = render(claims, os.path.dirname(os.path.abspath(out)), command, git_commit())
  with open(out, "w") as fh:
    fh.write(text)
  print(f"[claims] wrote {out}: {len(claims)} claims of {sum(len(s) for _, s in reports)}"
        f" studies in {len(reports)} reports")
  return 0

if __name__ == "__main__":
  sys.exit(main(sys.argv))
