"""The study command's own flags are checked before anything trains: each bad one is one
``error: --flag: ...`` line and exit status 2, nothing written (dllm_rl/study/arguments.py)."""

import os
import subprocess
import sys

import pytest

from dllm_rl.errors import ConfigError
from dllm_rl.study.arguments import argument_problems
from dllm_rl.study.studies import study

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _study_cli(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "dllm_rl.study", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))


def test_counts_below_one_and_negative_seeds_name_their_flags():
  """0 is not "unset" (``--seeds=0`` ran the default 5 seeds, ``--rl_steps=0`` 200 steps) and
  a negative count is no study: each names its flag, not a config key."""
  assert argument_problems(seeds=1, rl_steps=1, eval_every=1) == []
  assert argument_problems() == []  # None: the defaults
  got = [str(e) for e in argument_problems(seeds=0, rl_steps=-3, eval_every=0, first_seed=-1,
                                           sft_seed=-2)]
  assert got == ["--seeds: must be at least 1, got 0", "--rl_steps: must be at least 1, got -3",
                 "--eval_every: must be at least 1, got 0",
                 "--first_seed: must be at least 0, got -1",
                 "--sft_seed: must be at least 0, got -2"]


@pytest.mark.parametrize("seeds,kwargs,flag", [
    (0, {}, "--seeds"), (-1, {}, "--seeds"), (1, {"rl_steps": 0}, "--rl_steps"),
    (1, {"eval_every": 0}, "--eval_every")])
def test_the_library_call_refuses_them_before_anything_is_written(seeds, kwargs, flag, tmp_path):
  with pytest.raises(ConfigError, match=f"^{flag}: must be at least 1"):
    study(["stability"], str(tmp_path / "w"), seeds, True, {}, str(tmp_path / "r.md"), "test",
          **kwargs)
  assert not (tmp_path / "w").exists()


def test_the_command_line_says_every_bad_count_in_one_line_each(tmp_path):
  proc = _study_cli("stability", "--arms=grpo@*", "--seeds=0", "--rl_steps=-3",
                    "--eval_every=0", "--first_seed=-1", f"--workdir={tmp_path / 'w'}")
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.splitlines() == [
      "error: --seeds: must be at least 1, got 0", "error: --rl_steps: must be at least 1, got -3",
      "error: --eval_every: must be at least 1, got 0",
      "error: --first_seed: must be at least 0, got -1"]
  assert not (tmp_path / "w").exists()


def test_an_empty_list_flag_is_refused_not_read_as_left_out(tmp_path):
  """``--arms=`` (``--arms=$ARMS`` with ARMS unset) parsed to [] and ran every arm of the full
  study; ``--reuse_from=`` reused nothing and trained every run."""
  assert argument_problems(arms=None, reuse_from=None) == []
  assert [str(e) for e in argument_problems(arms=[], reuse_from=[])] == [
      "--arms: is empty; leave the flag out for its default",
      "--reuse_from: is empty; leave the flag out for its default"]
  with pytest.raises(ConfigError, match=r"^--arms: is empty"):
    study(["stability"], str(tmp_path / "w"), 1, True, {}, str(tmp_path / "r.md"), "test",
          arm_patterns=[])
  assert not (tmp_path / "w").exists()
  proc = _study_cli("stability", "--arms=", f"--workdir={tmp_path / 'w'}")
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.splitlines() == ["error: --arms: is empty; leave the flag out for its"
                                      " default"]
  assert not (tmp_path / "w").exists()


def test_a_results_path_that_cannot_be_written_is_refused_up_front(tmp_path):
  """--results was first opened after the whole study trained: a folder, a path under a file
  or a plots folder that is a file failed then with a raw OSError (and a folder got the JSON
  and plots written into it)."""
  from dllm_rl.study.arguments import results_problem
  (tmp_path / "a_file").write_text("")
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "report").write_text("")  # where report.md's plots would go
  assert results_problem(str(tmp_path / "new" / "deeper" / "results.md")) is None  # made later
  assert results_problem(str(tmp_path / "docs" / "results.md")) is None
  assert "is a folder; give the markdown file to write" in results_problem(str(tmp_path / "docs"))
  assert "is a folder" in results_problem(str(tmp_path / "not_yet") + os.sep)
  assert results_problem(str(tmp_path / "a_file" / "results.md")) == (
      f"{tmp_path / 'a_file'} is a file, not a folder")
  assert results_problem(str(tmp_path / "a_file" / "sub" / "r.md")) == (
      f"{tmp_path / 'a_file'} is a file, so {tmp_path / 'a_file' / 'sub'} cannot be made under it")
  assert "the folder of its plots and study JSON, is a file" in results_problem(
      str(tmp_path / "docs" / "report.md"))
  with pytest.raises(ConfigError, match=r"^--results: .* is a folder"):
    study(["stability"], str(tmp_path / "w"), 1, True, {}, str(tmp_path / "docs"), "test")
  assert not (tmp_path / "w").exists()
  proc = _study_cli("stability", f"--workdir={tmp_path / 'w'}",
                    f"--results={tmp_path / 'a_file' / 'results.md'}")
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.splitlines() == [
      f"error: --results: {tmp_path / 'a_file'} is a file, not a folder"]
  assert not (tmp_path / "w").exists()


def test_a_workdir_that_is_a_file_is_refused_up_front(tmp_path):
  """A study --workdir that is a file (or under one) was a raw FileExistsError; it is one
  line naming the flag, as the main CLI's --workdir (dllm_rl.train.context). The default
  --results inside it is not reported a second time."""
  from dllm_rl.study.arguments import folder_problem
  (tmp_path / "a_file").write_text("")
  assert folder_problem(str(tmp_path)) is None
  assert folder_problem(str(tmp_path / "new" / "w")) is None
  assert (folder_problem(str(tmp_path / "a_file"))
          == f"{tmp_path / 'a_file'} is a file, not a folder")
  with pytest.raises(ConfigError, match=r"^--workdir: .*a_file is a file, not a folder$"):
    study(["stability"], str(tmp_path / "a_file"), 1, True, {},
          str(tmp_path / "a_file" / "results.md"), "test")
  for workdir in (tmp_path / "a_file", tmp_path / "a_file" / "w"):
    proc = _study_cli("stability", f"--workdir={workdir}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.splitlines()) == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"error: --workdir: {tmp_path / 'a_file'} is a file"), (
        proc.stderr)
  assert (tmp_path / "a_file").read_text() == ""


def test_a_broken_run_record_is_an_error_naming_the_file(tmp_path):
  """A truncated run.json or SFT summary.json made every rerun fail with a raw
  JSONDecodeError that named no file; it is a ConfigError naming the file and the folder to
  delete to rerun that run."""
  import json

  from dllm_rl.study import arms as arms_lib
  from dllm_rl.study.runner import check_finished_runs, train_sft
  arm = arms_lib.Arm("grpo", {"rl.loss": "grpo"}, "test")
  run_dir = tmp_path / "stability" / "seed0" / "grpo"
  run_dir.mkdir(parents=True)
  (run_dir / "run.json").write_text('{"overrides": {"rl.lo')  # cut short
  with pytest.raises(ConfigError, match=rf"^--workdir: {run_dir / 'run.json'} is not a readable"
                     rf" record \(JSONDecodeError: .*\); delete {run_dir} to rerun that run$"):
    check_finished_runs("stability", [arm], str(tmp_path), 1, arms_lib.Size(2, 1, 1), {})
  sft = tmp_path / "sft" / "seed0"
  sft.mkdir(parents=True)
  (sft / "summary.json").write_text('{"mode": "sf')
  with pytest.raises(ConfigError, match=rf"{sft / 'summary.json'} is not a readable record"):
    train_sft(0, str(sft), {})
  (sft / "summary.json").write_text(json.dumps({"mode": "sft"}))
  assert train_sft(0, str(sft), {}) == {"mode": "sft"}


def test_a_finished_arm_writes_its_run_record_whole(tmp_path, monkeypatch):
  """run.json goes through paths.write_atomic (a temporary file, then a rename): a study
  stopped while writing it leaves no half record."""
  from dllm_rl import paths
  from dllm_rl.study import arms as arms_lib
  from dllm_rl.study import runner
  written = []
  real = paths.write_atomic
  monkeypatch.setattr(paths, "write_atomic", lambda p, t: (written.append(p), real(p, t)))
  monkeypatch.setattr(runner, "copy_sft_start", lambda *a: None)
  monkeypatch.setattr(runner, "_run", lambda *a, **k: {"rl_accuracy": 0.5})
  monkeypatch.setattr(runner, "step_records", lambda path: ([], [], {}))
  arm = arms_lib.Arm("grpo", {"rl.loss": "grpo"}, "test")
  (tmp_path / "arm").mkdir()  # made by the run (_run)
  rec = runner.run_arm(arm, 0, str(tmp_path / "sft"), str(tmp_path / "arm"),
                       arms_lib.Size(2, 1, 1), {}, {})
  assert written == [str(tmp_path / "arm" / "run.json")]
  assert runner.read_record(written[0])["summary"] == rec["summary"]


def test_a_diverged_arm_stops_the_study_naming_the_arm_and_how_to_go_on(tmp_path, monkeypatch):
  from dllm_rl.study import arms as arms_lib
  from dllm_rl.study import runner
  from dllm_rl.train.resilience import NonFiniteError

  def diverges(*_, **__):
    raise NonFiniteError("rl step 7: 10 consecutive updates with a non-finite loss")
  monkeypatch.setattr(runner, "copy_sft_start", lambda *a: None)
  monkeypatch.setattr(runner, "_run", diverges)
  with pytest.raises(NonFiniteError, match=r"^arm grpo seed 3 diverged \(rl step 7: .*runs are"
                                           r" kept: rerun the same command with --arms"):
    runner.run_arm(arms_lib.Arm("grpo", {"rl.loss": "grpo"}, "test"), 3, str(tmp_path / "sft"),
                   str(tmp_path / "arm"), arms_lib.Size(2, 1, 1), {}, {})
  assert not (tmp_path / "arm" / "run.json").exists()  # no record: a rerun trains it again


def test_a_study_the_arms_leave_empty_is_skipped_with_a_note(tmp_path, monkeypatch, capsys):
  """``all --arms=centered`` left stability with no arm: it trained its SFT start, then its
  plot failed (matplotlib: 0 rows). A study with no chosen arm is skipped up front, said."""
  from dllm_rl.config.defaults import get_config
  from dllm_rl.study import runner
  from dllm_rl.study.studies import chosen_arms
  chosen, empty = chosen_arms(["stability", "steprs"], get_config(), ["centered"])
  assert list(chosen) == ["steprs"] and [a.name for a in chosen["steprs"]] == ["centered"]
  assert empty == ["stability"]
  ran = []

  def fake_run_study(name, arms, *args, **kwargs):
    ran.append((name, [a.name for a in arms]))
    raise KeyboardInterrupt  # stop there: nothing trains in this test

  monkeypatch.setattr(runner, "run_study", fake_run_study)
  with pytest.raises(KeyboardInterrupt):
    study(["stability", "steprs"], str(tmp_path / "w"), 1, True, {}, str(tmp_path / "r.md"),
          "test", arm_patterns=["centered"])
  assert ran == [("steprs", ["centered"])]
  assert "note: --arms=centered selects no arm of stability: that study is skipped" in (
      capsys.readouterr().err)


@pytest.mark.parametrize("flag,line", [
    ("--testbed=nope", "error: --testbed: unknown testbed 'nope'; available: arithmetic,"),
    ("--scale=tpu", "error: --scale: 'tpu' is not cpu or gpu"),
    ("--arms=nope*", "error: --arms: 'nope*' matches no arm of stability; arms: grpo@")])
def test_an_unknown_testbed_or_arm_pattern_is_one_error_line(flag, line, tmp_path):
  """They printed ~68 lines of usage text, then the message without ``error:``."""
  proc = _study_cli("stability", f"--workdir={tmp_path / 'w'}", flag)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith(line), proc.stderr
  assert not (tmp_path / "w").exists()


def test_a_run_shorter_than_the_validation_interval_is_a_warning_before_anything_trains(
    tmp_path, monkeypatch, capsys):
  """``--rl_steps=3`` under the testbed's 20-step validation: no arm validates after step 0,
  so collapse cannot be judged; the study said nothing and reported every arm "not
  collapsed". Now a warning naming both flags and their values comes before any run."""
  from dllm_rl.study import runner

  def fake_run_study(*args, **kwargs):
    raise KeyboardInterrupt  # stop there: nothing trains in this test
  monkeypatch.setattr(runner, "run_study", fake_run_study)
  with pytest.raises(KeyboardInterrupt):
    study(["steprs"], str(tmp_path / "w"), 1, False, {}, str(tmp_path / "r.md"), "test",
          rl_steps=3, arm_patterns=["centered"])
  err = capsys.readouterr().err
  assert ("warning: --rl_steps=3 is below --eval_every=20 (the testbed arithmetic's default):"
          " validation runs at step 0 and every 20 steps, so no arm validates after step 0"
          in err), err
  with pytest.raises(KeyboardInterrupt):  # validation at step 5: no warning
    study(["steprs"], str(tmp_path / "w"), 1, False, {}, str(tmp_path / "r.md"), "test",
          rl_steps=5, eval_every=5, arm_patterns=["centered"])
  assert "warning" not in capsys.readouterr().err


def test_the_short_run_warning_names_where_each_value_came_from():
  from dllm_rl.config import testbeds
  from dllm_rl.study import arms as arms_lib
  from dllm_rl.study.studies import short_run_warning
  got = short_run_warning(arms_lib.Size(10, 20, 1), None, 20, "chain", True)
  assert got.startswith("warning: --rl_steps=10 (the testbed chain's --quick default) is below"
                        " --eval_every=20: ")
  assert got.endswith("Give --rl_steps of at least 20 or --eval_every of at most 10 to judge"
                      " collapse.")
  assert short_run_warning(arms_lib.Size(20, 20, 1), 20, 20, "chain", False) is None
  for name in testbeds.TESTBEDS.names():  # --quick and the full sizes validate after step 0
    for quick in (True, False):
      assert short_run_warning(arms_lib.size(name, quick), None, None, name, quick) is None
