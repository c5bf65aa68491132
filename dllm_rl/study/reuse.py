"""``--reuse_from``: finished runs from earlier study JSONs (a committed report's
``<study>.json.gz``) seed a study DIR, and reruns in DIR are checked against them.

A run recorded in such a file, of this study, one of its selected arms and one of its seeds, is
written into DIR as that arm's finished run (``run.json``, marked ``reused_from``) where DIR has
none; the study then reuses it after the same override check as any finished run
(runner.check_reusable), so a record made with other settings is a ConfigError, not mixed in.
Where DIR already holds the run (trained by this code), the two records are compared: equal
per-step records, evaluations, final figures and overrides mean the rerun reproduced the
recorded run bit for bit, the check that makes reusing the others sound (XLA's CPU kernels
round differently on different CPU types, so records reproduce on the CPU type that made them).
The overrides must be equal; of the per-step records, evaluations and final figures, every
top-level value the record holds is compared, and a metric the code added after the record was
made (e.g. ``malformed_fraction``) is in the rerun only, so it is named, not counted as a
difference.
"""

from __future__ import annotations

import json
import os

from dllm_rl.errors import ConfigError, raise_all
from dllm_rl.study import report_files
from dllm_rl.study.runner import arm_dir, read_record

METRICS = ("steps", "evals", "final")  # a rerun may add metrics to these; overrides match exactly


def _equal(a, b) -> bool:
  """``a == b``, NaN equal to NaN at any depth: a skipped non-finite step records a NaN grad
  norm and loss, which a bit-for-bit rerun records again (NaN == NaN is False)."""
  if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
    return True
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
  if isinstance(a, list) and isinstance(b, list):
    return len(a) == len(b) and all(map(_equal, a, b))
  return a == b


def _metrics_match(recorded: dict, rerun: dict, added: set) -> bool:
  """Whether ``rerun`` holds every key of ``recorded`` with the same value (:func:`_equal`);
  the keys only ``rerun`` has go into ``added``."""
  added.update(set(rerun) - set(recorded))
  return all(k in rerun and _equal(rerun[k], v) for k, v in recorded.items())


def reproduces(recorded: dict, rerun: dict) -> tuple[bool, set[str]]:
  """(whether ``rerun`` reproduces every value of the study record ``recorded``, bit for bit:
  the same overrides, and per step, evaluation and final figure the recorded metrics' values;
  the metric names only the rerun records). A record made before a metric existed thus still
  matches the rerun that logs it."""
  added: set[str] = set()
  if rerun.get("overrides") != recorded.get("overrides"):
    return False, added
  for key in METRICS:
    mine, theirs = recorded.get(key), rerun.get(key)
    if isinstance(mine, dict) and isinstance(theirs, dict):
      same = _metrics_match(mine, theirs, added)
    elif isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs):
      same = all(isinstance(a, dict) and isinstance(b, dict) and _metrics_match(a, b, added)
                 for a, b in zip(mine, theirs))
    else:
      same = _equal(mine, theirs)
    if not same:
      return False, added
  return True, added


def read_study_json(path: str) -> dict:
  """A study JSON (``.json`` or ``.json.gz``); a ConfigError (key ``--reuse_from``) naming the
  file when it is missing, unreadable or not a study's record."""
  if not os.path.isfile(path):
    raise ConfigError("--reuse_from", f"{path}: no such file")
  try:
    data = report_files.read_study_file(path)
  except ValueError as err:
    raise ConfigError("--reuse_from", str(err)) from None
  if not isinstance(data, dict) or not isinstance(data.get("runs"), list) or "study" not in data:
    raise ConfigError("--reuse_from", f"{path} is not a study JSON (no 'study' and 'runs')")
  return data


def check_files(files: list[str], names: list[str], testbed: str | None = None) -> None:
  """Every problem of the ``--reuse_from`` files at once, as ConfigErrors naming each file,
  before any run is written or trained: one missing or not a study JSON
  (:func:`read_study_json`), one that records none of the studies ``names`` (another study's
  file would be skipped, and the study would train every run it was meant to reuse) and one
  recorded on another ``testbed`` than this study's."""
  errors = []
  for path in files:
    try:
      data = read_study_json(path)
    except ConfigError as err:
      errors.append(err)
      continue
    if data["study"] not in names:
      errors.append(ConfigError("--reuse_from", f"{path} records {data['study']} runs; this"
                                f" invocation runs {', '.join(names)} (leave the file out, or"
                                f" run {data['study']})"))
    elif problem := other_testbed(path, data, testbed):
      errors.append(problem)
  raise_all(errors)


def other_testbed(path: str, data: dict, testbed: str | None) -> ConfigError | None:
  """A ConfigError naming ``path`` when its study JSON ``data`` was recorded on another testbed
  than ``testbed`` (None: not checked)."""
  if testbed is None or data.get("testbed", testbed) == testbed:
    return None
  return ConfigError("--reuse_from", f"{path} records {data['study']} runs on testbed"
                     f" {data['testbed']!r}; this study runs on {testbed!r} (pass"
                     f" --testbed={data['testbed']}, or leave the file out)")


def reuse_runs(workdir: str, name: str, arm_names: list[str], seeds: int | range,
               files: list[str], testbed: str | None = None) -> dict:
  """Seed DIR with ``files``' runs of study ``name`` (``arm_names`` × ``seeds``: a range, or
  an int n for seeds 0..n-1) where DIR has none, and compare those DIR has. Returns
  ``{"written": n, "kept": n, "identical": [...], "differing": [...], "files": [...], "line":
  summary_line, "added": [...]}`` ("kept": the file's own records, which an earlier reuse or a
  copy put there, told by the marker or the run's wall time; runs named "seed S arm"; "added":
  the metrics the matching reruns log and their records predate, :func:`reproduces`); the
  first file that records a run is used. A file of study ``name`` recorded on another
  ``testbed`` is a ConfigError naming it, before anything is written (its runs trained
  another task from another SFT start; the report would set them beside this one's)."""
  records, seeds = {}, seeds if isinstance(seeds, range) else range(seeds)
  for path in files:
    data = read_study_json(path)
    if data["study"] != name:
      continue
    if problem := other_testbed(path, data, testbed):
      raise problem
    for run in data["runs"]:
      if run["arm"] in arm_names and run["seed"] in seeds:
        records.setdefault((run["seed"], run["arm"]), (path, run))
  out = {"written": 0, "kept": 0, "identical": [], "differing": [], "files": list(files)}
  added: set[str] = set()
  for (seed, arm), (path, run) in sorted(records.items()):
    target = os.path.join(arm_dir(workdir, name, seed, arm), "run.json")
    if os.path.exists(target):
      have = read_record(target)  # a ConfigError naming a broken one
      if have.get("reused_from") or have.get("wall_seconds") == run.get("wall_seconds"):
        out["kept"] += 1  # the file's own record (an earlier reuse or a copy), not a rerun
        continue
      same, new = reproduces(run, have)
      added |= new if same else set()
      out["identical" if same else "differing"].append(f"seed {seed} {arm}")
      continue
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target + ".tmp", "w") as fh:
      json.dump({**run, "reused_from": run.get("reused_from") or os.path.basename(path)}, fh)
    os.replace(target + ".tmp", target)  # a stopped study never leaves half a record
    out["written"] += 1
  out["added"] = sorted(added)
  return {**out, "line": summary_line(name, out)}


def summary_line(name: str, counts: dict) -> str:
  """One line for the log and the report: what was reused and what was checked."""
  line = (f"{counts['written']} run(s) written from {', '.join(counts['files'])}"
          + (f" ({counts['kept']} more were already there)" if counts["kept"]
             else "") + ";"
          f" {len(counts['identical'])} already in DIR matched their records bit for bit")
  if counts["identical"]:
    line += f" ({', '.join(counts['identical'])})"
  if counts.get("added"):
    line += (f", on every value recorded (the reruns also log {', '.join(counts['added'])},"
             " which the records predate)")
  if counts["differing"]:
    line += (f"; {len(counts['differing'])} differ from their records"
             f" ({', '.join(counts['differing'])}): DIR's own runs are kept")
  return f"{name}: {line}"
