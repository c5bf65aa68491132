"""--reuse_from: an earlier study JSON's runs seed a DIR; the runs DIR has are compared."""

import gzip
import json
import os

import pytest

from dllm_rl.errors import ConfigError
from dllm_rl.study import reuse
from dllm_rl.study.runner import arm_dir


def _run(seed, arm, loss, wall_seconds=60.0):
  return {"seed": seed, "arm": arm, "overrides": {"seed": seed}, "final": {"test_accuracy": 0.5},
          "wall_seconds": wall_seconds,
          "evals": [{"step": 0, "val_accuracy": 0.25}], "steps": [{"step": 1, "loss": loss}]}


def _write(workdir, study, run, **extra):
  path = arm_dir(str(workdir), study, run["seed"], run["arm"]) + "/run.json"
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as fh:
    json.dump({**run, **extra}, fh)
  return path


def test_runs_are_written_where_dir_has_none_and_reruns_are_compared(tmp_path):
  committed = tmp_path / "steprs.json.gz"
  runs = [_run(s, a, 0.1 * s + (a == "b")) for s in (0, 1, 2) for a in ("a", "b", "c@lr1e-4")]
  with gzip.open(committed, "wt") as fh:
    json.dump({"study": "steprs", "runs": runs}, fh)
  other = tmp_path / "stability.json"  # another study's runs are never written
  other.write_text(json.dumps({"study": "stability", "runs": [_run(0, "a", 9.0)]}))
  work = tmp_path / "dir"
  _write(work, "steprs", _run(0, "a", 0.0, 58.5))  # reran: the same record
  _write(work, "steprs", _run(0, "b", 0.5, 61.0))  # reran: another loss
  got = reuse.reuse_runs(str(work), "steprs", ["a", "b", "c@lr1e-4"], 2,
                         [str(other), str(committed)])
  assert got["written"] == 4 and got["kept"] == 0  # seeds 0-1 of a, b, c less the two reruns
  assert got["identical"] == ["seed 0 a"] and got["differing"] == ["seed 0 b"]
  written = json.load(open(arm_dir(str(work), "steprs", 1, "c@lr1e-4") + "/run.json"))
  assert written == {**runs[5], "reused_from": "steprs.json.gz"}
  assert json.load(open(arm_dir(str(work), "steprs", 0, "b") + "/run.json"))["steps"][0][
      "loss"] == 0.5  # DIR's own run is kept
  assert not (work / "steprs" / "seed2" / "a").exists()  # beyond --seeds
  # the file's own record copied in by hand (no marker, its wall time) is not a rerun
  _write(tmp_path / "dir2", "steprs", runs[1])
  copied = reuse.reuse_runs(str(tmp_path / "dir2"), "steprs", ["b"], 1, [str(committed)])
  assert copied["identical"] == [] and copied["kept"] == 1 and copied["written"] == 0
  line = reuse.summary_line("steprs", got)
  assert "4 run(s) written" in line and "1 already in DIR matched" in line
  assert "1 differ from their records (seed 0 b)" in line
  # a second invocation: what the first wrote is not counted as a rerun that matched
  again = reuse.reuse_runs(str(work), "steprs", ["a", "b", "c@lr1e-4"], 2, [str(committed)])
  assert again["written"] == 0 and again["kept"] == 4 and again["identical"] == ["seed 0 a"]
  fresh = reuse.reuse_runs(str(tmp_path / "dir3"), "steprs", ["a"], range(1, 3),
                         [str(committed)])  # --first_seed=1 --seeds=2
  assert fresh["written"] == 2 and not (tmp_path / "dir3" / "steprs" / "seed0").exists()


def test_a_bad_file_is_named(tmp_path):
  with pytest.raises(ConfigError, match=r"--reuse_from.*missing\.json"):
    reuse.reuse_runs(str(tmp_path), "steprs", ["a"], 1, [str(tmp_path / "missing.json")])
  (tmp_path / "x.json").write_text(json.dumps({"runs": []}))
  with pytest.raises(ConfigError, match=r"x\.json is not a study JSON"):
    reuse.reuse_runs(str(tmp_path), "steprs", ["a"], 1, [str(tmp_path / "x.json")])
  # another testbed's runs (another task, another SFT start): named, nothing written
  (tmp_path / "s.json").write_text(json.dumps({"study": "steprs", "testbed": "sum_split",
                                               "runs": [_run(0, "a", 0.1)]}))
  with pytest.raises(ConfigError, match=r"^--reuse_from: .*s\.json records steprs runs on"
                                        r" testbed 'sum_split'; this study runs on 'arithmetic'"):
    reuse.reuse_runs(str(tmp_path / "w"), "steprs", ["a"], 1, [str(tmp_path / "s.json")],
                     "arithmetic")
  assert not (tmp_path / "w").exists()


def test_a_rerun_that_logs_a_newer_metric_still_matches(tmp_path):
  """A record made before a metric existed (e.g. malformed_fraction) matches a rerun that logs
  it when every recorded value is equal; a recorded value that changed, a recorded metric the
  rerun lacks, another step count or other overrides do not."""
  recorded = _run(0, "a", 0.25)
  rerun = {**recorded, "wall_seconds": 1.0, "steps": [{"step": 1, "loss": 0.25,
                                                       "malformed_fraction": 0.0}],
           "final": {"test_accuracy": 0.5, "test_malformed_fraction": 0.125}}
  assert reuse.reproduces(recorded, rerun) == (True, {"malformed_fraction",
                                                      "test_malformed_fraction"})
  changed = {**rerun, "steps": [{"step": 1, "loss": 0.5, "malformed_fraction": 0.0}]}
  assert not reuse.reproduces(recorded, changed)[0]
  assert not reuse.reproduces(recorded, {**rerun, "final": {"test_malformed_fraction": 0.1}})[0]
  assert not reuse.reproduces(recorded, {**rerun, "steps": rerun["steps"] * 2})[0]
  assert not reuse.reproduces(recorded, {**rerun, "overrides": {"seed": 0, "rl.lr": 1e-4}})[0]
  committed = tmp_path / "steprs.json"
  committed.write_text(json.dumps({"study": "steprs", "runs": [recorded]}))
  _write(tmp_path / "dir", "steprs", rerun)
  got = reuse.reuse_runs(str(tmp_path / "dir"), "steprs", ["a"], 1, [str(committed)])
  assert got["identical"] == ["seed 0 a"] and got["differing"] == []
  assert got["added"] == ["malformed_fraction", "test_malformed_fraction"]
  assert ("the reruns also log malformed_fraction, test_malformed_fraction, which the records"
          " predate") in got["line"]


def test_a_rerun_of_a_run_with_a_skipped_nan_step_matches_its_record(tmp_path):
  """A skipped non-finite update records NaN (its loss and grad norm; the committed
  docs/results/baselines.json.gz has such GRPO runs): the bit-for-bit rerun records NaN
  again, which is a match (NaN == NaN is False: it was counted as differing)."""
  recorded = _run(0, "a", float("nan"))
  committed = tmp_path / "steprs.json.gz"
  with gzip.open(committed, "wt") as fh:
    json.dump({"study": "steprs", "runs": [recorded]}, fh)
  _write(tmp_path / "dir", "steprs", {**recorded, "wall_seconds": 1.0})  # the rerun
  got = reuse.reuse_runs(str(tmp_path / "dir"), "steprs", ["a"], 1, [str(committed)])
  assert got["identical"] == ["seed 0 a"] and got["differing"] == []
  assert not reuse.reproduces(recorded, {**recorded, "steps": [{"step": 1, "loss": 0.1}]})[0]


def test_a_file_of_no_study_run_is_an_error_before_anything_trains(tmp_path, monkeypatch):
  """``stability --reuse_from=<a steprs JSON>`` was skipped in silence (0 runs written) and
  the study trained every run it was meant to reuse; every file's problem is now said at
  once, before any run is written or trained."""
  from dllm_rl.study import runner, studies

  def no_training(*args, **kwargs):
    raise AssertionError("trained")

  monkeypatch.setattr(runner, "run_study", no_training)
  steprs = tmp_path / "steprs.json"
  steprs.write_text(json.dumps({"study": "steprs", "testbed": "arithmetic",
                                "runs": [_run(0, "a", 0.1)]}))
  chain = tmp_path / "stability.json"
  chain.write_text(json.dumps({"study": "stability", "testbed": "chain",
                               "runs": [_run(0, "grpo@lr7e-5", 0.1)]}))
  work = tmp_path / "dir"
  with pytest.raises(ConfigError) as info:
    studies.study(["stability"], str(work), 1, True, {}, str(work / "r.md"), "cmd",
                  arm_patterns=["grpo@lr7e-5"], reuse_from=[str(steprs), str(chain)])
  lines = str(info.value).splitlines()
  assert lines[0] == (f"--reuse_from: {steprs} records steprs runs; this invocation runs"
                      " stability (leave the file out, or run steprs)")
  assert lines[1].startswith(f"--reuse_from: {chain} records stability runs on testbed 'chain'")
  assert not work.exists()  # DIR not claimed for the testbed: the rerun the error asks for
  monkeypatch.setattr(runner, "check_sft_starts", no_training)  # --testbed=chain gets past it
  with pytest.raises(AssertionError, match="trained"):
    studies.study(["stability"], str(work), 1, True, {}, str(work / "r.md"), "cmd",
                  reuse_from=[str(chain)], testbed="chain")


def test_a_file_of_a_study_that_arms_skips_is_no_error(tmp_path, monkeypatch):
  """``study stability,steprs --arms=<stability arms only> --reuse_from=<both studies' files>``
  (the committed report's files, as docs/study.md passes them): --arms skips steprs, and its
  file was then refused as "of a study not run", though the command names that study and
  nothing was meant to be reused from it."""
  from dllm_rl.study import runner, studies

  def past_the_checks(*args, **kwargs):
    raise AssertionError("past the checks")

  monkeypatch.setattr(runner, "check_sft_starts", past_the_checks)
  files = []
  for name, arm in (("stability", "grpo@lr7e-5"), ("steprs", "centered")):
    files.append(tmp_path / f"{name}.json")
    files[-1].write_text(json.dumps({"study": name, "testbed": "arithmetic",
                                     "runs": [_run(0, arm, 0.1)]}))
  work = tmp_path / "dir"
  with pytest.raises(AssertionError, match="past the checks"):
    studies.study(["stability", "steprs"], str(work), 1, True, {}, str(work / "r.md"), "cmd",
                  arm_patterns=["grpo@lr7e-5"], reuse_from=[str(f) for f in files])
