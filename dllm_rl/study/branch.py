"""``python -m dllm_rl.study.branch RUN_DIR --out=OUT --at=STEP --until=STEP
[--variant=NAME:KEY=VALUE[,KEY=VALUE...] ...]``: what a study run would have done from one of
its steps under other settings.

A study arm keeps its final checkpoint only. This replays the arm (``RUN_DIR``, a folder
``DIR/<study>/seed<S>/<arm>`` with its ``run.json``) from its SFT start with its recorded
overrides on the study DIR's testbed, saving a checkpoint at step AT, and checks that the
replay's per-step records up to AT equal the run's (XLA CPU programs are deterministic: on the
machine that ran it they match bit for bit). Then each variant, and the recorded settings
unchanged (``as_run``), trains from that checkpoint to step UNTIL; a variant's overrides are
validated before anything trains. The lr schedule spans the recorded ``rl.steps`` in every
branch, so a branch differs from the run only where its overrides do. Each process is
stopped by SIGTERM once its metrics reach the step (the preemption path: it saves and exits).
Every problem with the flags, RUN_DIR's files, OUT and the variants' names (each a folder of
OUT: not ``as_run``, ``replay`` or one of OUT's files, and each once) is reported at once,
before anything trains.

Prints and writes ``OUT/branches.json`` (per branch: its overrides and per-step records) and
``OUT/branches.md``: per branch the rollouts' training accuracy (the share correct, comparable
across reward settings) over steps AT+1..UNTIL, its lowest mean over 10 consecutive steps, the
step from which every rollout failed to UNTIL with no gradient
(:func:`dllm_rl.study.stats.all_wrong_from`) and the validation accuracy at UNTIL where one
was evaluated. docs/study.md ("Why runs collapsed at 1000 steps") shows a use.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import ml_collections

from dllm_rl.config import testbeds
from dllm_rl.config.cli import override_values
from dllm_rl.config.overrides import apply_overrides
from dllm_rl.errors import ConfigError, each, raise_all
from dllm_rl.study import stats
from dllm_rl.study.runner import STEP_KEYS, copy_sft_start, make_config, step_records

AS_RUN = "as_run"
NAME = r"[\w.@+-]+"  # a variant's name: its folder in OUT
RESERVED = {AS_RUN: "the recorded settings' branch", "replay": "the replay's folder",
            "source.json": "its record of the run and step", "branches.json": "the branches'"
            " record", "branches.md": "the branches' table", ".": "OUT itself",
            "..": "OUT's parent"}  # names OUT uses besides the variants' folders
WINDOW = 10  # steps: the window of the lowest mean rollout accuracy


def parse_variant(text: str) -> tuple[str, list[tuple[str, str]]]:
  """``NAME:KEY=VALUE[,KEY=VALUE...]`` → (NAME, [(KEY, VALUE text), ...]); NAME names the
  branch's folder (letters, digits, ``_.@+-``)."""
  name, sep, body = text.partition(":")
  if not sep or not re.fullmatch(NAME, name) or not body:
    raise ConfigError("--variant", f"{text!r} is not NAME:KEY=VALUE[,KEY=VALUE...] (NAME of"
                      " letters, digits and _.@+-)")
  raise_all(name_errors([name]))
  pairs = []
  for item in body.split(","):
    key, eq, value = item.partition("=")
    if not eq or not key:
      raise ConfigError("--variant", f"{item!r} in {text!r} is not KEY=VALUE")
    pairs.append((key, value))
  return name, pairs


def name_errors(names: list[str]) -> list[ConfigError]:
  """A ConfigError for each name that is not folder-safe, is reserved (``RESERVED``: a folder
  or file OUT holds besides the variants') or repeats another (case aside: one folder on a
  case-insensitive file system; the second would wipe and retrain the first)."""
  errors, seen = [], set()
  for name in names:
    folded = name.casefold()
    if not re.fullmatch(NAME, name):
      errors.append(ConfigError("--variant", f"{name!r}: a NAME of letters, digits and _.@+-"))
    elif folded in RESERVED:
      errors.append(ConfigError("--variant", f"{name!r} is taken in OUT ({RESERVED[folded]}):"
                                " name it otherwise"))
    elif folded in seen:
      errors.append(ConfigError("--variant", f"{name!r} names two variants (case aside): each"
                                " trains in its own folder OUT/NAME"))
    seen.add(folded)
  return errors


def typed_variant(base: ml_collections.ConfigDict, pairs: list[tuple[str, str]]) -> dict:
  """``{KEY: value}`` of the (KEY, text) pairs, each parsed as the type of ``base``'s value
  there (as ``--config.KEY=VALUE`` is); every unknown key or bad value at once, as
  ConfigErrors."""
  config = ml_collections.ConfigDict(base.to_dict())
  raise_all(apply_overrides(config, pairs))
  return override_values(config, pairs)


def study_dir_of(run_dir: str) -> str:
  """The study DIR holding ``run_dir`` (``DIR/<study>/seed<S>/<arm>``): the nearest parent
  with a ``testbed.txt``; a ConfigError naming ``run_dir`` where none has one."""
  path = os.path.abspath(run_dir)
  for _ in range(4):
    path = os.path.dirname(path)
    if os.path.exists(os.path.join(path, "testbed.txt")):
      return path
  raise ConfigError("RUN_DIR", f"{run_dir} is not in a study DIR (no testbed.txt above it)")


def check_inputs(run_dir: str, out: str, at: int, until: int,
                 names: list[str]) -> tuple[str, dict]:
  """(testbed, recorded overrides) of the finished study run ``run_dir``, once every problem
  with the steps, ``run_dir``'s files (``run.json``, the SFT start, ``metrics.jsonl``, the
  study DIR's ``testbed.txt``), ``out`` and the variants' names is raised at once (ConfigErrors
  naming the flag and the file), before anything trains."""
  errors = []
  def bad(key, message):
    errors.append(ConfigError(key, message))
  if at < 1:
    bad("--at", f"the branch point must be a step >= 1, got {at}")
  if until < 1:
    bad("--until", f"must be a step >= 1, got {until}")
  elif until <= at:
    bad("--until", f"{until} must be past --at={at}")
  errors += name_errors(names)
  testbed, recorded, path = None, None, os.path.join(run_dir, "run.json")
  if not os.path.isdir(run_dir):
    bad("RUN_DIR", f"{run_dir} is not a folder: not a study run (DIR/<study>/seed<S>/<arm>)")
  elif not os.path.isfile(path):
    bad("RUN_DIR", f"{path} does not exist: not a finished study run")
  else:
    try:
      with open(path) as fh:
        record = json.load(fh)
      recorded, steps = record["overrides"], [int(r["step"]) for r in record["steps"]]
      total = int(recorded["rl.steps"])
    except (ValueError, KeyError, TypeError) as err:  # JSONDecodeError is a ValueError
      recorded = None
      bad("RUN_DIR", f"{path} is not a study run's record: "
          + (f"no {err} in it" if isinstance(err, KeyError) else str(err)))
    for name, what in ((os.path.join("checkpoints", "sft"), "SFT start, which each branch copies"),
                       ("metrics.jsonl", "per-step records, which the replay is checked against")):
      if not os.path.exists(os.path.join(run_dir, name)):
        bad("RUN_DIR", f"{os.path.join(run_dir, name)} does not exist: the run's {what}")
  if recorded is not None:
    if until > total:
      bad("--until", f"{until} is past the run's {total} steps (rl.steps in {path})")
    if at > max(steps, default=0):
      bad("--at", f"{at} is past the run's last recorded step ({max(steps, default=0)},"
          f" {path}): the replay is checked against its records")
  if os.path.isdir(run_dir):
    try:
      txt = os.path.join(study_dir_of(run_dir), "testbed.txt")
      with open(txt) as fh:
        testbed = fh.read().strip()
      if testbed not in testbeds.TESTBEDS:
        bad("RUN_DIR", f"{txt}: {testbeds.TESTBEDS.unknown_message(testbed)}")
    except ConfigError as err:
      errors.append(err)
  errors += out_errors(out, run_dir, at)
  raise_all(errors)
  return testbed, recorded


def out_errors(out: str, run_dir: str, at: int) -> list[ConfigError]:
  """A ConfigError where ``out`` is not a folder, overlaps ``run_dir`` (a branch's folder
  OUT/NAME is wiped before it trains) or holds the branches of another run or step
  (``out/source.json``: their replay would be reused)."""
  if not out or (os.path.exists(out) and not os.path.isdir(out)):
    return [ConfigError("--out", f"{out!r} is not a folder")]
  path, claim = os.path.join(out, "source.json"), {"run_dir": os.path.abspath(run_dir), "at": at}
  mine, theirs = os.path.realpath(out), os.path.realpath(run_dir)
  if os.path.commonpath([mine, theirs]) in (mine, theirs):
    return [ConfigError("--out", f"{out} overlaps RUN_DIR {run_dir}: use a folder outside"
                        " it (a branch wipes its folder OUT/NAME before it trains)")]
  if not os.path.exists(path):
    return []
  try:
    with open(path) as fh:
      held = json.load(fh)
    if held != claim:
      return [ConfigError("--out", f"{out} holds the branches of {held['run_dir']} at step"
                          f" {held['at']}: use another --out")]
  except (ValueError, KeyError, TypeError) as err:
    return [ConfigError("--out", f"{path} is not a record of the run and step OUT branches"
                        f" ({err}): use another --out")]
  return []


def branch_overrides(recorded: dict, at: int, variant: dict) -> dict:
  """The recorded overrides with a checkpoint every ``at`` steps, then the variant's. A variant
  that turns KL on starts from the checkpoint with the run's SFT start as its reference, as a
  run with KL from step 0 has it (dllm_rl.train.lora_checkpoint.restore_checkpoint)."""
  return {**recorded, "checkpoint.save_every": at, "checkpoint.keep": 1_000_000,
          "checkpoint.async_save": False, **variant}


def first_difference(ours: list[dict], theirs: list[dict], until: int) -> str | None:
  """"step S, KEY" of the first per-step record (up to ``until``) that differs, else None."""
  mine = {r["step"]: r for r in ours if r["step"] <= until}
  for r in theirs:
    if r["step"] > until:
      break
    other = mine.get(r["step"])
    if other is None:
      return f"step {r['step']} (missing from the replay)"
    for key in STEP_KEYS:  # the run's metrics (a newer metric the run lacks is not compared)
      if key in r and r[key] != other.get(key):
        return f"step {r['step']}, {key}: {other.get(key)!r} against {r.get(key)!r}"
  return None


def summarise(records: list[dict], evals: list[dict], at: int, until: int) -> dict:
  """A branch's figures over steps ``at``+1..``until``."""
  rows = [r for r in records if at < r["step"] <= until]
  acc = [r["accuracy"] for r in rows]
  windows = [sum(acc[i:i + WINDOW]) / WINDOW for i in range(len(acc) - WINDOW + 1)]
  val = [e["val_accuracy"] for e in evals if e["step"] == until]
  return {"steps": len(rows), "accuracy": sum(acc) / len(acc) if acc else None,
          "lowest_window_accuracy": min(windows) if windows else None,
          "all_wrong_from": stats.all_wrong_from(rows),
          "val_accuracy": val[-1] if val else None}


def train_until(workdir: str, testbed: str, overrides: dict, until: int, log) -> None:
  """Train (a subprocess) in ``workdir`` until its metrics reach step ``until``, then stop it
  with SIGTERM (it saves a checkpoint and exits). Raises RuntimeError with the process's last
  output when it fails first."""
  spec = os.path.join(workdir, "branch_spec.json")
  with open(spec, "w") as fh:
    json.dump({"testbed": testbed, "overrides": overrides}, fh)
  log_path = os.path.join(workdir, "train.log")
  with open(log_path, "w") as out:
    proc = subprocess.Popen([sys.executable, "-m", "dllm_rl.study.branch", "--train", spec,
                             "--out", workdir], stdout=out, stderr=subprocess.STDOUT)
  metrics, t0 = os.path.join(workdir, "metrics.jsonl"), time.monotonic()
  while proc.poll() is None:
    if _reached(metrics, until):
      proc.send_signal(signal.SIGTERM)
      proc.wait()
      break
    time.sleep(1.0)
  if not _reached(metrics, until):
    with open(log_path) as fh:
      tail = fh.read()[-3000:]
    raise RuntimeError(f"{workdir}: training ended (status {proc.returncode}) before step"
                       f" {until}:\n{tail}")
  log(f"[branch] {os.path.basename(workdir)}: step {until} in {time.monotonic() - t0:.0f} s")


def _reached(metrics_path: str, step: int) -> bool:
  if not os.path.exists(metrics_path):
    return False
  records, _, _ = step_records(metrics_path)
  return bool(records) and records[-1]["step"] >= step


def _train(spec_path: str, workdir: str) -> None:
  """The training subprocess: the spec's overrides on its testbed, in ``workdir``."""
  from dllm_rl.train import modes
  from dllm_rl.train.resilience import Preempted
  with open(spec_path) as fh:
    spec = json.load(fh)
  config = make_config(spec["overrides"], testbeds.testbed(spec["testbed"]).get_config())
  try:
    modes.run(config, workdir)
  except Preempted:  # the parent's SIGTERM at the step it wanted: a checkpoint was saved
    pass


def branch(run_dir: str, out: str, at: int, until: int,
           variants: list[tuple[str, list[tuple[str, str]]]], log=print) -> dict:
  """Replay ``run_dir`` to step ``at`` (checked against its records), then each branch
  (``as_run`` and ``variants``: (NAME, [(KEY, VALUE text), ...]) as :func:`parse_variant`
  gives them, typed against the run's testbed) from there to ``until``; returns and writes
  the record."""
  from dllm_rl.train.validate import validate
  testbed, recorded = check_inputs(run_dir, out, at, until, [name for name, _ in variants])
  base = testbeds.testbed(testbed).get_config()
  branches = [(AS_RUN, {})] + [(name, typed_variant(base, pairs)) for name, pairs in variants]
  for name, variant in branches:  # every branch's config, before anything trains
    validate(make_config(branch_overrides(recorded, at, variant), base))
  _claim_out(out, run_dir, at)
  replay = os.path.join(out, "replay")
  copy_sft_start(run_dir, replay)
  if not os.path.isdir(os.path.join(replay, "checkpoints", "rl", str(at))):
    train_until(replay, testbed, branch_overrides(recorded, at, {}), at, log)
  ours, _, _ = step_records(os.path.join(replay, "metrics.jsonl"))
  theirs, _, _ = step_records(os.path.join(run_dir, "metrics.jsonl"))
  differs = first_difference(ours, theirs, at)
  log(f"[branch] replay to step {at}: " + (f"differs from the run at {differs}" if differs
                                           else "every per-step record equals the run's"))
  result = {"run_dir": os.path.abspath(run_dir), "testbed": testbed, "at": at, "until": until,
            "replay_differs": differs, "branches": []}
  for name, variant in branches:
    workdir, overrides = os.path.join(out, name), branch_overrides(recorded, at, variant)
    if not (_reached(os.path.join(workdir, "metrics.jsonl"), until)
            and _spec_overrides(workdir) == overrides):  # a renamed or changed variant: retrain
      shutil.rmtree(workdir, ignore_errors=True)
      copy_sft_start(run_dir, workdir)
      shutil.copytree(os.path.join(replay, "checkpoints", "rl", str(at)),
                      os.path.join(workdir, "checkpoints", "rl", str(at)))
      train_until(workdir, testbed, overrides, until, log)
    records, evals, _ = step_records(os.path.join(workdir, "metrics.jsonl"))
    result["branches"].append({"name": name, "overrides": variant,
                               **summarise(records, evals, at, until),
                               "records": [r for r in records if at < r["step"] <= until],
                               "evals": [e for e in evals if at < e["step"] <= until]})
  with open(os.path.join(out, "branches.json"), "w") as fh:
    json.dump(result, fh)
  text = render(result)
  with open(os.path.join(out, "branches.md"), "w") as fh:
    fh.write(text)
  log(text)
  return result


def _claim_out(out: str, run_dir: str, at: int) -> None:
  """Record which run and step ``out`` branches (``out/source.json``; :func:`out_errors`
  refuses another run's or step's)."""
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, "source.json"), "w") as fh:
    json.dump({"run_dir": os.path.abspath(run_dir), "at": at}, fh)


def _spec_overrides(workdir: str) -> dict | None:
  path = os.path.join(workdir, "branch_spec.json")
  if not os.path.exists(path):
    return None
  with open(path) as fh:
    return json.load(fh)["overrides"]


def render(result: dict) -> str:
  """The branches as a markdown table."""
  def num(v, digits=3):
    return "—" if v is None else f"{v:.{digits}f}"
  at, until = result["at"], result["until"]
  lines = [f"Branches of `{result['run_dir']}` from step {at} to {until}"
           f" (replay: {result['replay_differs'] or 'equal to the run'}).", "",
           f"| branch | overrides | rollout acc., steps {at + 1}–{until} | lowest {WINDOW}-step"
           f" mean | every rollout wrong from | val acc. at {until} |", "|---|---|---|---|---|---|"]
  for b in result["branches"]:
    over = ", ".join(f"{k}={v}" for k, v in b["overrides"].items()) or "(as recorded)"
    lines.append(f"| {b['name']} | {over} | {num(b['accuracy'])} |"
                 f" {num(b['lowest_window_accuracy'])} |"
                 f" {b['all_wrong_from'] if b['all_wrong_from'] is not None else '—'} |"
                 f" {num(b['val_accuracy'])} |")
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m dllm_rl.study.branch",
                              description=__doc__.split("\n\n")[1])
  p.add_argument("run_dir", nargs="?", metavar="RUN_DIR",
                 help="a study run: DIR/<study>/seed<S>/<arm>, with its run.json")
  p.add_argument("--out", required=True, help="a new folder for the replay and the branches")
  p.add_argument("--at", type=int, metavar="STEP", help="the RL step the branches start from")
  p.add_argument("--until", type=int, metavar="STEP", help="the RL step every branch ends at")
  p.add_argument("--variant", action="append", default=[],
                 metavar="NAME:KEY=VALUE[,KEY=VALUE...]",
                 help="a branch (repeatable): its folder name in OUT and its config overrides,"
                      " e.g. half_lr:rl.lr=1e-4")
  p.add_argument("--train", help=argparse.SUPPRESS)  # the training subprocess's spec
  args = p.parse_args(argv)
  if args.train:
    _train(args.train, args.out)
    return 0
  try:
    if args.run_dir is None or args.at is None or args.until is None:
      raise ConfigError("RUN_DIR", "RUN_DIR, --at and --until are required")
    variants, errors = [], []
    for text in args.variant:  # every malformed --variant at once
      try:
        variants.append(parse_variant(text))
      except ConfigError as err:
        errors.append(err)
    if errors:  # and the other inputs' problems with them
      try:
        check_inputs(args.run_dir, args.out, args.at, args.until, [n for n, _ in variants])
      except ConfigError as err:
        errors += each(err)
    raise_all(errors)
    branch(args.run_dir, args.out, args.at, args.until, variants)
  except ConfigError as err:
    for one in each(err):  # one line per problem
      print(f"error: {one}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
