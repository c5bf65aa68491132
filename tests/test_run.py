"""End to end (tiny): SFT writes metrics/checkpoints/summary and resumes exactly; the
pipeline (SFT → RL → eval) writes its summary and plot; eval mode."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from dllm_rl.errors import ConfigError
from dllm_rl.train import modes as run
from dllm_rl.infra.observability import read_metrics
from dllm_rl.train.context import build_context, init_params
from dllm_rl.train.optim import make_optimizer
from dllm_rl.infra.checkpoint import Checkpointer
from dllm_rl.train.lora_checkpoint import restore_checkpoint
from dllm_rl.train.phases import open_checkpointer
from dllm_rl.train import rl_loop, sft_loop
from dllm_rl.train.rl_loop import load_sft_params
from dllm_rl.parallel.shard import init_state_sharded, init_train_state
from tests.helpers import assert_test_figures, tiny_run_config


def _config(steps: int, mode: str = "sft"):
  """Constant learning rates: runs that differ only in their step counts compile the same
  SFT / RL steps (a resume with more steps loads them from the compilation cache)."""
  return tiny_run_config(mode, {
      "data.batch_size": 32, "sft.steps": steps, "sft.schedule": "constant",
      "sft.eval_every": 10, "sft.log_every": 5, "sft.target_accuracy": 0.0,
      "checkpoint.save_every": 10, "rl.steps": 4, "rl.log_every": 2, "rl.eval_every": 2,
      "rl.schedule": "constant"})


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
  """``sft_run(steps, lora_rank=0)``: (workdir, summary) of ``run.run`` on ``_config(steps)``,
  trained once per module for the tests that start from it; they read the workdir, or copy it
  before they write to it."""
  runs = {}

  def trained(steps: int, lora_rank: int = 0):
    if (steps, lora_rank) not in runs:
      config = _config(steps)
      config.lora.rank = lora_rank
      workdir = tmp_path_factory.mktemp(f"sft{steps}_lora{lora_rank}")
      runs[steps, lora_rank] = (workdir, run.run(config, str(workdir)))
    return runs[steps, lora_rank]

  return trained


def _params(workdir, config):
  ctx = build_context(config, workdir)
  graphdef, params = init_params(ctx)
  template = init_train_state(params, make_optimizer(config.sft)[0], jax.random.key(0))
  with open_checkpointer(ctx, "sft") as ckpt:
    state, meta = ckpt.restore(template)
  return state, meta


def _timeless(summary):
  return {k: v for k, v in summary.items() if k != "wall_seconds"}


@pytest.mark.slow
def test_sft_writes_outputs_and_rerun_resumes(tmp_path, capsys, sft_run):
  trained, summary = sft_run(20)
  assert summary["sft_steps"] == 20
  assert_test_figures(summary, trained, "sft")
  assert json.load(open(trained / "summary.json"))["sft_accuracy"] == summary["sft_accuracy"]
  records = read_metrics(str(trained / "metrics.jsonl"), phase="sft")
  assert [r["step"] for r in records if "loss" in r] == [5, 10, 15, 20]
  assert [r["step"] for r in records if "val_accuracy" in r] == [10, 20]
  assert os.listdir(trained / "tb")
  assert sorted(os.listdir(trained / "checkpoints" / "sft")) == ["10", "20"]

  capsys.readouterr()
  # The workdir moved (here: copied to tmp_path, where the reruns write): its own plot path.
  shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
  summary = {**summary, "sft_plot": str(tmp_path / "sft_curves.png")}
  # finished: the recorded summary, nothing restored, trained, evaluated or logged again
  again = run.run(_config(20), str(tmp_path))
  assert _timeless(again) == _timeless(summary)
  assert "[sft] finished at step 20: its summary and test evaluation are read from" in \
      capsys.readouterr().out
  records2 = read_metrics(str(tmp_path / "metrics.jsonl"), phase="sft")
  assert records2 == records
  other_rl = _config(20)  # rl.* does not change the SFT phase: still read back
  other_rl.rl.lr = 3e-3
  other_rl.estimator.name = "mean_field"  # nor does an estimator key SFT does not read
  assert _timeless(run.run(other_rl, str(tmp_path))) == _timeless(summary)
  assert "[sft] finished at step 20" in capsys.readouterr().out
  other_seed = _config(20)  # another seed: restored (nothing to train) and evaluated again
  other_seed.seed = 1
  other_seed.sft.target_accuracy = 0.99  # never reached in 20 steps: said on stderr
  resumed = run.run(other_seed, str(tmp_path))
  out, err = capsys.readouterr()
  assert "[sft] finished" not in out
  assert sft_loop.below_target(resumed, 0.99) in err
  assert "ended below sft.target_accuracy = 0.99" in err and "after 20 steps" in err
  assert resumed["sft_steps"] == 20 and resumed["sft_step_seconds"] is None  # no step ran
  assert len([r for r in read_metrics(str(tmp_path / "metrics.jsonl"), phase="sft")
              if "loss" in r]) == 4

  evaluated = run.run(_with_mode("eval"), str(tmp_path))
  assert evaluated["test_accuracy"] == summary["sft_accuracy"] and evaluated["step"] == 20
  bf16 = _config(20)  # a resume would cast the float32 weights and moments: said, not done
  bf16.model.param_dtype = "bfloat16"
  with pytest.raises(ConfigError, match=r"^config\.model\.param_dtype: .*sft was trained with"
                                        r" model\.param_dtype = float32 \(this config:"
                                        r" bfloat16\).*--config\.model\.param_dtype=float32"):
    run.run(bf16, str(tmp_path))


def test_a_warm_up_below_its_target_is_said():
  """The warning names the target, the last validation accuracy and the steps; none when
  the target was reached, is not set (0), or no validation ran."""
  short = {"sft_val_accuracy": 0.0, "sft_steps": 2000}
  warning = sft_loop.below_target(short, 0.3)
  assert "sft.target_accuracy = 0.3" in warning and "validation accuracy 0.000" in warning
  assert "after 2000 steps" in warning and "sft.steps" in warning
  assert sft_loop.below_target({"sft_val_accuracy": 0.3, "sft_steps": 450}, 0.3) is None
  assert sft_loop.below_target(short, 0.0) is None
  assert sft_loop.below_target({"sft_val_accuracy": None, "sft_steps": 20}, 0.3) is None


def test_rl_gain_is_against_the_sft_step_rl_started_from(capsys):
  """A pipeline's gain subtracts the test accuracy of the SFT step RL started from; when SFT's
  summary evaluated another one (its newest, damaged since: RL fell back), it is not computed
  and that is said."""
  sft = {"sft_steps": 20, "sft_accuracy": 0.25}
  assert run._rl_gain(sft, {"rl_sft_start": 20, "rl_accuracy": 0.5}) == 0.25
  assert run._rl_gain(sft, {"rl_sft_start": None, "rl_accuracy": 0.5}) == 0.25  # no SFT start
  assert run._rl_gain(sft, {"rl_sft_start": 10, "rl_accuracy": 0.5}) is None
  assert "RL started from SFT step 10, the SFT test accuracy is that of step 20" \
      in capsys.readouterr().err


def _no_starting_policy(monkeypatch):
  """From here on, building a phase's starting policy (a fresh init or the HF weights; RL's:
  the SFT checkpoint's params) fails the test."""
  def built(*_):
    raise AssertionError("a resume built the starting policy")
  monkeypatch.setattr(sft_loop, "init_params", built)
  monkeypatch.setattr(rl_loop, "init_params", built)
  monkeypatch.setattr(rl_loop, "load_sft_params", built)


def _with_mode(mode):
  return _config(20, mode)


@pytest.mark.slow
def test_pipeline_sft_rl_eval(tmp_path, monkeypatch, capsys):
  config = _config(10, "pipeline")
  config.rl.malformed_reward = -1.0  # a malformed rollout scores -1, a wrong one 0
  config.log.samples_every = 2
  summary = run.run(config, str(tmp_path))
  saved = json.load(open(tmp_path / "summary.json"))
  for key in ("sft_accuracy", "rl_accuracy", "pass_at_k", "wall_seconds", "rl_gain"):
    assert key in saved
  assert set(saved["pass_at_k"]) == {"1", "4"} and saved["pass_at_k"] == saved["rl_pass_at_k"]
  assert_test_figures(saved, tmp_path, "sft")
  assert_test_figures(saved, tmp_path, "rl")
  assert saved["rl_gain"] == pytest.approx(saved["rl_accuracy"] - saved["sft_accuracy"])
  assert saved["rl_steps"] == 4 and saved["sft_steps"] == 10 == saved["rl_sft_start"]
  assert os.path.getsize(summary["plot"]) > 0
  rl_records = read_metrics(str(tmp_path / "metrics.jsonl"), phase="rl")
  assert [r["step"] for r in rl_records if "reward_mean" in r] == [2, 4]
  assert [r["step"] for r in rl_records if "val_accuracy" in r] == [0, 2, 4]
  for r in rl_records:  # rewards 1 (correct), 0 (wrong), -1 (malformed), averaged
    if "reward_mean" in r:
      assert r["reward_mean"] == pytest.approx(r["accuracy"] - r["malformed_fraction"])
  assert any(r.get("malformed_fraction", 0) > 0 for r in rl_records)  # 10 SFT steps: many
  samples = [json.loads(x) for x in open(tmp_path / "samples.jsonl")]
  rl_samples = [x for x in samples if x["phase"] == "rl"]
  assert rl_samples and all(x["reward"] == (-1.0 if x["parsed"] is None else float(x["correct"]))
                            for x in rl_samples)  # the reward RL trained on
  assert any(x["parsed"] is None for x in rl_samples)
  evaluated = run.run(_config(10, "eval"), str(tmp_path))  # the newest phase: rl
  assert evaluated["phase"] == "rl" and evaluated["test_accuracy"] == saved["rl_accuracy"]
  _no_starting_policy(monkeypatch)  # RL resumed (2 more batches) from shapes alone
  config.rl.steps = 6
  capsys.readouterr()
  assert run.run(config, str(tmp_path))["rl_steps"] == 6
  assert "[rl] note: resuming with settings changed since the checkpoint was saved: rl.steps:" \
      " 4 → 6\n" in capsys.readouterr().err  # said once, and only what changed
  with Checkpointer(str(tmp_path / "checkpoints" / "rl"), read_only=True) as ckpt:
    assert ckpt.meta(6)["sft_start"] == 10  # the SFT step RL started from, kept on resume
  config.sft.steps = 20  # SFT trained further: RL's checkpoints no longer descend from it
  with pytest.raises(ConfigError, match=r"^--workdir: .*checkpoints/rl \(step 6\) continues RL"
                                        r" from SFT step 10, but RL would now start from SFT"
                                        r" step 20"):
    run.run(config, str(tmp_path))
  assert sorted(os.listdir(tmp_path / "checkpoints" / "rl")) == ["4", "6"]  # untouched


def test_rl_that_fell_back_past_a_damaged_sft_step_resumes_while_it_stays_damaged(tmp_path):
  """RL started from SFT step 10 because step 20 was damaged (its meta says so): its resume is
  not refused as "SFT trained further" while step 20 is still unreadable (a fresh start would
  read step 10 too); once step 20 reads again, or SFT saved a step the start did not pass
  over, it is."""
  import glob

  from tests.helpers import scratch_run_checkpoints
  config, policies = scratch_run_checkpoints(tmp_path, {"sft": [10, 20]})
  with Checkpointer(str(tmp_path / "checkpoints" / "rl"), async_save=False) as ckpt:
    ckpt.save(2, {"params": policies["sft10"]}, {"sft_start": 10, "sft_skipped": [20]})
  ctx = build_context(config, str(tmp_path))
  state_files = glob.glob(str(tmp_path / "checkpoints" / "sft" / "20" / "state" / "**" / "d"
                              / "*"), recursive=True)
  kept = {f: open(f, "rb").read() for f in state_files}
  for f in state_files:
    os.truncate(f, os.path.getsize(f) // 2)
  rl_loop.check_rl_start(ctx, [10, 20])  # no error: step 20 is still damaged
  for f, data in kept.items():
    open(f, "wb").write(data)
  with pytest.raises(ConfigError, match=r"continues RL from SFT step 10, but RL would now"
                                        r" start from SFT step 20"):
    rl_loop.check_rl_start(ctx, [10, 20])
  for f in state_files:  # SFT trained past the start's steps (30): refused without a read
    os.truncate(f, os.path.getsize(f) // 2)
  with pytest.raises(ConfigError, match=r"continues RL from SFT step 10, but RL would now"
                                        r" start from SFT step 30"):
    rl_loop.check_rl_start(ctx, [10, 20, 30])


def test_rl_mode_needs_an_sft_checkpoint(tmp_path):
  config = _config(10, "rl")
  with pytest.raises(ConfigError, match=r"^config\.model\.hf_checkpoint: RL starts from an SFT"
                                        r" checkpoint"):
    run.run(config, str(tmp_path))
  # The resolved config is in the workdir before the runner starts (here: before it failed).
  written = json.load(open(tmp_path / "config_rl.json"))
  assert written["mode"] == "rl" and written == json.loads(config.to_json_best_effort())


def _whole_sft_state_params(workdir, config):
  """The SFT checkpoint's params as a restore of the whole state reads them (optimizer state
  included; with LoRA, the saved adapters merged onto the run's base)."""
  ctx = build_context(config, workdir)
  _, params = init_params(ctx)
  lora_only = ctx.model_cfg.lora_rank > 0
  template, _ = init_state_sharded(params, make_optimizer(config.sft, lora_only=lora_only)[0],
                                   jax.random.key(0), ctx.mesh)
  with open_checkpointer(ctx, "sft") as ckpt:
    return restore_checkpoint(ckpt, template, config)[0].params


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_rl_starts_from_the_sft_params_alone(monkeypatch, sft_run, lora_rank):
  """RL's starting policy is the SFT checkpoint's params field, read by itself: the SFT
  optimizer state (Adam's two moments, twice the params) is never read. With LoRA, the saved
  adapters on the run's base."""
  config = _config(10)
  config.lora.rank = lora_rank
  workdir = str(sft_run(10, lora_rank)[0])  # read only
  want = _whole_sft_state_params(workdir, config)  # read before the spy
  reads = []
  restore, restore_part = Checkpointer.restore, Checkpointer.restore_part

  def spy_restore(self, *args, **kwargs):
    reads.append((os.path.basename(self.directory), "state"))
    return restore(self, *args, **kwargs)

  def spy_part(self, abstract_part, name, step, **kwargs):
    reads.append((os.path.basename(self.directory), name))
    return restore_part(self, abstract_part, name, step, **kwargs)

  monkeypatch.setattr(Checkpointer, "restore", spy_restore)
  monkeypatch.setattr(Checkpointer, "restore_part", spy_part)
  config.mode = "rl"
  _, params, start = load_sft_params(build_context(config, workdir))
  assert reads == [("sft", "params")] and start == 10
  got, expected = jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(want)
  assert len(got) == len(expected)
  for x, y in zip(got, expected):
    np.testing.assert_array_equal(x, y)
  if lora_rank:  # adapters trained on seed 0's init do not fit seed 1's: said, not used
    config.seed = 1
    with pytest.raises(ConfigError, match=r"^config\.seed: .*sft/10: its LoRA adapters were"
                                          r" trained on the base 'init from seed 0'"):
      load_sft_params(build_context(config, workdir))


def test_rl_from_an_sft_checkpoint_trained_with_another_attention_says_so():
  """SFT as a bidirectional model, then RL as a block-diffusion one on the same workdir
  (load_sft_params prints these lines): the same weights under another mask, said with the
  keys and the SFT run's values; other changes (the RL keys, the mode) are not."""
  sft = _config(2)
  meta = {"config": json.dumps(sft.to_dict())}
  rl = _config(2, mode="rl")
  rl.rl.lr = 1e-3
  assert rl_loop.attention_changes(meta, rl, "W/sft/2") == []
  rl.model.block_size = rl.sampler.block_len = 4
  rl.model.prompt_block_causal = False
  assert rl_loop.attention_changes(meta, rl, "W/sft/2") == [
      "RL starts from W/sft/2, trained with another attention (model.block_size: 0 → 4;"
      " model.prompt_block_causal: True → False): pass the SFT run's values (e.g."
      " --config.model.block_size=0) to train the policy it learned"]
  assert rl_loop.attention_changes({}, rl, "W/sft/2") == []  # no config in the meta


def test_lora_rl_from_a_lora_sft_checkpoint_with_other_adapter_settings_says_so():
  """LoRA SFT, then LoRA RL with another alpha or fewer targets (whose restore drops the
  other targets' adapters): RL does not start from the policy SFT learned, said with the
  keys and the SFT run's values (as a flag); the same settings, or no LoRA, say nothing."""
  sft = _config(2)
  sft.lora.rank = 4
  meta = {"config": json.dumps(sft.to_dict())}
  rl = _config(2, mode="rl")
  rl.lora.rank = 4
  assert rl_loop.adapter_changes(meta, rl, "W/sft/2") == []
  rl.lora.alpha, rl.lora.targets = 32.0, ("q", "v")
  assert rl_loop.adapter_changes(meta, rl, "W/sft/2") == [
      "RL starts from W/sft/2, whose LoRA adapters were trained with other settings"
      " (lora.alpha: 16.0 → 32.0; lora.targets: ['q', 'k', 'v', 'o', 'gate', 'up', 'down'] →"
      " ['q', 'v']): pass the SFT run's values (e.g. --config.lora.alpha=16.0) to start from"
      " the policy it learned"]
  rl.lora.alpha = 16.0  # a list's flag as the command line takes it
  assert rl_loop.adapter_changes(meta, rl, "W/sft/2")[0].endswith(
      "(e.g. --config.lora.targets=q,k,v,o,gate,up,down) to start from the policy it learned")
  rl.lora.rank = 0  # a layout error (lora.rank) when it is read: nothing to say here
  assert rl_loop.adapter_changes(meta, rl, "W/sft/2") == []


@pytest.mark.slow
def test_resume_equals_uninterrupted_run(tmp_path, monkeypatch, sft_run):
  straight, uninterrupted = sft_run(20)
  assert "sft_earlier_wall_seconds" not in uninterrupted
  stopped, first = sft_run(10)
  split = tmp_path / "split"
  shutil.copytree(stopped, split)  # the module's step-10 run, continued here
  _no_starting_policy(monkeypatch)  # the resume reads the checkpoint into shapes alone
  resumed = run.run(_config(20), str(split))  # picks up at step 10: same data position, keys
  # the phase's wall time counts the first process's, up to the step-10 checkpoint, too
  earlier = resumed["sft_earlier_wall_seconds"]
  assert 0 < earlier < first["sft_wall_seconds"] < resumed["sft_wall_seconds"]
  assert resumed["sft_wall_seconds"] - earlier < resumed["wall_seconds"]  # this process's part
  a, meta_a = _params(str(straight), _config(20))
  b, meta_b = _params(str(split), _config(20))
  assert int(a.step) == int(b.step) == 20 and meta_a["data_position"] == meta_b["data_position"]
  for x, y in zip(jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params)):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_eval_mode_without_checkpoint_is_a_clear_error(tmp_path):
  with pytest.raises(ConfigError,
                     match="^config.model.hf_checkpoint: eval mode needs a checkpoint"):
    run.run(_with_mode("eval"), str(tmp_path))


@pytest.mark.slow
def test_block_diffusion_pipeline(tmp_path):
  """configs/tiny_block_cpu.py at tiny size: block SFT (staircase one-pass objective), RL with
  block_elbo and StepRS over (block, step) states, KV-cache block sampling, evaluation."""
  from dllm_rl.config import load_config_file
  c = load_config_file(os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs",
                                    "tiny_block_cpu.py"))
  base = _config(10, "pipeline")
  for section in ("task", "data", "sft", "rl", "eval", "mesh", "checkpoint", "log"):
    c[section] = base[section]
  c.model.d_model, c.model.n_layers, c.model.mlp_hidden = 32, 1, 64
  c.rl.advantage = "steprs"
  summary = run.run(c, str(tmp_path))
  assert summary["rl_steps"] == 4
  assert set(summary["pass_at_k"]) == {"1", "4"}
  assert_test_figures(summary, tmp_path, "rl")


@pytest.mark.parametrize("sft_meta", [{}, {"stopped_early": True}])
def test_a_pipeline_whose_sft_would_orphan_its_rl_checkpoints_is_refused_before_sft(tmp_path,
                                                                                   sft_meta):
  """RL checkpoints that continue from SFT step 10, and a pipeline rerun with sft.steps = 20:
  SFT would train to step 20 and RL would then refuse to resume, so the refusal comes before
  SFT trains (no step 20 is written). An SFT that stopped early at step 10 trains no further:
  no refusal up front (RL resumes as before)."""
  from tests.helpers import scratch_run_checkpoints
  config, policies = scratch_run_checkpoints(tmp_path / "scratch", {"sft": [10]})
  with Checkpointer(str(tmp_path / "checkpoints" / "sft"), async_save=False) as ckpt:
    ckpt.save(10, {"params": policies["sft10"]},
              {"phase": "sft", "config": config.to_json(), **sft_meta})
  with Checkpointer(str(tmp_path / "checkpoints" / "rl"), async_save=False) as ckpt:
    ckpt.save(2, {"params": policies["sft10"]}, {"sft_start": 10})
  config.mode, config.sft.steps = "pipeline", 20
  ctx = build_context(config, str(tmp_path))
  if sft_meta:
    rl_loop.check_rl_start_before_sft(ctx)  # SFT has nothing left to train
    return
  with pytest.raises(ConfigError, match=r"continues RL from SFT step 10, but RL would now start"
                                        r" from SFT step 20 \(SFT would first train on to"
                                        r" sft.steps = 20\)"):
    run.run(config, str(tmp_path))
  assert sorted(os.listdir(tmp_path / "checkpoints" / "sft")) == ["10"]  # SFT did not train
  config.sft.steps = 10  # SFT is done: nothing to refuse up front
  rl_loop.check_rl_start_before_sft(build_context(config, str(tmp_path)))



def test_a_pipeline_without_sft_resumes_rl_from_the_hf_model(tmp_path):
  """mode=pipeline with sft.steps = 0 starts RL from the HF model (no SFT checkpoint, RL's
  meta: sft_start None): its SFT trains nothing, so a rerun that resumes RL is not refused
  up front (it was: "RL would now start from SFT step 0")."""
  from tests.helpers import scratch_run_checkpoints
  config, policies = scratch_run_checkpoints(tmp_path / "scratch", {"sft": [10]})
  with Checkpointer(str(tmp_path / "checkpoints" / "rl"), async_save=False) as ckpt:
    ckpt.save(2, {"params": policies["sft10"]}, {"sft_start": None})
  config.mode, config.sft.steps = "pipeline", 0
  rl_loop.check_rl_start_before_sft(build_context(config, str(tmp_path)))
  config.sft.steps = 5  # SFT would train a start RL did not descend from: refused
  with pytest.raises(ConfigError, match=r"from the HF model / a fresh init, but RL would now"
                                        r" start from SFT step 5"):
    rl_loop.check_rl_start_before_sft(build_context(config, str(tmp_path)))


def test_a_resume_note_leaves_out_the_distributed_settings(capsys):
  """A requeued multi-host job comes back with another coordinator address and process ids:
  no change to the run, so the resume note does not list distributed.*; rl.steps it does."""
  import types

  from dllm_rl.train import phases
  saved = _config(10, mode="rl")
  now = _config(10, mode="rl")
  now.rl.steps = 6
  now.distributed.coordinator_address = "10.0.0.2:1234"
  phase = types.SimpleNamespace(name="rl", ctx=types.SimpleNamespace(config=now),
                                unrelated_keys=("mode",))
  phases._say_changes(phase, {"config": saved.to_json()})
  err = capsys.readouterr().err
  assert "rl.steps:" in err and "distributed" not in err
