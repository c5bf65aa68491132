"""The study's testbeds (dllm_rl/config/testbeds.py): selection by name with an error listing
the names, each testbed's config validates at its size, the countdown and GPU testbeds run
SFT → an arm end to end at tiny override sizes through the study's own code path, and the
study JSON and report record the testbed."""

import json
import os

import pytest

from dllm_rl.config import testbeds
from dllm_rl.errors import ConfigError
from dllm_rl.study import arms as arms_lib
from dllm_rl.study import report, sizing
from dllm_rl.study.studies import study

# Sizes only (model, data, lengths, batches, steps): the code path is the testbed's own.
TINY_SIZES = {"model.d_model": 32, "model.n_layers": 1, "model.n_heads": 2,
              "model.mlp_hidden": 64, "task.train_size": 128, "task.val_size": 8,
              "task.test_size": 8, "data.batch_size": 16, "sft.steps": 2,
              "sft.warmup_steps": 0, "sft.eval_every": 1, "sft.target_accuracy": 0.0,
              "rl.batch_prompts": 2, "rl.group_size": 4, "eval.batch_size": 32,
              "eval.num_samples": 2, "eval.pass_k": (1, 2), "mesh.data": 2}


def test_unknown_testbed_is_an_error_listing_the_names(tmp_path):
  for bad in ("nope", "countdwn"):
    with pytest.raises(ValueError,
                       match="available: arithmetic, chain, chain_orders, countdown, gpu"):
      testbeds.resolve(bad)
  with pytest.raises(ValueError, match="Did you mean 'countdown'"):
    testbeds.testbed("countdwn")
  assert testbeds.resolve(None) == "arithmetic"
  assert testbeds.resolve(None, "gpu") == testbeds.resolve("gpu") == "gpu"
  assert testbeds.resolve(None, "cpu") == "arithmetic"
  with pytest.raises(ValueError, match="disagree"):
    testbeds.resolve("countdown", "gpu")
  with pytest.raises(ValueError, match=r"gpu and --scale=cpu \(the arithmetic testbed\) disagree"):
    testbeds.resolve("gpu", "cpu")  # was the gpu testbed, the cpu scale said nothing
  assert testbeds.resolve("arithmetic", "cpu") == "arithmetic"
  with pytest.raises(ValueError, match="^--scale: 'tpu' is not cpu or gpu"):
    testbeds.resolve(None, "tpu")
  with pytest.raises(ValueError, match="available: arithmetic"):
    study(["steprs"], str(tmp_path / "w"), 1, True, {}, str(tmp_path / "r.md"), "test",
          testbed="nope")
  assert not os.path.exists(tmp_path / "w")


def test_the_default_testbed_is_the_embedded_default_and_its_old_size():
  from dllm_rl.config.defaults import get_config
  assert testbeds.testbed("arithmetic").get_config().to_dict() == get_config().to_dict()
  assert arms_lib.FULL == arms_lib.Size(200, 20, 5) and arms_lib.QUICK == arms_lib.Size(10, 5, 1)


@pytest.mark.parametrize("name", ["countdown", "chain", "chain_orders", "gpu"])
def test_testbed_meets_the_issue_sizes_and_every_arm_validates(name):
  """≥ 32-token completions in ≥ 2 blocks, ~1–3M parameters (countdown) / 128–256 tokens in
  blocks of 32 and ~50–150M parameters with the official estimator (gpu); ≥ 5 seeds; every
  arm of every study over it is a valid config."""
  from dllm_rl.study.runner import make_config
  from dllm_rl.train.validate import validate
  base = testbeds.testbed(name).get_config()
  validate(base)
  c, n = base, sizing.param_count(base)
  assert c.data.completion_len // c.sampler.block_len >= 2
  if name.startswith("chain") or name == "gpu":  # every answer: ≥ 32 tokens, fits the completion
    from dllm_rl.tasks import make_task
    answers = [e.answer for e in make_task("chain", **c.task.options).generate("train", 50, 0)]
    assert all(32 <= len(a) < c.data.completion_len for a in answers)
  else:
    assert c.task.name == "countdown" and c.task.options.num_numbers in (3, 4)
  if name in ("countdown", "chain", "chain_orders"):
    assert c.data.completion_len >= 32 and 1e6 <= n <= 3e6
  else:
    assert 128 <= c.data.completion_len <= 256 and c.sampler.block_len == 32
    assert 50e6 <= n <= 150e6
    assert {k: c.estimator[k.split(".")[1]] for k in arms_lib.OFFICIAL_ESTIMATOR} == (
        arms_lib.OFFICIAL_ESTIMATOR)
  assert 0.2 <= c.sft.target_accuracy <= 0.3
  assert arms_lib.size(name, quick=False).seeds >= 5
  for study_name in arms_lib.STUDIES.names():
    for arm in arms_lib.STUDIES.get(study_name)(base):
      validate(make_config({"mode": "rl", **arm.overrides}, base))


def test_gpu_profile_flop_estimate_counts_the_sft_start_and_each_main_arm():
  """The quick stability + StepRS study's main arms on the GPU profile, by the analytic FLOPs
  at the assumed 25% MFU of an H200's bf16 peak. (The one H200 run took longer than this
  estimate, docs/gpu.md: `sizing --measured` projects from recorded times instead.)"""
  e = sizing.estimate("gpu", ["stability", "steprs"], quick=True, group="main")
  assert e.mfu == 0.25 and e.peak == pytest.approx(989e12)
  assert e.seconds == pytest.approx(e.flops["total"] / (0.25 * 989e12))
  base = testbeds.testbed("gpu").get_config()
  main = [a for n in ("stability", "steprs") for a in arms_lib.STUDIES.get(n)(base)
          if a.group == "main"]
  assert len(main) == 11  # GRPO / StableDRL × 3 lr, 2 ablations; centered, StepRS, calibrated
  assert e.flops["total"] == pytest.approx(e.flops["sft"] + len(main) * e.flops["arm"])
  # launch/gpu_lease.sh's set: the lr grid's other two values dropped for GRPO and StableDRL
  at_lr = [a.name for a in main if a.overrides.get("rl.lr", base.rl.lr) == base.rl.lr]
  assert sizing.arm_count(base, ["stability", "steprs"], default_lr_only=True) == len(at_lr) == 7
  assert "grpo@lr1e-5" in at_lr and "grpo@lr3e-5" not in at_lr


def test_sizing_names_each_line_s_arms_in_plain_words(capsys):
  """``python -m dllm_rl.study.sizing gpu --quick`` printed "(every arms)" for the lines that
  count every arm."""
  sizing._print("gpu", True, [])
  groups = [line.split("(")[1].split(")")[0] for line in capsys.readouterr().out.splitlines()]
  assert groups == ["main arms", "all arms"] * 2, groups


@pytest.mark.slow  # the gpu profile only: chain is the same task and code path, smaller
@pytest.mark.parametrize("name", ["gpu"])
def test_testbed_runs_sft_then_an_arm_and_the_study_records_it(name, tmp_path):
  workdir, md = str(tmp_path / "study"), str(tmp_path / "results.md")
  out = study(["steprs"], workdir, 1, True, dict(TINY_SIZES), md, f"test --testbed={name}",
              rl_steps=2, eval_every=1, arm_patterns=["centered"], testbed=name)
  (result,) = out["studies"]
  (run,) = result["runs"]
  assert len(run["steps"]) == 2 and run["summary"]["rl_accuracy"] is not None
  assert "rl_distinct_correct" in run["summary"]
  assert set(run["summary"]["rl_pass_at_k"]) == {"1", "2"}
  with open(os.path.join(workdir, "steprs.json")) as fh:
    saved = json.load(fh)
  assert saved["testbed"] == name and saved["base_config"]["task"]["name"] == "chain"
  assert saved["base_config"]["data"]["completion_len"] == (
      testbeds.testbed(name).get_config().data.completion_len)
  with open(os.path.join(workdir, "sft", "seed0", "config_sft.json")) as fh:
    sft = json.load(fh)
  assert sft["task"]["name"] == "chain" and sft["model"]["d_model"] == 32
  assert out["meta"]["testbed"] == name
  text = open(md).read()
  assert f"| testbed | `{name}`:" in text and f"testbed `{name}`" in text
  # a DIR holds one testbed: another one's study there is refused before it runs
  with pytest.raises(ConfigError, match=f"holds a study of testbed '{name}'"):
    study(["steprs"], workdir, 1, True, dict(TINY_SIZES), md, "test", rl_steps=1,
          arm_patterns=["centered"], testbed="arithmetic")


@pytest.mark.slow  # two subprocess CLIs
def test_the_command_line_names_the_testbeds_on_an_unknown_one(tmp_path):
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  for flag in ("--testbed=nope", "--scale=tpu"):
    proc = subprocess.run([sys.executable, "-m", "dllm_rl.study", "steprs",
                           f"--workdir={tmp_path / 'w'}", flag], cwd=root, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "arithmetic, chain, chain_orders, countdown, gpu" in proc.stderr
    assert "Traceback" not in proc.stderr
  assert not os.path.exists(tmp_path / "w")


def test_a_study_dir_holds_one_testbed(tmp_path):
  from dllm_rl.study.runner import claim_workdir
  fresh, old = tmp_path / "fresh", tmp_path / "old"
  claim_workdir(str(fresh), "countdown")
  claim_workdir(str(fresh), "countdown")  # the same testbed again: fine
  assert (fresh / "testbed.txt").read_text() == "countdown\n"
  with pytest.raises(ConfigError, match="holds a study of testbed 'countdown', not 'gpu'"):
    claim_workdir(str(fresh), "gpu")
  (old / "sft" / "seed0").mkdir(parents=True)  # a study DIR from before testbeds
  with pytest.raises(ConfigError, match="testbed 'arithmetic', not 'countdown'"):
    claim_workdir(str(old), "countdown")
  claim_workdir(str(old), "arithmetic")
  assert (old / "testbed.txt").read_text() == "arithmetic\n"


def test_a_shared_sft_testbed_trains_one_start_for_every_seed(tmp_path, monkeypatch):
  """``Testbed.shared_sft``: seed 0's SFT checkpoint is every seed's start (trained once,
  its time counted once); the arms still run per seed with the seed's own RL randomness."""
  from dllm_rl.study import runner
  trained, started = [], []
  monkeypatch.setattr(runner, "train_sft", lambda seed, d, o, b=None: trained.append(
      (seed, d)) or {"sft_accuracy": 0.25, "wall_seconds": 60.0})
  def fake_arm(arm, seed, sft_dir, workdir, size, overrides, calibrated, base=None):
    started.append((seed, os.path.basename(sft_dir)))
    return {"arm": arm.name, "seed": seed, "overrides": dict(arm.overrides),
            "summary": {"rl_accuracy": 0.3},
            "stats": {"start_val_accuracy": 0.2, "final_val_accuracy": 0.3,
                      "collapsed": False, "grad_spikes": 0}, "wall_seconds": 1.0}
  monkeypatch.setattr(runner, "run_arm", fake_arm)
  arms = arms_lib.select(arms_lib.STUDIES.get("steprs")(testbeds.chain()), ["centered"])
  assert testbeds.testbed("chain").shared_sft and not testbeds.testbed("countdown").shared_sft
  out = runner.run_study("steprs", arms, str(tmp_path / "c"), 3, arms_lib.QUICK, {},
                         log=lambda *_: None, testbed="chain")
  assert [s for s, _ in trained] == [0] and trained[0][1].endswith(os.path.join("sft", "seed0"))
  assert started == [(0, "seed0"), (1, "seed0"), (2, "seed0")]
  assert out["shared_sft"] and [out["sft"][k]["wall_seconds"] for k in "012"] == [60, 0, 0]
  trained.clear(), started.clear()
  runner.run_study("steprs", arms, str(tmp_path / "d"), 2, arms_lib.QUICK, {},
                   log=lambda *_: None, testbed="countdown")
  assert [s for s, _ in trained] == [0, 1] and started == [(0, "seed0"), (1, "seed1")]
  trained.clear(), started.clear()  # --first_seed: a fresh set of seeds, same starts
  out = runner.run_study("steprs", arms, str(tmp_path / "c"), 2, arms_lib.QUICK, {},
                         log=lambda *_: None, testbed="chain", first_seed=5)
  assert [s for s, _ in trained] == [0] and started == [(5, "seed0"), (6, "seed0")]
  assert (out["seeds"], out["first_seed"]) == (2, 5) and sorted(out["sft"]) == ["5", "6"]
  assert [out["sft"][k]["wall_seconds"] for k in "56"] == [60, 0]
  assert report.seeds_label(out) == "2 seed(s) (seeds 5–6)"
  trained.clear(), started.clear()
  runner.run_study("steprs", arms, str(tmp_path / "d"), 2, arms_lib.QUICK, {},
                   log=lambda *_: None, testbed="countdown", first_seed=3)
  assert [s for s, _ in trained] == [3, 4] and started == [(3, "seed3"), (4, "seed4")]
  with pytest.raises(ConfigError, match="first_seed.*must be >= 0"):
    runner.seed_range(2, -1)


def test_a_stop_request_during_an_arm_ends_the_study_after_that_arm(tmp_path, monkeypatch):
  """SIGTERM arriving while an arm runs but after its last stop check (its final evaluation)
  is kept for the study, which stops before the next arm with ``Preempted`` (exit 75 from the
  CLI) instead of going on; the finished arm is saved for the rerun."""
  import signal
  from dllm_rl.study import runner
  from dllm_rl.train import resilience
  monkeypatch.setattr(runner, "train_sft", lambda seed, d, o, b=None: {"sft_accuracy": 0.25})
  started = []
  def fake_arm(arm, seed, sft_dir, workdir, size, overrides, calibrated, base=None):
    started.append(arm.name)
    with resilience.handle_signals():  # as modes.run does around each arm
      os.kill(os.getpid(), signal.SIGTERM)  # handled: a stop request, no exit
      assert resilience.stop_requested()
    return {"arm": arm.name, "seed": seed, "overrides": dict(arm.overrides),
            "summary": {"rl_accuracy": 0.3},
            "stats": {"start_val_accuracy": 0.2, "final_val_accuracy": 0.3,
                      "collapsed": False, "grad_spikes": 0}, "wall_seconds": 1.0}
  monkeypatch.setattr(runner, "run_arm", fake_arm)
  arms = arms_lib.select(arms_lib.STUDIES.get("steprs")(testbeds.chain()), ["centered", "steprs"])
  before = signal.getsignal(signal.SIGTERM)
  with pytest.raises(resilience.Preempted, match="after steprs seed 0's arm centered"):
    runner.run_study("steprs", arms, str(tmp_path / "s"), 2, arms_lib.QUICK, {},
                     log=lambda *_: None, testbed="chain")
  assert started == ["centered"]
  assert signal.getsignal(signal.SIGTERM) is before and not resilience.stop_requested()


def test_measured_projection_reads_the_recorded_wall_times(tmp_path):
  """sizing.measured: each seed's SFT start once (two studies share it), every arm run, and
  the projection SFT + arms × mean arm; a directory without them is an error naming it."""
  sft = {"0": {"wall_seconds": 170.0}}
  for name, walls in (("stability", [56.0, 42.0]), ("steprs", [36.0, 46.0])):
    with open(tmp_path / f"{name}.json", "w") as fh:
      json.dump({"study": name, "sft": sft, "runs": [{"wall_seconds": w} for w in walls]}, fh)
  with open(tmp_path / "meta.json", "w") as fh:
    json.dump({"command": "x"}, fh)  # not a study: skipped
  m = sizing.measured(str(tmp_path))
  assert m.sft_seconds == [170.0] and sorted(m.arm_seconds) == [36.0, 42.0, 46.0, 56.0]
  assert m.project(11) == pytest.approx(170 + 11 * 45)
  assert m.project(2, seeds=3) == pytest.approx(3 * (170 + 2 * 45))
  with pytest.raises(ValueError, match="no study JSON there records an SFT start"):
    sizing.measured(str(tmp_path / "nothing"))


def test_measured_compile_time_is_each_first_steps_delay_beyond_the_quickest(tmp_path):
  """sizing.measured's compile_seconds: from each arm's metrics.jsonl, the time from its step-0
  validation to its first RL step, less the quickest such delay (an arm served from the
  cache); an arm calibrated from another is left out (a background compile cannot serve
  it). The projection with background compiles takes their mean per arm off each arm."""
  arms = {"a": (0.0, 20.0), "b": (100.0, 105.0), "c": (200.0, 215.0), "cal": (300.0, 330.0)}
  for arm, (t0, t1) in arms.items():
    d = tmp_path / "steprs" / "seed0" / arm
    d.mkdir(parents=True)
    lines = [{"phase": "sft", "step": 0, "time": t0 - 50, "val_accuracy": 0.1},
             {"phase": "rl", "step": 0, "time": t0, "val_accuracy": 0.3},
             {"phase": "rl", "step": 1, "time": t1, "reward_mean": 0.2},
             {"phase": "rl", "step": 2, "time": t1 + 1, "reward_mean": 0.2}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
  study = {"study": "steprs", "sft": {"0": {"wall_seconds": 100.0}},
           "arms": [{"name": "a"}, {"name": "b"}, {"name": "c"},
                    {"name": "cal", "calibrate_from": "a"}],
           "runs": [{"arm": a, "seed": 0, "wall_seconds": 40.0} for a in arms]}
  (tmp_path / "steprs.json").write_text(json.dumps(study))
  m = sizing.measured(str(tmp_path))
  assert sorted(m.compile_seconds) == [0.0, 10.0, 15.0]
  assert m.project(2) == pytest.approx(100 + 2 * 40)
  assert m.project(2, background_compiles=True) == pytest.approx(100 + 2 * (40 - 25 / 4))
  assert sizing.first_step_delay(str(tmp_path / "steprs" / "seed0" / "c" / "metrics.jsonl")) \
      == pytest.approx(15.0)


@pytest.mark.parametrize("argv, said", [
    (["gpu", "--bogus"], "sizing: --bogus: not understood; usage:"),
    (["gpu", "chain"], "sizing: gpu chain: not understood"),
    (["nope"], "sizing: unknown testbed 'nope'"),
    (["gpu", "--measured=/no/such/dir"], "sizing: --measured=/no/such/dir: no such folder")])
def test_sizing_command_line_refuses_what_it_cannot_read_before_printing(argv, said, capsys):
  """A wrong flag was ignored (the estimate printed as if it were not there), an unknown
  testbed or a missing --measured folder ended in a traceback: now exit 2 with one line."""
  assert sizing.main(argv) == 2
  out, err = capsys.readouterr()
  assert out == "" and err.startswith(said)


def test_sizing_help_prints_its_usage_not_an_estimate(capsys):
  assert sizing.main(["--help"]) == 0
  out = capsys.readouterr().out
  assert "[TESTBED] [--quick]" in out and "PFLOP" not in out
