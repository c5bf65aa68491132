"""The study's arms, sizes and checks before anything runs, and its record keeping (reuse,
resumption, statistics), on constructed runs; the tiny size (:data:`TINY`) and the quick arm
selection (:data:`QUICK_ARMS`) that tests/study/test_quick_study.py runs end to end."""

import json
import os
import shutil

import pytest

from dllm_rl.config.cli import typed_overrides
from dllm_rl.config.defaults import get_config
from dllm_rl.study import arms as arms_lib
from dllm_rl.study.studies import study
from tests.helpers import TINY_MODEL

TINY = {**TINY_MODEL, **typed_overrides(get_config(), [tuple(s.split("=")) for s in [
    "task.train_size=256",
    "task.val_size=16", "task.test_size=16", "data.batch_size=32", "sft.steps=4",
    "sft.warmup_steps=0", "rl.warmup_steps=0", "sft.eval_every=2", "sft.target_accuracy=0.0",
    "rl.batch_prompts=2", "rl.group_size=4", "eval.batch_size=64", "mesh.data=2"]])}


def test_overrides_are_typed_like_the_default():
  got = typed_overrides(get_config(), [("rl.lr", "1e-3"), ("rl.steps", "7"),
                                       ("rl.self_normalize", "False"), ("eval.pass_k", "1,4")])
  assert got == {"rl.lr": 1e-3, "rl.steps": 7, "rl.self_normalize": False,
                 "eval.pass_k": (1, 4)}
  assert type(got["rl.lr"]) is float and type(got["rl.steps"]) is int


# Every arm of every study validates (run_study checks each before anything runs); end to
# end (tests/study/test_quick_study.py), one arm of each kind runs (each arm is a few
# compiles: the fewest that cover one verdict pair, a stress-test arm and the calibrated β,
# which brings in the steprs arm it calibrates from).
_LOW, _DEFAULT, _HIGH = (arms_lib.lr_tag(lr) for lr in arms_lib.lr_grid(get_config()))
QUICK_ARMS = [f"grpo@{_DEFAULT}", f"stabledrl@{_DEFAULT}", f"stabledrl_elbo1@{_HIGH}",
              "steprs_calibrated"]


@pytest.mark.parametrize("name", arms_lib.STUDIES.names())
def test_every_arm_of_every_study_is_a_valid_config(name):
  """Each arm's overrides of the embedded default pass validation (registry names and
  combinations), before any study runs; the baselines study has one arm per algorithm."""
  from dllm_rl.study.runner import make_config
  from dllm_rl.train.validate import validate
  arms = arms_lib.STUDIES.get(name)(get_config())
  for arm in arms:
    validate(make_config({**TINY, "mode": "rl", **arm.overrides}))
  if name == "baselines":
    assert [a.name for a in arms] == ["grpo", "stabledrl", "wd1", "espo", "coupled_grpo",
                                      "trajectory"]
    assert {make_config(a.overrides).rl.loss for a in arms} == {
        "grpo", "stabledrl", "wd1", "espo", "grpo_token"}


def test_arm_patterns_select_and_name_what_matches_nothing():
  assert arms_lib.unmatched(["stability", "steprs"], QUICK_ARMS) is None
  assert "'nope*' matches no arm" in arms_lib.unmatched(["steprs"], ["centered", "nope*"])
  stability = arms_lib.STUDIES.get("stability")(get_config())
  assert [a.name for a in arms_lib.select(stability, ["grpo@*"])] == [
      f"grpo@{_LOW}", f"grpo@{_DEFAULT}", f"grpo@{_HIGH}"]
  steprs = arms_lib.STUDIES.get("steprs")(get_config())  # the arm calibrated β comes from
  assert [a.name for a in arms_lib.select(steprs, ["*_calibrated"])] == [
      "steprs", "steprs_calibrated"]


def test_a_finished_run_is_reused_only_with_the_settings_it_ran_with(tmp_path):
  from dllm_rl.config import ConfigError
  from dllm_rl.study.runner import arm_run_overrides, check_finished_runs, check_reusable
  size = arms_lib.Size(rl_steps=20, eval_every=10, seeds=1)
  arm = arms_lib.Arm("steprs_calibrated", {"rl.advantage": "steprs"}, "test",
                     calibrate_from="steprs")
  ran = arm_run_overrides(0, size, {"rl.group_size": 4}, {**arm.overrides, "rl.beta_end": 0.7})
  run_dir = tmp_path / "steprs" / "seed0" / "steprs_calibrated"
  run_dir.mkdir(parents=True)
  (run_dir / "run.json").write_text(json.dumps({"overrides": ran}))
  check_finished_runs("steprs", [arm], str(tmp_path), 1, size, {"rl.group_size": 4})
  # a key the run did not set counts at the base config's value, either way round
  default_group = get_config().rl.group_size
  check_reusable("p", {"rl.lr": 1e-3}, {"rl.lr": 1e-3, "rl.group_size": default_group})
  with pytest.raises(ConfigError, match=rf"rl\.group_size: ran with {default_group}, this"
                     r" study sets 3"):
    check_reusable("p", {"rl.lr": 1e-3}, {"rl.lr": 1e-3, "rl.group_size": 3})
  with pytest.raises(ConfigError, match=r"rl\.group_size: ran with 4, this study sets 8"):
    check_finished_runs("steprs", [arm], str(tmp_path), 1, size, {"rl.group_size": 8})
  with pytest.raises(ConfigError, match=r"rl\.steps: ran with 20, this study sets 200"):
    check_finished_runs("steprs", [arm], str(tmp_path), 1,
                        arms_lib.Size(rl_steps=200, eval_every=10, seeds=1), {"rl.group_size": 4})
  # the calibrated β_end is compared once it is known (run_arm), not before
  with pytest.raises(ConfigError, match=r"rl\.beta_end: ran with 0\.7, this study sets 0\.9"):
    check_reusable("p", ran, {**ran, "rl.beta_end": 0.9})


def test_a_finished_sft_start_is_reused_only_with_the_settings_it_was_trained_with(tmp_path):
  """check_sft_starts: the SFT start in DIR (its config_sft.json) against this study's SFT
  config, on the keys that make a start (model, task, data, sft, sampler, eval, ...): another
  value is a ConfigError naming the key; RL-only overrides and keys only one side has are
  not compared."""
  from dllm_rl.config import ConfigError
  from dllm_rl.study.runner import check_sft_starts, sft_config
  start = tmp_path / "sft" / "seed0"
  start.mkdir(parents=True)
  (start / "summary.json").write_text("{}")
  check_sft_starts(str(tmp_path), 2, {"sft.lr": 1e-3}, "arithmetic")  # no config recorded
  recorded = json.loads(sft_config(0, {"sft.lr": 1e-3}).to_json_best_effort())
  recorded["model"]["a_key_of_other_code"] = 1
  (start / "config_sft.json").write_text(json.dumps(recorded))
  check_sft_starts(str(tmp_path), 1, {"sft.lr": 1e-3, "rl.lr": 5e-5}, "arithmetic")
  with pytest.raises(ConfigError, match=r"sft/seed0 holds an SFT start trained with other"
                     r" settings \(sft\.lr: trained with 0\.001, this study sets 0\.002\)"):
    check_sft_starts(str(tmp_path), 1, {"sft.lr": 2e-3}, "arithmetic")
  # seed 1's start is its own on a testbed without a shared start; chain's seeds share seed 0's
  (tmp_path / "sft" / "seed1").mkdir()
  (tmp_path / "sft" / "seed1" / "summary.json").write_text("{}")
  (tmp_path / "sft" / "seed1" / "config_sft.json").write_text(json.dumps(recorded))
  with pytest.raises(ConfigError, match=r"seed1 holds an SFT start .*seed: trained with 0,"
                     r" this study sets 1"):
    check_sft_starts(str(tmp_path), 2, {"sft.lr": 1e-3}, "arithmetic")
  # a testbed whose seeds share one start: one start per DIR (the arms' folders do not say
  # which start they ran from)
  with pytest.raises(ConfigError, match=r"config\.sft_seed.*holds the SFT start sft/seed1.*"
                     r"the start of seed 0 needs its own --workdir"):
    check_sft_starts(str(tmp_path), 2, {"sft.lr": 1e-3}, "chain")
  import shutil
  shutil.rmtree(tmp_path / "sft" / "seed1")
  with pytest.raises(ConfigError, match=r"sft/seed0 holds .*data\.completion_len: trained with"
                     r" 8, this study sets 48"):
    check_sft_starts(str(tmp_path), 2, {"sft.lr": 1e-3}, "chain")
  with pytest.raises(ConfigError, match=r"holds the SFT start sft/seed0.*seed 3 needs its own"):
    check_sft_starts(str(tmp_path), 2, {"sft.lr": 1e-3}, "chain", sft_seed=3)
  # --sft_seed chooses the shared start; a testbed that trains one start per seed has none
  with pytest.raises(ConfigError, match=r"config\.sft_seed.*'arithmetic' trains one SFT start"
                     r" per seed.*: chain, "):
    check_sft_starts(str(tmp_path / "empty"), 2, {}, "arithmetic", sft_seed=1)
  check_sft_starts(str(tmp_path / "empty"), 2, {}, "chain", sft_seed=1)  # nothing trained yet


def test_a_bad_override_fails_naming_its_key_before_anything_runs(tmp_path):
  from dllm_rl.config import ConfigError
  from dllm_rl.study.runner import run_study
  with pytest.raises(ConfigError, match=r"config\.rl\.eps"):
    run_study("stability", arms_lib.STUDIES.get("stability")(get_config()), str(tmp_path), 1,
              arms_lib.QUICK, {"rl.eps": 2.0})
  assert not os.listdir(tmp_path)


def test_a_warmup_longer_than_the_study_arms_fails_before_the_sft_start(tmp_path):
  """The up-front check validates each arm's run config at the study's size (its rl.steps), so
  a warm-up that does not fit 2 RL steps is an error before any SFT start trains."""
  from dllm_rl.config import ConfigError
  from dllm_rl.study.runner import run_study
  with pytest.raises(ConfigError, match=r"config\.rl\.warmup_steps"):
    run_study("stability", arms_lib.STUDIES.get("stability")(get_config()), str(tmp_path), 1,
              arms_lib.Size(2, 1, 1), {"rl.warmup_steps": 50})
  assert not os.listdir(tmp_path)


def test_a_study_wide_override_every_arm_sets_is_refused_before_anything_runs(tmp_path):
  """--config.rl.lr moved no stability arm (each sets its own rl.lr from the base config), so
  it changed no run, silently: a ConfigError naming the key, nothing written. A key only some
  chosen arms set (estimator.antithetic is every stability arm's; rl.kl_coef only grpo_kl's)
  is an ordinary override."""
  from dllm_rl.errors import ConfigError
  from dllm_rl.study import arms as arms_lib
  workdir = tmp_path / "w"
  with pytest.raises(ConfigError, match=r"config.rl.lr: every arm of stability sets rl.lr"):
    study(["stability"], str(workdir), 1, True, {**TINY, "rl.lr": 6e-4}, str(tmp_path / "r.md"),
          "test")
  assert not workdir.exists()
  arms = arms_lib.STUDIES.get("stability")(get_config())
  assert [e.key for e in arms_lib.shadowed_overrides(
      "stability", arms, {"rl.lr": 1e-3, "rl.kl_coef": 0.1, "model.d_model": 32})] == ["rl.lr"]
  assert arms_lib.shadowed_overrides("stability", [], {"rl.lr": 1e-3}) == []  # none chosen
  # the study's own size: every run's length, said by the report from --rl_steps
  with pytest.raises(ConfigError, match=r"config.rl.steps: the study sets it for every run .*"
                                        r" use --rl_steps"):
    study(["stability"], str(workdir), 1, True, {**TINY, "rl.steps": 3}, str(tmp_path / "r.md"),
          "test")
  assert not workdir.exists()
  assert [e.key for e in arms_lib.sized_overrides(
      {"rl.eval_every": 2, "rl.lr": 1e-3, "rl.log_every": 5})] == ["rl.eval_every", "rl.log_every"]


def test_an_interrupted_run_with_other_settings_is_refused_before_anything_runs(tmp_path):
  """An arm interrupted mid-RL (checkpoints, no run.json) resumes on a rerun; with another
  --config override its record would state the new settings for steps that ran with the
  old: refused, naming the key, before anything trains."""
  from dllm_rl.errors import ConfigError
  from dllm_rl.study import runner
  arm = arms_lib.STUDIES.get("stability")(get_config())[0]
  size = arms_lib.Size(rl_steps=4, eval_every=2, seeds=1)
  run_dir = runner._arm_dir(str(tmp_path), "stability", 0, arm)
  os.makedirs(os.path.join(run_dir, "checkpoints", "rl", "2"))
  started = runner.make_config(runner.arm_run_overrides(0, size, TINY, arm.overrides))
  with open(os.path.join(run_dir, "config_rl.json"), "w") as fh:
    fh.write(started.to_json_best_effort(indent=2, sort_keys=True))
  runner.check_finished_runs("stability", [arm], str(tmp_path), 1, size, TINY)  # same: resumes
  with pytest.raises(ConfigError, match=r"^--workdir: .* holds an interrupted run with"
                                        r" other settings \(rl\.kl_coef: started with 0\.0, this"
                                        r" study sets 0\.1\)"):
    runner.check_finished_runs("stability", [arm], str(tmp_path), 1, size,
                               {**TINY, "rl.kl_coef": 0.1})


def test_an_arm_interrupted_inside_the_study_cache_resumes(tmp_path, monkeypatch):
  """A study stopped mid-arm (SIGTERM, exit 75) resumes on the same command: the arm's
  config_rl.json, written while the study's compilation cache was open (runner._run blanks
  the run's own compilation_cache), is not "other settings" (the rerun was refused)."""
  from dllm_rl.study import runner
  from dllm_rl.train import modes
  arm = arms_lib.STUDIES.get("stability")(get_config())[0]
  size = arms_lib.Size(rl_steps=4, eval_every=2, seeds=1)
  run_dir = runner._arm_dir(str(tmp_path), "stability", 0, arm)

  def stopped_run(config, workdir, quiet_unread=()):  # as modes.run writes it, then stopped
    with open(os.path.join(workdir, "config_rl.json"), "w") as fh:
      fh.write(config.to_json_best_effort(indent=2, sort_keys=True) + "\n")
    os.makedirs(os.path.join(workdir, "checkpoints", "rl", "2"))

  monkeypatch.setattr(modes, "run", stopped_run)
  with runner.compilation_cache(str(tmp_path / "jax_cache")):
    runner._run(runner.make_config(runner.arm_run_overrides(0, size, TINY, arm.overrides)),
                run_dir)
  runner.check_finished_runs("stability", [arm], str(tmp_path), 1, size, TINY)


def test_a_resumed_runs_wall_seconds_count_its_earlier_processes(tmp_path, monkeypatch):
  """An arm record's wall_seconds (summed into the report's compute) adds the RL phase's
  time before the resume (``rl_earlier_wall_seconds``) to this process's."""
  from dllm_rl.infra.observability import MetricsLogger
  from dllm_rl.study import runner
  arm = arms_lib.STUDIES.get("stability")(get_config())[0]
  size = arms_lib.Size(rl_steps=4, eval_every=2, seeds=1)

  def resumed_run(config, workdir, quiet_unread=()):  # the rest of an arm stopped at step 2
    with MetricsLogger(workdir, tensorboard=False) as logger:
      for step in (1, 2, 3, 4):
        logger.log(step, {"reward_mean": 0.5, "accuracy": 0.5}, phase="rl")
    return {"rl_accuracy": 0.5, "rl_wall_seconds": 1003.0, "rl_earlier_wall_seconds": 1000.0}

  monkeypatch.setattr(runner, "_run", resumed_run)
  monkeypatch.setattr(runner, "copy_sft_start", lambda *a: None)
  rec = runner.run_arm(arm, 0, str(tmp_path / "sft"), str(tmp_path / "arm"), size, TINY, {})
  assert 1000.0 < rec["wall_seconds"] < 1000.0 + 60
  # the SFT start: trained now or read from its summary.json, the same figure
  summary = {"sft_accuracy": 0.3, "wall_seconds": 5.0, "sft_earlier_wall_seconds": 200.0}
  monkeypatch.setattr(runner, "_run", lambda config, workdir: summary)
  assert runner.train_sft(0, str(tmp_path / "sft"), TINY)["wall_seconds"] == 205.0
  os.makedirs(tmp_path / "sft")
  with open(tmp_path / "sft" / "summary.json", "w") as fh:
    json.dump(summary, fh)
  monkeypatch.setattr(runner, "check_sft_reusable", lambda *a: None)
  assert runner.train_sft(0, str(tmp_path / "sft"), TINY)["wall_seconds"] == 205.0


def test_an_interrupted_sft_start_with_other_settings_is_refused(tmp_path):
  """An SFT start interrupted mid-warm-up (checkpoints, no summary.json) resumes on a rerun:
  with another sft.* override it is refused like a finished one."""
  from dllm_rl.errors import ConfigError
  from dllm_rl.study import runner
  folder = runner.sft_start_dir(str(tmp_path), 0, False)
  os.makedirs(os.path.join(folder, "checkpoints", "sft", "2"))
  with open(os.path.join(folder, "config_sft.json"), "w") as fh:
    fh.write(runner.sft_config(0, TINY).to_json_best_effort())
  runner.check_sft_starts(str(tmp_path), 1, TINY, "arithmetic")  # the same settings: resumes
  with pytest.raises(ConfigError, match=r"^--workdir: .*seed0 holds an SFT start trained with"
                                        r" other settings \(sft\.lr: trained with"):
    runner.check_sft_starts(str(tmp_path), 1, {**TINY, "sft.lr": 5e-2}, "arithmetic")


def test_a_skipped_nan_step_does_not_decide_a_runs_maxima_by_where_it_stands():
  """A non-finite update is skipped and its step records NaN (its grad norm, perhaps its
  |log ρ̂|): the run's largest grad norm and |log ρ̂| leave it out wherever it stands, as they
  did only when it came after a finite value (Python's max keeps a leading NaN); inf stays."""
  from dllm_rl.study import runner
  nan = float("nan")
  records = [{"step": 1, "grad_norm": nan, "abs_log_ratio_max": nan, "abs_log_ratio_p50": nan},
             {"step": 2, "grad_norm": 3.0, "abs_log_ratio_max": 0.5, "abs_log_ratio_p50": 0.1},
             {"step": 3, "grad_norm": 2.0, "abs_log_ratio_max": 0.4, "abs_log_ratio_p50": 0.3}]
  evals = [{"step": 0, "val_accuracy": 0.5}, {"step": 3, "val_accuracy": 0.5}]
  for order in (records, records[::-1]):
    got = runner.arm_stats(order, evals, 16)
    assert got["grad_norm_max"] == 3.0 and got["grad_spikes"] == 1  # the NaN step: a spike
    assert got["abs_log_ratio"]["max_all"] == 0.5
    assert got["abs_log_ratio"]["p50_all"] == pytest.approx(0.2)
  records[2]["grad_norm"] = float("inf")
  assert runner.arm_stats(records, evals, 16)["grad_norm_max"] == float("inf")


def test_copy_sft_start_cut_short_leaves_no_start_and_a_rerun_copies_it_whole(tmp_path,
                                                                               monkeypatch):
  """A copy of the SFT start interrupted midway (a preemption) must not leave a partial
  checkpoints/sft that the rerun takes as the start: it copies beside and renames."""
  from dllm_rl.study import runner
  src = tmp_path / "sft" / "checkpoints" / "sft"
  for name in ("100/a", "100/b", "200/a"):
    (src / name).parent.mkdir(parents=True, exist_ok=True)
    (src / name).write_text(name)
  real = shutil.copytree

  def cut_short(s, d, **kw):  # copies one step's folder, then dies
    real(os.path.join(s, "100"), os.path.join(d, "100"))
    raise KeyboardInterrupt
  monkeypatch.setattr(shutil, "copytree", cut_short)
  with pytest.raises(KeyboardInterrupt):
    runner.copy_sft_start(str(tmp_path / "sft"), str(tmp_path / "arm"))
  assert not (tmp_path / "arm" / "checkpoints" / "sft").exists()
  monkeypatch.setattr(shutil, "copytree", real)
  runner.copy_sft_start(str(tmp_path / "sft"), str(tmp_path / "arm"))
  copied = tmp_path / "arm" / "checkpoints"
  assert sorted(p.name for p in copied.iterdir()) == ["sft"]
  assert (copied / "sft" / "200" / "a").read_text() == "200/a"


def test_the_arm_line_says_when_no_validation_ran_after_the_start():
  """`--rl_steps 3` under `--eval_every 20`: validation ran at step 0 only; the line said
  `val 0.0 → None | collapsed False` (collapse is judged on validation: not judged)."""
  from dllm_rl.study.runner import arm_line, arm_stats

  size = arms_lib.Size(rl_steps=3, eval_every=20, seeds=1)
  rec = {"summary": {"rl_accuracy": 0.25}, "wall_seconds": 12.0,
         "stats": arm_stats([], [{"step": 0, "val_accuracy": 0.0}], num_val=128)}
  line = arm_line("stabledrl", 0, "grpo", rec, size)
  assert line == ("[study] stabledrl seed 0 grpo: test 0.250 | val 0.0 at step 0, none after it"
                  " (validation every 20 steps, 3 run) | collapsed n/a | spikes 0 | 12s")
  rec["stats"] = arm_stats([], [{"step": 0, "val_accuracy": 0.0},
                                {"step": 20, "val_accuracy": 0.5}], num_val=128)
  assert "| val 0.0 → 0.5 | collapsed False |" in arm_line("stabledrl", 0, "grpo", rec, size)
