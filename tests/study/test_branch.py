"""``python -m dllm_rl.study.branch``: a study run replayed to a step (checked against its
records), then branches from there under other settings; the recorded settings' branch
reproduces the run. Here its inputs, checks and summaries; the branches of a real study arm
are trained in tests/study/test_quick_study.py (on the quick study that module runs once)."""

import json
import os
import re
import shutil

import pytest

from dllm_rl.config import testbeds
from dllm_rl.errors import ConfigError
from dllm_rl.study import branch


def test_variants_parse_as_config_overrides_and_bad_ones_are_named():
  name, pairs = branch.parse_variant("half:rl.lr=1e-4,rl.grad_clip=1,rl.loss=grpo")
  assert name == "half" and pairs == [("rl.lr", "1e-4"), ("rl.grad_clip", "1"),
                                      ("rl.loss", "grpo")]
  base = testbeds.testbed("sum_split").get_config()
  got = branch.typed_variant(base, pairs)
  assert got == {"rl.lr": 1e-4, "rl.grad_clip": 1.0, "rl.loss": "grpo"}
  assert isinstance(got["rl.grad_clip"], float)  # the key's type, not the text's
  for bad in ("nolr", ":rl.lr=1", "x:", "x:rl.lr", "as_run:rl.lr=1", "a/b:rl.lr=1"):
    with pytest.raises(ConfigError, match="variant"):
      branch.parse_variant(bad)
  with pytest.raises(ConfigError) as err:  # every problem at once, with the key's name
    branch.typed_variant(base, [("rl.lrr", "1"), ("rl.lr", "fast")])
  assert "rl.lrr: unknown key; did you mean rl.lr?" in str(err.value)
  assert "config.rl.lr: expected float, got 'fast'" in str(err.value)
  recorded = {"rl.lr": 2e-4, "rl.kl_coef": 0.0, "checkpoint.save_every": 1000}
  got = branch.branch_overrides(recorded, 100, {"rl.lr": 1e-4})
  assert got["rl.lr"] == 1e-4 and got["checkpoint.save_every"] == 100
  assert branch.branch_overrides(recorded, 100, {"rl.kl_coef": 0.04})["rl.kl_coef"] == 0.04


def test_first_difference_and_the_summary_of_a_branch():
  run = [{"step": s, "reward_mean": 0.5, "loss": 0.1 * s} for s in range(1, 6)]
  same = [dict(r, malformed_fraction=0.0) for r in run]  # a metric the run lacks: not compared
  assert branch.first_difference(same, run, 5) is None
  other = [dict(r, loss=9.0) if r["step"] == 4 else r for r in run]
  assert branch.first_difference(other, run, 3) is None
  assert branch.first_difference(other, run, 5).startswith("step 4, loss: 9.0 against 0.4")
  assert "missing" in branch.first_difference(run[:2], run, 5)
  # accuracy 0.4 until step 14, then every rollout wrong with no gradient to step 40
  records = [{"step": s, "accuracy": 0.0 if s >= 15 else 0.4,
              "grad_norm": 0.0 if s >= 15 else 1.0} for s in range(1, 41)]
  got = branch.summarise(records, [{"step": 40, "val_accuracy": 0.0}], 10, 40)
  assert got["steps"] == 30 and got["all_wrong_from"] == 15 and got["val_accuracy"] == 0.0
  assert got["accuracy"] == pytest.approx(0.4 * 4 / 30) and got["lowest_window_accuracy"] == 0
  assert branch.summarise(records, [], 0, 10)["all_wrong_from"] is None


def _arm(tmp_path, steps=6, recorded=None, testbed="sum_split"):
  """A finished study arm's folder as far as branch reads it before training (no weights):
  DIR/testbed.txt, and in DIR/steprs/seed0/centered run.json (``recorded`` steps of its
  ``steps``), the SFT start's folder and metrics.jsonl; returns the arm's folder."""
  study_dir = tmp_path / "study"
  arm = study_dir / "steprs" / "seed0" / "centered"
  (arm / "checkpoints" / "sft").mkdir(parents=True)
  (study_dir / "testbed.txt").write_text(testbed + "\n")
  (arm / "metrics.jsonl").write_text("")
  records = [{"step": s} for s in range(1, (steps if recorded is None else recorded) + 1)]
  (arm / "run.json").write_text(json.dumps({"overrides": {"rl.steps": steps}, "steps": records}))
  return str(arm)


def _problems(run_dir, out, at, until, names=()):
  """The messages of every problem branch finds before anything trains."""
  with pytest.raises(ConfigError) as err:
    branch.branch(run_dir, out, at, until, [(name, []) for name in names])
  return [str(e) for e in getattr(err.value, "errors", [err.value])]


@pytest.fixture
def no_training(monkeypatch):
  """Copying the SFT start or training fails the test: the checks come first."""
  def trained(*_):
    raise AssertionError("trained past a bad input")
  monkeypatch.setattr(branch, "copy_sft_start", trained)
  monkeypatch.setattr(branch, "train_until", trained)


def test_a_variant_may_not_take_a_name_out_uses_or_another_variants():
  for name in ("replay", "source.json", "branches.json", "branches.md", ".", "..", "Replay"):
    with pytest.raises(ConfigError, match=f"--variant: '{re.escape(name)}' is taken in OUT"):
      branch.parse_variant(f"{name}:rl.lr=1e-4")  # replay: wiped after the as_run branch
  got = [str(e) for e in branch.name_errors(["a", "b", "a", "B", "as_run", "a/b", "c"])]
  assert got == ["--variant: 'a' names two variants (case aside): each trains in its own"
                 " folder OUT/NAME",
                 "--variant: 'B' names two variants (case aside): each trains in its own"
                 " folder OUT/NAME",
                 "--variant: 'as_run' is taken in OUT (the recorded settings' branch): name"
                 " it otherwise",
                 "--variant: 'a/b': a NAME of letters, digits and _.@+-"]


def test_bad_steps_and_names_are_all_named_before_anything_trains(tmp_path, no_training):
  run_dir, out = _arm(tmp_path), str(tmp_path / "out")
  assert branch.check_inputs(run_dir, out, 3, 6, ["a", "b"]) == ("sum_split", {"rl.steps": 6})
  assert _problems(run_dir, out, 0, 9, ["a", "a", "replay"]) == [
      "--at: the branch point must be a step >= 1, got 0",
      "--variant: 'a' names two variants (case aside): each trains in its own folder"
      " OUT/NAME",
      "--variant: 'replay' is taken in OUT (the replay's folder): name it otherwise",
      f"--until: 9 is past the run's 6 steps (rl.steps in {run_dir}/run.json)"]
  assert _problems(run_dir, out, 4, 4) == ["--until: 4 must be past --at=4"]
  assert _problems(run_dir, out, 5, 2) == ["--until: 2 must be past --at=5"]
  assert _problems(run_dir, out, -3, -1) == [
      "--at: the branch point must be a step >= 1, got -3",
      "--until: must be a step >= 1, got -1"]
  short = _arm(tmp_path / "short", recorded=3)  # rl.steps 6, records to step 3
  assert _problems(short, out, 4, 6) == [
      f"--at: 4 is past the run's last recorded step (3, {short}/run.json): the"
      " replay is checked against its records"]
  assert not os.path.exists(out)  # nothing was claimed or written


def test_a_run_dir_that_is_not_a_study_arm_is_named_before_anything_trains(tmp_path,
                                                                           no_training):
  run_dir, out = _arm(tmp_path), str(tmp_path / "out")
  path = os.path.join(run_dir, "run.json")
  with open(path, "w") as fh:
    fh.write('{"overrides": ')  # cut off mid-write
  shutil.rmtree(os.path.join(run_dir, "checkpoints"))
  os.remove(os.path.join(run_dir, "metrics.jsonl"))
  got = _problems(run_dir, out, 3, 6)  # every missing or broken file at once
  assert got[0].startswith(f"RUN_DIR: {path} is not a study run's record: Expecting")
  assert got[1:] == [
      f"RUN_DIR: {run_dir}/checkpoints/sft does not exist: the run's SFT start, which"
      " each branch copies",
      f"RUN_DIR: {run_dir}/metrics.jsonl does not exist: the run's per-step records,"
      " which the replay is checked against"]
  with open(path, "w") as fh:
    json.dump({"steps": []}, fh)
  assert _problems(run_dir, out, 3, 6)[0] == (
      f"RUN_DIR: {path} is not a study run's record: no 'overrides' in it")
  missing = str(tmp_path / "nowhere")
  assert _problems(missing, out, 3, 6) == [
      f"RUN_DIR: {missing} is not a folder: not a study run (DIR/<study>/seed<S>/<arm>)"]
  seed_dir = os.path.dirname(_arm(tmp_path / "b"))  # DIR/steprs/seed0: a folder, no run.json
  assert _problems(seed_dir, out, 3, 6) == [
      f"RUN_DIR: {seed_dir}/run.json does not exist: not a finished study run"]
  odd = _arm(tmp_path / "c", testbed="sum_spilt")
  assert "testbed.txt: unknown testbed 'sum_spilt'" in _problems(odd, out, 3, 6)[0]
  os.remove(tmp_path / "c" / "study" / "testbed.txt")
  assert _problems(odd, out, 3, 6) == [
      f"RUN_DIR: {odd} is not in a study DIR (no testbed.txt above it)"]


def test_an_out_that_overlaps_the_run_or_holds_other_branches_is_refused(tmp_path,
                                                                         no_training):
  run_dir = _arm(tmp_path)
  study_dir = str(tmp_path / "study")
  for out in (run_dir, os.path.join(run_dir, "b"), study_dir):  # OUT/steprs: the whole study
    assert _problems(run_dir, out, 3, 6) == [
        f"--out: {out} overlaps RUN_DIR {run_dir}: use a folder outside it (a branch"
        " wipes its folder OUT/NAME before it trains)"]
  (tmp_path / "file").write_text("")
  assert _problems(run_dir, str(tmp_path / "file"), 3, 6) == [
      f"--out: '{tmp_path}/file' is not a folder"]
  out = tmp_path / "out"
  out.mkdir()
  (out / "source.json").write_text("[")
  assert _problems(run_dir, str(out), 3, 6)[0].startswith(
      f"--out: {out}/source.json is not a record of the run and step OUT branches")
  (out / "source.json").write_text(json.dumps({"run_dir": "/elsewhere", "at": 3}))
  assert _problems(run_dir, str(out), 3, 6) == [
      f"--out: {out} holds the branches of /elsewhere at step 3: use another --out"]


def test_the_cli_names_every_bad_input_and_exits_2(tmp_path, capsys, no_training):
  run_dir, out = _arm(tmp_path), str(tmp_path / "out")
  os.remove(os.path.join(run_dir, "metrics.jsonl"))
  assert branch.main([run_dir, f"--out={out}", "--at=3", "--until=6", "--variant=replay:rl.lr=1",
                      "--variant=x", "--variant=ok:rl.lr=1e-4"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: --variant: 'replay' is taken in OUT")
  assert "\nerror: --variant: 'x' is not NAME:KEY=VALUE" in err
  assert f"\nerror: RUN_DIR: {run_dir}/metrics.jsonl does not exist" in err  # with them
  assert branch.main([run_dir, f"--out={out}", "--at=7", "--until=6", "--variant=a:rl.lr=1e-4",
                      "--variant=a:rl.lr=2e-4"]) == 2
  err = capsys.readouterr().err.splitlines()
  assert err == ["error: --until: 6 must be past --at=7",
                 "error: --variant: 'a' names two variants (case aside): each trains in its own"
                 " folder OUT/NAME",
                 f"error: RUN_DIR: {run_dir}/metrics.jsonl does not exist: the run's per-step"
                 " records, which the replay is checked against",
                 f"error: --at: 7 is past the run's last recorded step (6, {run_dir}/run.json):"
                 " the replay is checked against its records"]



def test_help_says_what_each_flag_takes(capsys):
  with pytest.raises(SystemExit) as exit_:
    branch.main(["--help"])
  assert exit_.value.code == 0
  out = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
  for text in ("RUN_DIR", "--at STEP", "--until STEP", "NAME:KEY=VALUE[,KEY=VALUE...]",
               "half_lr:rl.lr=1e-4"):
    assert text in out
