"""``python -m dllm_rl.study.branch``: a study run replayed to a step (checked against its
records), then branches from there under other settings; the recorded settings' branch
reproduces the run."""

import json
import os
import shutil

import pytest

from dllm_rl.config import testbeds
from dllm_rl.errors import ConfigError
from dllm_rl.study import branch
from dllm_rl.study.studies import study
from tests.helpers import malformed_table_rows
from tests.study.test_testbeds import TINY_SIZES


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
  with pytest.raises(ConfigError, match="cannot turn KL on"):
    branch.branch_overrides(recorded, 100, {"rl.kl_coef": 0.04})


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


@pytest.mark.slow  # a tiny study, then three training subprocesses
def test_a_replayed_run_branches_and_its_recorded_settings_reproduce_it(tmp_path):
  workdir = str(tmp_path / "study")
  study(["steprs"], workdir, 1, True, dict(TINY_SIZES), str(tmp_path / "r.md"), "test",
        rl_steps=6, eval_every=3, arm_patterns=["centered"])
  run_dir = os.path.join(workdir, "steprs", "seed0", "centered")
  out = str(tmp_path / "branches")
  with pytest.raises(ConfigError, match="until"):
    branch.branch(run_dir, out, 3, 7, [])
  with pytest.raises(ConfigError, match="run.json does not exist: not a finished study run"):
    branch.branch(str(tmp_path), out, 3, 6, [])
  lone = tmp_path / "lone" / "a" / "b"
  lone.mkdir(parents=True)
  shutil.copy(os.path.join(run_dir, "run.json"), lone)
  with pytest.raises(ConfigError, match="not in a study DIR"):
    branch.branch(str(lone), out, 3, 6, [])
  variant = [("cold", [("rl.temperature", "0.3")])]  # rollouts at another temperature
  got = branch.branch(run_dir, out, 3, 6, variant, log=lambda *_: None)
  assert got["replay_differs"] is None  # the replay's steps 1-3 equal the run's
  with open(os.path.join(run_dir, "run.json")) as fh:
    run_steps = [r for r in json.load(fh)["steps"] if r["step"] > 3]
  as_run, cold = got["branches"]
  assert as_run["name"] == "as_run" and as_run["overrides"] == {}
  for ours, theirs in zip(as_run["records"], run_steps, strict=True):  # resumed at step 3
    assert {k: ours.get(k) for k in theirs} == theirs
  assert cold["overrides"] == {"rl.temperature": 0.3}  # typed against the testbed
  assert [r["step"] for r in cold["records"]] == [4, 5, 6]
  assert cold["records"][0]["entropy"] != run_steps[0]["entropy"]  # from step 4 on
  assert as_run["val_accuracy"] is not None  # evaluated at step 6
  text = open(os.path.join(out, "branches.md")).read()
  assert "| cold | rl.temperature=0.3 |" in text and malformed_table_rows(text) == []
  again = branch.branch(run_dir, out, 3, 6, variant, log=lambda *_: None)
  assert again["branches"][1]["records"] == cold["records"]  # finished branches are reused
  hotter = branch.branch(run_dir, out, 3, 6, [("cold", [("rl.temperature", "0.6")])],
                         log=lambda *_: None)  # the same name, other settings: retrained
  assert hotter["branches"][1]["records"][0]["entropy"] != cold["records"][0]["entropy"]
  with pytest.raises(ConfigError, match="holds the branches of .* at step 3"):
    branch.branch(run_dir, out, 2, 6, [])  # another branch point: another --out
