"""Benchmark: fault injection into the embedded default run, and what each fault costs.

    python -m dllm_rl.benchmarks.faults [--runs N] [--seed S] [--workdir DIR] [--config.KEY=V ...]

First the embedded default (``python -m dllm_rl.main``, plus any ``--config.KEY=V``) runs once
uninterrupted: the reference. Then, ``--runs`` times each, at a random point of its RL phase
(seeded by ``--seed``), a fresh run from the reference's finished SFT checkpoint gets one fault
(``DLLM_FAULT``, see dllm_rl/infra/faults.py; the signals are real signals to the process):

* ``sigterm`` / ``sigkill`` during a rollout, during an update, and while an asynchronous
  checkpoint save is being written;
* ``nan reward``: every reward of one rollout batch is NaN (no restart: the run goes on);
* ``truncated ckpt``: ``kill -9`` after at least two RL checkpoints, then the arrays file of the
  newest one is cut in half before the rerun (restore must fall back to the previous one).

After a fault that stops the process the same command is rerun once (resume). Reported per
fault kind, over its runs:

* ``resumed = uninterrupted``: the final ``summary.json`` and every metric record, in order,
  equal the reference's, timings aside (wall times, throughput, MFU, memory: ``TIMING``);
* ``steps lost``: RL steps completed before the fault that the resumed run had to redo
  (completed − restored step);
* ``lines lost at fault``: metric records of the completed steps that were not on disk when the
  process died;
* ``lines lost after resume``: reference records missing (or repeated) in the final file.

Prints measured figures only (a Markdown table, and JSON with every run); asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

from dllm_rl.benchmarks.common import description

# Keys (of summary.json and of the metric records) that differ from run to run: wall times,
# throughput, MFU, memory and the plot paths.
TIMING = ("seconds", "per_second", "plot", "mfu", "memory_gib")


def _timed(key: str) -> bool:
  return key == "time" or any(t in key for t in TIMING)


def _main_cmd(workdir: str, overrides: list[str]) -> list[str]:
  return [sys.executable, "-m", "dllm_rl.main", f"--workdir={workdir}", *overrides]


def _run(workdir: str, overrides: list[str], fault: str | None, log: str) -> tuple[int, str]:
  env = {k: v for k, v in os.environ.items() if k != "DLLM_FAULT"}
  if fault:
    env["DLLM_FAULT"] = fault
  with open(log, "w") as fh:
    proc = subprocess.run(_main_cmd(workdir, overrides + ["--config.log.progress=false"]),
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    fh.write(proc.stdout)
  return proc.returncode, proc.stdout


def _records(workdir: str) -> list[dict]:
  from dllm_rl.infra.observability import read_metrics
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  return [{k: v for k, v in r.items() if not _timed(k)} for r in read_metrics(path)]


def _key(record: dict) -> str:
  return json.dumps(record, sort_keys=True)


def _missing(want: list[dict], have: list[dict]) -> int:
  """Records of ``want`` absent from ``have`` plus records of ``have`` not in ``want``
  (a multiset difference: repeated lines count)."""
  a, b = collections.Counter(map(_key, want)), collections.Counter(map(_key, have))
  return sum((a - b).values()) + sum((b - a).values())


def _untimed(path: str) -> dict | None:
  if not os.path.exists(path):
    return None
  return {k: v for k, v in json.load(open(path)).items() if not _timed(k)}


def _reference(root: str, overrides: list[str]) -> dict:
  ref = os.path.join(root, "reference")
  t0 = time.time()
  rc, out = _run(ref, overrides, None, os.path.join(root, "reference.log"))
  if rc != 0:
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    raise SystemExit("\n".join([f"the uninterrupted reference run failed (status {rc}); see "
                                f"{root}/reference.log", *errors]))
  config = json.loads(json.load(open(_newest_meta(ref, "rl")))["config"])
  return {"dir": ref, "records": _records(ref),
          "summary": _untimed(os.path.join(ref, "summary.json")),
          "steps": config["rl"]["steps"], "save_every": config["checkpoint"]["save_every"],
          "inner_steps": config["rl"]["inner_steps"], "seconds": time.time() - t0}


def _newest_meta(workdir: str, phase: str) -> str:
  root = os.path.join(workdir, "checkpoints", phase)
  steps = sorted(int(s) for s in os.listdir(root) if s.isdigit())
  return os.path.join(root, str(steps[-1]), "meta", "metadata")


def _fresh_from_sft(ref: dict, workdir: str) -> None:
  """A workdir holding the reference's finished SFT phase (checkpoint, its summary's record
  and its metric lines)."""
  os.makedirs(os.path.join(workdir, "checkpoints"))
  shutil.copytree(os.path.join(ref["dir"], "checkpoints", "sft"),
                  os.path.join(workdir, "checkpoints", "sft"))
  shutil.copy(os.path.join(ref["dir"], "sft_summary.json"), workdir)
  with open(os.path.join(ref["dir"], "metrics.jsonl")) as src, \
       open(os.path.join(workdir, "metrics.jsonl"), "w") as dst:
    dst.writelines(line for line in src if json.loads(line).get("phase") == "sft")


def _truncate_newest_rl(workdir: str) -> str:
  root = os.path.join(workdir, "checkpoints", "rl")
  steps = sorted(int(s) for s in os.listdir(root) if s.isdigit())
  data = os.path.join(root, str(steps[-1]), "state", "d")
  for name in os.listdir(data):
    path = os.path.join(data, name)
    with open(path, "r+b") as fh:
      fh.truncate(os.path.getsize(path) // 2)
  return f"{steps[-1]}"


def _scenario(kind: str, ref: dict, rng: random.Random) -> tuple[str, int, dict]:
  """(DLLM_FAULT spec, steps completed when the fault hits, extra info) for one run."""
  steps, every = ref["steps"], ref["save_every"]
  saves = [s for s in range(every, steps, every)]
  if kind.endswith("checkpoint"):
    at = rng.choice(saves)
    return f"{kind.split()[0]}@checkpoint:{at}", at, {}
  if kind == "nan reward":
    at = rng.randrange(1, steps)
    return f"nan@reward:{at}", at, {}
  if kind == "truncated ckpt":
    at = rng.randrange(saves[1] + 1, steps) if len(saves) > 1 else steps - 1
    return f"sigkill@rollout:{at}", at, {}
  signal_name, point = kind.split()
  at = rng.randrange(1, steps)
  return f"{signal_name}@{point}:{at}", at, {}


def _checked_config(overrides: list[str]):
  """The runs' config (the embedded default with ``overrides``), validated as ``python -m
  dllm_rl.main`` validates it: exits with status 2 listing every problem, before any run."""
  from dllm_rl.config import cli
  from dllm_rl.config.defaults import get_config
  from dllm_rl.train.validate import validate
  return cli.load(None, cli.split_overrides(overrides)[1], check=validate, default=get_config)


def kind_problems(kinds: list[str], steps: int, save_every: int) -> list[str]:
  """Why the fault points of ``kinds`` cannot be drawn from a run of ``steps`` RL steps that
  saves every ``save_every`` (``_scenario``'s needs); [] when they can."""
  problems = []
  if steps < 2:
    problems.append(f"config.rl.steps: {steps}; a fault needs a run of at least 2 RL steps")
  needs_save = [k for k in kinds if k.endswith("checkpoint") or k == "truncated ckpt"]
  if needs_save and save_every >= steps:
    problems.append(f"config.checkpoint.save_every: {save_every}, not below rl.steps {steps}: "
                    f"{', '.join(needs_save)} need an RL checkpoint before the last step")
  return problems


KINDS = ("sigterm rollout", "sigterm update", "sigterm checkpoint", "sigkill rollout",
         "sigkill update", "sigkill checkpoint", "nan reward", "truncated ckpt")


def _one(kind: str, ref: dict, root: str, n: int, overrides: list[str],
         rng: random.Random) -> dict:
  workdir = os.path.join(root, f"{kind.replace(' ', '_')}_{n}")
  _fresh_from_sft(ref, workdir)
  spec, completed, _ = _scenario(kind, ref, rng)
  t0 = time.time()
  rc, _ = _run(workdir, overrides, spec, workdir + ".fault.log")
  on_disk = _records(workdir)
  want_at_fault = [r for r in ref["records"]
                   if r["phase"] == "sft" or (r["step"] <= completed and "test_accuracy" not in r)]
  result = {"kind": kind, "fault": spec, "status": rc, "completed": completed,
            "lines_lost_at_fault": sum((collections.Counter(map(_key, want_at_fault))
                                        - collections.Counter(map(_key, on_disk))).values())}
  if kind == "nan reward":
    skipped = [r["skipped_steps"] for r in on_disk if r["phase"] == "rl" and "skipped_steps" in r]
    result.update(finished=rc == 0, skipped_steps=skipped[-1] if skipped else None,
                  final_accuracy=(_untimed(os.path.join(workdir, "summary.json")) or {}).get(
                      "rl_accuracy"), seconds=time.time() - t0)
    return result
  if kind == "truncated ckpt":
    result["truncated_step"] = _truncate_newest_rl(workdir)
  rc2, out = _run(workdir, overrides, None, workdir + ".resume.log")
  m = re.search(r"\[rl\] resumed at rollout batch (\d+)", out)
  restored = int(m.group(1)) if m else 0
  final = _records(workdir)
  same_summary = _untimed(os.path.join(workdir, "summary.json")) == ref["summary"]
  same_lines = final == ref["records"]
  result.update(resume_status=rc2, restored=restored, steps_lost=max(completed - restored, 0),
                lines_lost_after_resume=_missing(ref["records"], final),
                resumed_equal=bool(rc2 == 0 and same_summary and same_lines),
                fallback_warning="damaged" in out, seconds=time.time() - t0)
  return result


def _table(results: list[dict], ref: dict) -> str:
  rows = ["| fault | runs | exit status | resumed = uninterrupted | steps lost (max) "
          "| metric lines lost at fault / after resume |",
          "| --- | --- | --- | --- | --- | --- |"]
  for kind in KINDS:
    rs = [r for r in results if r["kind"] == kind]
    if not rs:
      continue
    status = ", ".join(sorted({str(r["status"]) for r in rs}))
    at_fault = max(r["lines_lost_at_fault"] for r in rs)
    if kind == "nan reward":
      skipped = sorted({r["skipped_steps"] for r in rs}, key=str)
      rows.append(f"| {kind} | {len(rs)} | {status} | no restart: run finished "
                  f"{sum(r['finished'] for r in rs)}/{len(rs)}, skipped_steps {skipped} | 0 "
                  f"| {at_fault} / – |")
      continue
    equal = sum(r["resumed_equal"] for r in rs)
    lost = max(r["steps_lost"] for r in rs)
    after = max(r["lines_lost_after_resume"] for r in rs)
    note = ""
    if kind == "truncated ckpt":
      note = f" (fell back: {sum(r['fallback_warning'] for r in rs)}/{len(rs)})"
    rows.append(f"| {kind} | {len(rs)} | {status} | {equal}/{len(rs)}{note} | {lost} "
                f"| {at_fault} / {after} |")
  return "\n".join(rows)


def main(argv=None) -> None:
  argv = list(sys.argv[1:] if argv is None else argv)
  overrides = [a for a in argv if a.startswith("--config.")]
  parser = argparse.ArgumentParser(
      prog="python -m dllm_rl.benchmarks.faults", description=description(__doc__),
      epilog="Any --config.KEY=VALUE goes to every run (python -m dllm_rl.main's overrides),"
             " e.g. tiny sizes; a fault kind with a space is one argument: --kinds"
             " 'sigterm rollout' 'nan reward'.")
  parser.add_argument("--runs", type=int, default=1, help="runs of each fault kind")
  parser.add_argument("--seed", type=int, default=0, help="seeds the fault points")
  parser.add_argument("--workdir", default="", help="keep every run here (default: a temp dir)")
  parser.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
  args = parser.parse_args([a for a in argv if not a.startswith("--config.")])
  config = _checked_config(overrides)
  problems = kind_problems(args.kinds, config.rl.steps, config.checkpoint.save_every)
  if problems:
    parser.error("; ".join(problems))
  root = args.workdir or tempfile.mkdtemp(prefix="dllm_faults_")
  os.makedirs(root, exist_ok=True)
  rng = random.Random(args.seed)
  ref = _reference(root, overrides)
  print(f"reference: embedded default {' '.join(overrides)} | rl.steps {ref['steps']}, "
        f"checkpoint.save_every {ref['save_every']} | {ref['seconds']:.0f} s | {root}", flush=True)
  results = []
  for n in range(args.runs):
    for kind in args.kinds:
      results.append(_one(kind, ref, root, n, overrides, rng))
      print(json.dumps(results[-1]), flush=True)
  print()
  print(_table(results, ref))
  with open(os.path.join(root, "faults.json"), "w") as fh:
    json.dump({"overrides": overrides, "steps": ref["steps"], "save_every": ref["save_every"],
               "results": results}, fh, indent=2)


if __name__ == "__main__":
  main()
