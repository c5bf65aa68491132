"""mode=eval: which weights (eval.phase / eval.checkpoint_step, checked before anything is
read), what it writes (eval_<task>_<label>.json + .generations.jsonl, never summary.json),
and the read-only checkpoint look-up it shares with `convert export` (steps of RL are
rollout batches)."""

import json
import os

import jax
import numpy as np
import pytest

from dllm_rl.config import ConfigError
from dllm_rl.infra.checkpoint import Checkpointer, CheckpointError
from dllm_rl.models import transformer
from dllm_rl.tasks.base import Example, VerifyResult
from dllm_rl.tasks.hf_tokenizer import HFTokenizer
from dllm_rl.tasks.tokenizer import CHARS, CharTokenizer
from dllm_rl.train import eval_mode, evaluation, modes, run_checkpoints
from dllm_rl.train.context import build_context
from dllm_rl.train.run_checkpoints import NoCheckpoint
from dllm_rl.train.validate import validate
from tests.helpers import scratch_run_checkpoints, tiny_run_config


def _save(workdir, phase, step, state, config=None):
  """A checkpoint of ``state`` as the phase loop names it (workdir/checkpoints/<phase>/<step>)."""
  meta = {"phase": phase} if config is None else {"phase": phase, "config": config.to_json()}
  with Checkpointer(os.path.join(workdir, "checkpoints", phase), keep=10,
                    async_save=False) as ckpt:
    ckpt.save(step, state, meta)


def _fake_run(workdir, steps):
  for phase, saved in steps.items():
    for step in saved:
      _save(workdir, phase, step, {"params": {"w": np.full(2, step, np.float32)}})


def test_the_checkpoint_is_chosen_by_phase_and_step(tmp_path):
  w = str(tmp_path)
  _fake_run(w, {"sft": [5, 10], "rl": [2, 4]})
  ref = run_checkpoints.find_checkpoint(w)
  assert (ref.phase, ref.step, ref.label) == ("rl", 4, "rl4")  # auto: the newest phase
  assert run_checkpoints.find_checkpoint(w, "sft").label == "sft10"
  assert run_checkpoints.find_checkpoint(w, "sft", 5).label == "sft5"
  with pytest.raises(NoCheckpoint, match=r"step 3 .*available steps \(rollout batches\): \[2, 4\]"
                     ) as err:
    run_checkpoints.find_checkpoint(w, "rl", 3)
  assert err.value.what == "step"
  with pytest.raises(NoCheckpoint, match=r"no rl checkpoint at step 5 .*\[2, 4\] \(sft has step 5:"
                                         r" choose that phase\)"):
    run_checkpoints.find_checkpoint(w, "auto", 5)  # auto chose RL; SFT has the step
  empty = tmp_path / "empty"
  empty.mkdir()
  assert run_checkpoints.find_checkpoint(str(empty)) is None
  with pytest.raises(NoCheckpoint, match="no sft checkpoint") as err:
    run_checkpoints.find_checkpoint(str(empty), "sft")
  assert err.value.what == "phase"
  assert os.listdir(empty) == []  # looking never creates a folder


def test_eval_target_errors_name_the_key(tmp_path):
  w = str(tmp_path / "w")
  _fake_run(w, {"sft": [5, 10]})
  c = tiny_run_config("eval")
  assert eval_mode.resolve_target(c, w).label == "sft10"
  c.eval.checkpoint_step = 7
  with pytest.raises(ConfigError, match=r"^config\.eval\.checkpoint_step: .*available steps: "
                                        r"\[5, 10\]"):
    eval_mode.resolve_target(c, w)
  c.eval.phase, c.eval.checkpoint_step = "rl", -1
  with pytest.raises(ConfigError, match=r"^config\.eval\.phase: no rl checkpoint.*\['sft'\]"):
    eval_mode.resolve_target(c, w)
  c.eval.phase = "auto"
  empty = str(tmp_path / "empty")
  with pytest.raises(ConfigError, match=r"^config\.model\.hf_checkpoint: eval mode needs a"
                                        r" checkpoint.*no model\.hf_checkpoint"):
    eval_mode.resolve_target(c, empty)
  c.model.hf_checkpoint = "/some/hf/folder"
  assert eval_mode.resolve_target(c, empty) is None  # the base model: the pre-RL baseline
  c.eval.phase = "base"
  assert eval_mode.resolve_target(c, w) is None  # base ignores the run's checkpoints
  assert eval_mode.result_paths("W", "gsm8k", None) == (
      "W/eval_gsm8k_base.json", "W/eval_gsm8k_base.generations.jsonl")


def test_eval_keys_are_validated():
  c = tiny_run_config("eval", {"eval.phase": "rll"})
  with pytest.raises(ConfigError, match=r"config\.eval\.phase: unknown eval phase 'rll'.*"
                                        r"Did you mean 'rl'"):
    validate(c)
  c = tiny_run_config("eval", {"eval.phase": "base", "eval.checkpoint_step": 3})
  with pytest.raises(ConfigError) as err:
    validate(c)
  lines = str(err.value).splitlines()
  assert lines[0].startswith("config.eval.phase: base evaluates the weights of model.hf_checkpoint")
  assert lines[1].startswith("config.eval.checkpoint_step: base (model.hf_checkpoint) has no steps")
  validate(tiny_run_config("sft", {"eval.phase": "base"}))  # only mode=eval reads it


def test_generation_records_decode_the_prompt_without_padding():
  tok = CharTokenizer()
  examples = [Example("1+2=", "3"), Example("10+20=", "30")]
  # Left padding with the EOS id (as LLaDA's pad = EOS): only the valid mask tells it apart.
  prompt_BP = np.array([[tok.eos_id] * 2 + tok.encode("1+2="), tok.encode("10+20=")])
  valid_BP = np.array([[False] * 2 + [True] * 4, [True] * 6])
  graded = [("3", VerifyResult(1.0, True, "3")), ("x", VerifyResult(0.0, False, None))]
  records = evaluation.generation_records(
      tok, evaluation.Split(examples, {"prompt_BP": prompt_BP, "prompt_valid_BP": valid_BP}),
      graded)
  assert records == [
      {"index": 0, "prompt": "1+2=", "answer": "3", "completion": "3", "parsed": "3",
       "reward": 1.0, "correct": True},
      {"index": 1, "prompt": "10+20=", "answer": "30", "completion": "x", "parsed": None,
       "reward": 0.0, "correct": False}]
  json.dumps(records)


def test_char_tokenizer_hf_files_give_the_same_ids(tmp_path):
  tok = CharTokenizer()
  for name, text in tok.hf_files().items():
    (tmp_path / name).write_text(text)
  hf = HFTokenizer.from_dir(str(tmp_path), mask_id=tok.mask_id, eos_id=tok.eos_id,
                            pad_id=tok.pad_id)
  text = CHARS + " <eos><mask><pad> (12+3)*4=?"
  assert hf.encode(text) == tok.encode(text) and hf.vocab_size == tok.vocab_size
  assert hf.format_prompt("1+2=") == "1+2="  # no chat template
  ids = np.concatenate([np.arange(3, tok.vocab_size), [tok.mask_id, tok.pad_id, tok.eos_id, 5]])
  assert hf.decode(ids) == tok.decode(ids)
  assert hf.decode(ids, stop_at_eos=False) == tok.decode(ids, stop_at_eos=False)


@pytest.mark.slow
def test_eval_writes_its_report_and_generations_and_never_the_summary(tmp_path):
  """A whole eval run (compiles the samplers) on two saved policies."""
  w = str(tmp_path)
  config, params = scratch_run_checkpoints(w, {"sft": [5], "rl": [3, 4]},
                                           {"task.test_size": 8, "eval.batch_size": 8})
  config.mode = "eval"
  os.remove(os.path.join(w, "checkpoints", "rl", "4", "meta", "metadata"))  # damaged: rl3 is read
  (tmp_path / "summary.json").write_text('{"sft_accuracy": 0.5}')
  report = modes.run(config, w)
  assert (report["phase"], report["step"], report["step_label"]) == ("rl", 3, "rl3")
  assert (tmp_path / "summary.json").read_text() == '{"sft_accuracy": 0.5}'
  saved = json.load(open(tmp_path / "eval_arithmetic_rl3.json"))
  assert saved["test_accuracy"] == report["test_accuracy"] and saved["step_label"] == "rl3"
  assert 0.0 <= saved["malformed_fraction"] <= 1.0  # of the pass@k samples
  lines = [json.loads(x) for x in open(tmp_path / "eval_arithmetic_rl3.generations.jsonl")]
  assert len(lines) == saved["test_size"] == 8
  assert np.mean([x["correct"] for x in lines]) == saved["test_accuracy"]
  assert np.mean([x["reward"] for x in lines]) == saved["test_reward"]
  # The completions are the restored rl3 policy's greedy ones.
  ctx = build_context(config, w)
  graphdef, _ = transformer.abstract_model(ctx.model_cfg)
  sample_fn, _ = evaluation.make_greedy_evaluator(graphdef, ctx.decoding, ctx.eval_options)
  greedy_NL = evaluation.generate(sample_fn, params["rl3"], ctx.test.arrays["prompt_BP"],
                                  ctx.test.arrays["prompt_valid_BP"], jax.random.key(0), 8)
  assert [x["completion"] for x in lines] == [ctx.tokenizer.decode(c) for c in greedy_NL]
  # Another step: its own files, beside the first.
  config.eval.checkpoint_step, config.eval.phase = 5, "sft"
  assert modes.run(config, w)["step_label"] == "sft5"
  assert {"eval_arithmetic_rl3.json", "eval_arithmetic_sft5.json",
          "eval_arithmetic_sft5.generations.jsonl"} <= set(os.listdir(w))
  assert not any("rl4" in name for name in os.listdir(w))
  config.eval.checkpoint_step, config.eval.phase = 4, "rl"  # the damaged step by number
  with pytest.raises(ConfigError, match=r"^config\.eval\.checkpoint_step: No readable checkpoint"
                                        r" .*rl: step 4: .*Saved steps: \[3, 4\]; choose"):
    modes.run(config, w)


def test_a_config_that_does_not_fit_the_checkpoint_names_the_keys_it_was_trained_with(tmp_path):
  """Evaluating without the run's overrides (another size, another LoRA rank) is a ConfigError
  naming each changed key with the value to pass, before anything compiles."""
  w = str(tmp_path)
  config, _ = scratch_run_checkpoints(w, {"sft": [2]})
  config.mode = "eval"
  config.model.mlp_hidden, config.lora.rank = config.model.mlp_hidden * 2, 4
  trained = config.model.mlp_hidden // 2
  with pytest.raises(ConfigError) as err:
    modes.run(config, w)
  assert err.value.key == "model.mlp_hidden"
  text = str(err.value)
  assert f"model.mlp_hidden={trained} (this config: {2 * trained})" in text
  assert "lora.rank=0 (this config: 4)" in text
  assert f"pass --config.model.mlp_hidden={trained} --config.lora.rank=0" in text
  assert "a full-fine-tuned checkpoint cannot be its base" in text


def test_tied_embeddings_against_an_untied_checkpoint_name_the_key(tmp_path):
  """``model.tie_embeddings`` changes the saved parameters (no lm_head): a ConfigError naming
  it, as another size is, not an evaluation of the embedding as the output head with the
  trained lm_head dropped."""
  w = str(tmp_path)
  config, _ = scratch_run_checkpoints(w, {"sft": [2]})
  config.mode, config.model.tie_embeddings = "eval", True
  with pytest.raises(ConfigError) as err:
    modes.run(config, w)
  assert err.value.key == "model.tie_embeddings"
  assert ("the checkpoint was trained with model.tie_embeddings=False (this config: True)"
          in str(err.value)), err.value


def test_a_damaged_newest_step_is_read_as_the_one_before(tmp_path, caplog):
  """run_checkpoints.read_readable: the newest asked for falls back, with a warning; a step
  asked for is not replaced; nothing readable names every step."""
  w = str(tmp_path)
  _fake_run(w, {"sft": [5, 10]})
  (tmp_path / "checkpoints" / "sft" / "10" / "meta" / "metadata").unlink()
  ref = run_checkpoints.find_checkpoint(w, "sft")
  with caplog.at_level("WARNING"):
    got, meta = run_checkpoints.read_readable(ref, lambda ckpt, s: ckpt.meta(s), fall_back=True)
  assert (got.label, meta) == ("sft5", {"phase": "sft"})
  assert f"{w}/checkpoints/sft/10 is damaged" in caplog.text
  assert "restored the previous step 5 instead" in caplog.text
  with pytest.raises(CheckpointError, match=r"sft: step 10: .*Saved steps: \[5, 10\]; choose"
                                            " another step"):
    run_checkpoints.read_readable(ref, lambda ckpt, s: ckpt.meta(s), fall_back=False)
  (tmp_path / "checkpoints" / "sft" / "5" / "meta" / "metadata").unlink()
  with pytest.raises(CheckpointError, match=r"step 10: .*; step 5: "):
    run_checkpoints.read_readable(ref, lambda ckpt, s: ckpt.meta(s), fall_back=True)


def test_a_config_change_outside_the_layout_is_not_named():
  """Only the keys that shape the saved parameters are named (a dtype or remat change beside a
  changed layer count is the user's choice, not the mismatch)."""
  from dllm_rl.config import base_config
  from dllm_rl.train import layout_errors
  trained, now = base_config(), base_config()
  now.model.dtype, now.model.remat, now.model.n_layers = "bfloat16", "full", 3
  now.lora.targets = ("q", "v")
  assert layout_errors.config_changes(trained, now) == [
      ("model.n_layers", 2, 3), ("lora.targets", list(trained.lora.targets), ["q", "v"])]
  err = layout_errors.layout_error(ValueError("x"), trained, now)
  assert err.key == "model.n_layers" and "--config.lora.targets=q,k,v,o,gate,up,down" in str(err)


def test_a_key_added_since_the_checkpoint_counts_only_away_from_its_default():
  """A checkpoint saved before a key existed (its config lacks ``sampler.kind``): the key at
  its default is no change (the saved run ran as the default does); set otherwise it is."""
  import json
  from dllm_rl.config import base_config
  from dllm_rl.train import layout_errors
  old = json.loads(base_config().to_json())
  del old["sampler"]["kind"], old["sampler"]["top_p"]
  meta = {"config": json.dumps(old)}
  now = base_config()
  assert layout_errors.changed_settings(meta, now) == []
  now.sampler.kind, now.rl.lr = "dream", 3e-4
  assert layout_errors.changed_settings(meta, now) == [
      ("rl.lr", old["rl"]["lr"], 3e-4), ("sampler.kind", None, "dream")]


def test_weights_trained_with_other_policy_settings_are_said(tmp_path):
  """lora.alpha / targets, rope_theta or the task change the evaluated policy or its prompts
  without changing a saved shape: the evaluation runs and says each such key (no compile
  here: the note is read from the checkpoint's meta)."""
  from dllm_rl.train.eval_mode import trained_otherwise
  w = str(tmp_path)
  config, _ = scratch_run_checkpoints(w, {"sft": [2]})
  ref = run_checkpoints.find_checkpoint(w, "sft")
  assert trained_otherwise(ref, config) == []
  config.model.rope_theta = config.model.rope_theta * 2
  config.task.name = "sum_split"
  config.rl.lr = 1.0  # not a policy key: not named
  [line] = trained_otherwise(ref, config)
  assert line.startswith(f"{w}/checkpoints/sft/2 was trained with other settings than this"
                         " evaluation's (model.rope_theta: ")
  assert "task.name: 'arithmetic' → 'sum_split'" in line and "rl.lr" not in line
  assert line.endswith("to evaluate it as trained") and "--config.model.rope_theta=" in line


def test_settings_that_do_not_change_the_policy_are_not_said(tmp_path):
  """How the policy is computed (remat, scan, logits chunks, MoE dispatch) and, without
  LoRA, the unread lora.alpha / targets are no other policy: no warning to pass the training
  run's values (docs/models.md, "Evaluate"); the dtype still is."""
  from dllm_rl.train.eval_mode import trained_otherwise
  w = str(tmp_path)
  config, _ = scratch_run_checkpoints(w, {"sft": [2]})
  ref = run_checkpoints.find_checkpoint(w, "sft")
  config.model.remat, config.model.scan_layers = "full", True
  config.model.logits_chunk, config.model.moe_dispatch = 8, "tiled"
  config.lora.alpha, config.lora.targets = 32.0, ("q", "v")
  assert trained_otherwise(ref, config) == []
  config.model.dtype = "bfloat16"
  [line] = trained_otherwise(ref, config)
  assert "(model.dtype: 'float32' → 'bfloat16')" in line
