"""Settings the run's own choices never read are said before anything compiles
(dllm_rl.config.unread): the shipped configs and the embedded default set none."""

import glob
import os
import re

import pytest

from dllm_rl.config import base_config, load_config_file
from dllm_rl.config.defaults import get_config
from dllm_rl.config.unread import RULES, is_read, unread_settings
from dllm_rl.train.modes import mesh_notes
from tests.helpers import ROOT, hf_fixture_with_tokenizer, tiny_run_config


def _with(mode="pipeline", **updates):
  c = get_config()
  c.unlock()
  c.mode = mode
  for key, value in updates.items():
    section, name = key.split("__")
    c[section][name] = value
  return c


@pytest.mark.parametrize("updates, key", [
    ({"rl__beta_end": 4.0}, "rl.beta_end"),  # centered advantages: StepRS is not on
    ({"rl__beta": 2.0, "rl__advantage": "steprs"}, "rl.beta"),
    ({"rl__clip_C": 3.0, "rl__loss": "grpo"}, "rl.clip_C"),
    ({"rl__clip_C": 3.0, "rl__clip": "none"}, "rl.clip_C"),
    ({"rl__eps": 0.1}, "rl.eps"),  # stabledrl's upper clip is C: ε only moves bypass_fraction
    ({"rl__eps": 0.1, "rl__loss": "wd1"}, "rl.eps"),  # ratio-free
    ({"rl__kl_estimator": "k2"}, "rl.kl_estimator"),  # kl_coef 0
    ({"estimator__coupled": True, "estimator__num_samples": 2,
      "estimator__name": "spg_block"}, "estimator.coupled"),
    ({"estimator__num_samples": 4, "estimator__name": "mean_field"}, "estimator.num_samples"),
    ({"estimator__spg_beta": 2.0}, "estimator.spg_beta"),  # the 1/t ELBO
    ({"estimator__antithetic": True, "rl__loss": "wd1", "estimator__name": "mean_field",
      "estimator__reduction": "sum"}, "estimator.antithetic"),
    ({"lora__alpha": 32.0}, "lora.alpha"),  # rank 0
    ({"sft__eval_every": 0}, "sft.target_accuracy"),  # the default's 0.3, never checked
    ({"sft__steps": 20}, "sft.target_accuracy"),  # eval_every 25: no validation in 20 steps
    ({"sampler__eps": 0.01}, "sampler.eps"),  # the masked sampler's schedule has none
    ({"sampler__kind": "dream", "sampler__remasking": "entropy",
      "sampler__stop_at_eos": False}, "sampler.stop_at_eos"),  # Dream runs all its steps
    ({"model__prompt_block_causal": False}, "model.prompt_block_causal"),  # no blocks
    ({"estimator__attention_impl": "reference"}, "estimator.attention_impl"),  # no staircase
    ({"sampler__threshold": 0.9, "sampler__steps": 4}, "sampler.steps"),  # block_len's cap
    ({"estimator__trajectory_shrink": 8}, "estimator.trajectory_shrink"),  # the ELBO's passes
    ({"model__experts_per_token": 2}, "model.experts_per_token"),  # a dense model
    ({"model__moe_dispatch": "tiled"}, "model.moe_dispatch"),
    ({"model__first_dense_layers": 1}, "model.first_dense_layers"),
    ({"model__n_experts": 4, "model__experts_per_token": 2, "model__moe_hidden": 16,
      "model__mlp_hidden": 64}, "model.mlp_hidden"),  # every layer's MLP is experts
    ({"eval__checkpoint_step": 500}, "eval.checkpoint_step"),  # mode=eval's
    ({"eval__phase": "sft"}, "eval.phase"),
    ({"log__samples_every": 0, "log__num_samples": 8}, "log.num_samples"),
    ({"log__wandb_entity": "team"}, "log.wandb_entity"),  # no W&B project: no W&B run
    ({"log__wandb_name": "run-1"}, "log.wandb_name"),
    ({"distributed__initialize": "never", "distributed__local_device_ids": "0"},
     "distributed.local_device_ids"),
    ({"distributed__initialize": "never", "distributed__num_processes": 2},
     "distributed.num_processes"),
])
def test_a_setting_the_run_does_not_read_is_named(updates, key):
  config = _with(**updates)
  lines = unread_settings(config)
  assert [line.split("=")[0] for line in lines] == [f"config.{key}"], lines
  assert " is not read: " in lines[0]
  assert not is_read(config, key)  # what validate asks (the coupled pairs check)


def test_threshold_modes_steps_error_asks_for_the_value_no_warning_calls_unread():
  """In threshold mode validation still wants sampler.steps a multiple of the blocks: 16 blocks
  refused the default 8 ("a positive multiple of the number of blocks (16)"), and the 16 a user
  then gave was named "not read". The error now asks for data.completion_len, the value the
  warning accepts."""
  from dllm_rl.errors import ConfigError
  from dllm_rl.train.validate import validate
  for steps in (8, 512):  # not a multiple of the 16 blocks; 32 a block, above block_len 8
    config = _with(sampler__threshold=0.9, data__completion_len=128, sampler__steps=steps)
    with pytest.raises(ConfigError) as err:
      validate(config)
    (said,) = [str(e) for e in getattr(err.value, "errors", [err.value])
               if str(e).startswith("config.sampler.steps")]
    assert said.endswith("with sampler.threshold > 0 nothing else reads it (a block runs until"
                         " it is complete): set it to data.completion_len = 128"), said
    config.sampler.steps = 128
    assert unread_settings(validate(config)) == []
  with pytest.raises(ConfigError, match=r"number of blocks \(16\)$"):  # no threshold: read
    validate(_with(data__completion_len=128, sampler__steps=8))


def test_settings_the_run_reads_and_other_modes_are_quiet():
  assert unread_settings(_with(rl__advantage="steprs", rl__beta_end=4.0)) == []
  assert unread_settings(_with(rl__loss="grpo", rl__eps=0.3)) == []
  assert unread_settings(_with(rl__clip="symmetric", rl__eps=0.3)) == []
  # an SFT run reads no RL or estimator key: a config file written for RL stays quiet there
  assert unread_settings(_with(mode="sft", rl__beta_end=4.0)) == []
  assert unread_settings(_with(mode="sft", lora__alpha=32.0)) != []
  assert unread_settings(_with(mode="rl", sft__eval_every=0)) == []  # RL reads no SFT key
  # SFT reads the staircase attention of a block model's one estimator key (ESTIMATOR_KEYS)
  assert [line.split("=")[0] for line in unread_settings(
      _with(mode="sft", estimator__attention_impl="reference"))] == [
          "config.estimator.attention_impl"]
  assert unread_settings(_with(mode="eval", estimator__attention_impl="reference")) == []
  assert unread_settings(_with(profile__steps="2:4")) == []
  assert unread_settings(_with(sampler__kind="dream", sampler__eps=0.01)) == []
  assert unread_settings(_with(estimator__name="trajectory", estimator__trajectory_shrink=8,
                               estimator__reduction="sum", rl__loss="grpo_token")) == []
  moe = dict(model__n_experts=4, model__experts_per_token=2, model__moe_hidden=16,
             model__moe_dispatch="tiled")
  assert unread_settings(_with(**moe, model__first_dense_layers=1, model__mlp_hidden=64)) == []
  assert unread_settings(_with(lora__rank=4, lora__base_dtype="float32")) == []
  # a LoRA run stores its base in lora.base_dtype, but `convert export` writes the merged
  # weights in model.param_dtype unless --dtype says otherwise (dllm_rl.train.export)
  assert unread_settings(_with(lora__rank=4, model__param_dtype="bfloat16")) == []
  assert unread_settings(_with(sampler__steps=4)) == []  # 4 steps for the one block of 8
  assert unread_settings(_with(sampler__threshold=0.9, data__completion_len=16,
                               sampler__steps=16)) == []  # the steps threshold mode runs
  assert unread_settings(_with(mode="eval", eval__phase="sft", eval__checkpoint_step=5)) == []
  assert unread_settings(_with(log__wandb_project="p", log__wandb_entity="t",
                               log__wandb_name="n", log__num_samples=8)) == []
  assert unread_settings(_with(distributed__initialize="explicit",
                               distributed__num_processes=2, distributed__process_id=1,
                               distributed__local_device_ids="0")) == []
  assert unread_settings(_with(mode="sft", profile__steps="2:4")) == [
      "config.profile.steps='2:4' is not read: a trace of RL steps: an SFT or eval run writes none"]


# the model keys a run from model.hf_checkpoint still reads (the rest is config.json's)
READ_WITH_HF = {"hf_checkpoint", "block_size", "prompt_block_causal", "dtype", "param_dtype",
                "scan_layers", "remat", "logits_chunk", "moe_dispatch"}


def test_the_architecture_keys_are_not_read_with_an_hf_checkpoint():
  sizes = dict(model__d_model=32, model__n_layers=3, model__vocab_size=256, model__n_experts=4)
  read = dict(model__dtype="bfloat16", model__scan_layers=True, model__remat="full",
              model__logits_chunk=32, model__block_size=4, model__prompt_block_causal=False)
  assert unread_settings(_with(mode="rl", **sizes, **read)) == []  # from scratch: all read
  lines = unread_settings(_with(mode="rl", model__hf_checkpoint="/ckpt/llada", **sizes, **read))
  # the embedded default's own rope_theta (10000, the schema's 500000) is not the user's: quiet
  assert [line.split(" is not read: ")[0] for line in lines] == [
      "config.model.vocab_size=256", "config.model.d_model=32", "config.model.n_layers=3",
      "config.model.n_experts=4"]
  theta = unread_settings(_with(mode="rl", model__hf_checkpoint="/ckpt/llada",
                                model__rope_theta=1e6))
  assert theta == ["config.model.rope_theta=1000000.0 is not read: with model.hf_checkpoint the"
                   " architecture comes from its config.json"]
  assert lines[0].endswith(" is not read: with model.hf_checkpoint the architecture comes from"
                           " its config.json")
  # every model key is either still read or named here
  hf_rules = {key.split(".")[1] for key, _, who in RULES
              if key.startswith("model.") and "model.hf_checkpoint" in who}
  assert not hf_rules & READ_WITH_HF
  assert hf_rules | READ_WITH_HF == set(base_config().model)


def test_every_rule_names_a_schema_key_and_the_shipped_configs_set_nothing_unread():
  schema = base_config()
  for key, _, _ in RULES:
    section, name = key.split(".")
    assert name in schema[section], key
  assert unread_settings(get_config()) == []
  for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.py"))):
    for variant in ("", ":tiny"):
      try:
        config = load_config_file(path + variant)
      except (ValueError, TypeError):  # a config file without the tiny variant
        continue
      assert unread_settings(config) == [], (path, variant)


@pytest.mark.parametrize("fixture, limit", [
    ("llada_tiny", ("max_sequence_length", 64)), ("sdar_tiny", ("max_position_embeddings", 64)),
    ("dream_tiny", ("max_position_embeddings", 131072)),
    ("llada2_moe_tiny", ("max_position_embeddings", 32768))])
def test_the_checkpoints_maximum_sequence_length_is_read_from_its_config(fixture, limit):
  from dllm_rl.models import hf
  assert hf.max_length(hf.read_hf_config(os.path.join(ROOT, "tests", "fixtures", fixture))) == limit


def test_sequences_longer_than_the_checkpoints_are_named_before_anything_compiles(tmp_path):
  """llada_tiny's config.json: max_sequence_length 64; a warning, not an error (RoPE runs
  past it), in the context the run prints its warnings from (train/modes.py)."""
  from dllm_rl.train.context import build_context
  source = hf_fixture_with_tokenizer(tmp_path)

  def notes(completion_len):
    config = tiny_run_config("eval", {"model.hf_checkpoint": str(source),
                                      "data.prompt_len": 24, "data.completion_len": completion_len})
    return build_context(config, str(tmp_path / "w")).notes

  assert notes(40) == ()  # 64: within
  assert notes(48) == (
      "config.data.prompt_len + config.data.completion_len = 24 + 48 = 72 is longer than"
      " model.hf_checkpoint's maximum sequence length 64 (max_sequence_length in its"
      " config.json): RoPE runs past it, but the model was never trained there",)


def test_test_prompts_that_are_also_training_prompts_are_named(tmp_path):
  """A test_file that repeats the train_file (or shares problems with it): a warning naming
  how many test prompts were trained on and the first one's file:line, before anything
  compiles; none for disjoint files."""
  import json

  from dllm_rl.train.context import build_context
  from tests.test_production_configs import _gsm8k
  source = hf_fixture_with_tokenizer(tmp_path)
  train = _gsm8k(tmp_path)
  other = tmp_path / "other.jsonl"
  other.write_text("".join(json.dumps({"question": f"How much is {i} times 3?",
                                       "answer": f"#### {3 * i}"}) + "\n" for i in range(8)))

  def notes(test_file):
    config = tiny_run_config("sft", {
        "model.hf_checkpoint": str(source), "task.name": "gsm8k", "task.options": {},
        "task.train_size": 30, "task.val_size": 2, "task.test_size": 8,
        "data.prompt_len": 32, "data.completion_len": 24, "sampler.block_len": 24,
        "sampler.steps": 24, "data.batch_size": 8, "rl.batch_prompts": 8})
    config.task.options.train_file, config.task.options.test_file = str(train), str(test_file)
    return build_context(config, str(tmp_path / "w")).notes

  assert notes(other) == ()
  (same,) = notes(train)
  assert re.fullmatch(rf"\d of the 8 test prompts are also training prompts \(the first:"
                      rf" {re.escape(str(train))}:\d+\): the test accuracy is not held out;"
                      r" check task.options.train_file and test_file", same), same


def test_repeated_evaluation_prompts_are_named(tmp_path):
  """A data file with duplicated records (two files joined, a record written twice): each
  copy of a test prompt counted in the test accuracy, and the validation split, carved from the
  train file, held training prompts; both were silent. Named with the first copy's file:line
  and the line it repeats; nothing for files without duplicates."""
  import json

  from dllm_rl.tasks import make_task
  from dllm_rl.train.run_notes import duplicate_notes

  def write(name, numbers):
    path = tmp_path / name
    path.write_text("".join(json.dumps({"question": f"What is {i}+1?", "answer": f"#### {i + 1}"})
                            + "\n" for i in numbers))
    return str(path)

  task = make_task("gsm8k", train_file=write("train.jsonl", range(8)),
                   test_file=write("test.jsonl", [0, 1, 2, 3]))
  splits = task.generate("train", -1, 0), task.generate("test", -1, 0)
  assert duplicate_notes(task, splits[0][:6], splits[0][6:], splits[1]) == []
  train = write("dup_train.jsonl", [0, 1, 2, 3, 0, 1, 2, 3])
  task = make_task("gsm8k", train_file=train, test_file=write("dup_test.jsonl", [5, 6, 5, 5]))
  test = sorted(task.generate("test", -1, 0), key=lambda ex: ex.source)
  train_all = sorted(task.generate("train", -1, 0), key=lambda ex: ex.source)
  val_note, test_note = duplicate_notes(task, train_all[:4], train_all[4:6], test)
  assert val_note == (f"2 of the 2 validation prompts are also training prompts (the first:"
                      f" {train}:5, as {train}:1): the train file repeats records, so the"
                      " validation accuracy is not held out; drop the duplicates from"
                      " task.options.train_file")
  assert test_note == (f"2 of the 4 test prompts repeat another of the split (the first:"
                       f" {tmp_path}/dup_test.jsonl:3, as {tmp_path}/dup_test.jsonl:1): each"
                       " copy counts in the test accuracy; drop the duplicates from the data file")



def test_the_first_shared_or_repeated_prompt_is_the_first_in_its_file(tmp_path):
  """The splits are shuffled, and the notes named the first shared / repeated prompt of the
  shuffled split (a test file whose 12 lines all repeat the train file was named by a line in
  its middle); they name the earliest line of the file now."""
  import json

  from dllm_rl.tasks import make_task
  from dllm_rl.train.run_notes import duplicate_notes, overlap_notes

  def write(name, numbers):
    path = tmp_path / name
    path.write_text("".join(json.dumps({"question": f"What is {i}+1?", "answer": f"#### {i + 1}"})
                            + "\n" for i in numbers))
    return str(path)

  train, test = write("train.jsonl", range(12)), write("test.jsonl", [*range(12), *range(12)])
  task = make_task("gsm8k", train_file=train, test_file=test)
  test_split = task.generate("test", -1, 0)
  assert test_split[0].source != f"{test}:1"  # shuffled: what the notes named before
  (line,) = overlap_notes(task, task.generate("train", -1, 0), test_split)
  assert f"(the first: {test}:1)" in line, line
  (line,) = duplicate_notes(task, [], [], test_split)
  assert f"(the first: {test}:13, as {test}:1)" in line, line

def test_a_mesh_that_leaves_devices_idle_is_named():
  from dllm_rl.parallel.mesh import make_mesh
  assert mesh_notes(make_mesh({"data": -1, "fsdp": 1, "tensor": 1})) == []
  (line,) = mesh_notes(make_mesh({"data": 2, "fsdp": 1, "tensor": 1}))
  assert line.startswith("config.mesh (data=2, fsdp=1, expert=1, tensor=1) uses 2 of the 8")


def test_a_study_arm_is_quiet_about_its_testbeds_own_settings_not_about_its_overrides():
  """chain's testbed sets estimator.spg_block_len for its spg_block arms: its elbo stress arm
  does not read it, and says nothing of it (the study runner's quiet keys); an arm's or the
  user's override that the run does not read is still named."""
  from dllm_rl.config import testbeds
  from dllm_rl.config.unread import set_keys
  base = testbeds.testbed("chain").get_config()
  base.unlock()
  base.mode, base.estimator.name = "rl", "elbo"
  assert "estimator.spg_block_len" in set_keys(base)
  assert [line.split("=")[0] for line in unread_settings(base)] == [
      "config.estimator.spg_block_len"]
  assert unread_settings(base, quiet=set_keys(base)) == []
  base.rl.beta_end = 4.0  # an override: not in the testbed's keys
  assert [line.split("=")[0] for line in unread_settings(base, quiet={"estimator.spg_block_len"})
          ] == ["config.rl.beta_end"]


def test_characters_the_tokenizer_lacks_are_named(tmp_path):
  """A tokenizer with an unknown token (the fixture's BPE: <|unk|>, printable ASCII only)
  turned the data's other characters into it silently: a line per split naming how many
  examples hold it, the first one's file:line and the characters it lacks, before anything
  compiles; the answers count where SFT trains on them (the train split); nothing for clean
  data."""
  import json

  from dllm_rl.train.context import build_context
  source = hf_fixture_with_tokenizer(tmp_path)

  def write(name, n, odd=None, start=0):  # the test files' problems: 100 on, held out
    records = [{"question": f"What is {i}+1?", "answer": f"#### {i + 1}"}
               for i in range(start, start + n)]
    for line, record in (odd or {}).items():
      records[line - 1].update(record)
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)

  def notes(mode, train, test):
    config = tiny_run_config(mode, {
        "model.hf_checkpoint": str(source), "task.name": "gsm8k", "task.options": {},
        "task.train_size": 30, "task.val_size": 2, "task.test_size": 8,
        "data.prompt_len": 32, "data.completion_len": 24, "sampler.block_len": 24,
        "sampler.steps": 24, "data.batch_size": 8, "rl.batch_prompts": 8})
    config.task.options.train_file, config.task.options.test_file = train, test
    return build_context(config, str(tmp_path / "w")).notes

  clean = write("clean.jsonl", 32)
  assert notes("sft", clean, write("clean_test.jsonl", 8, start=100)) == ()
  train = write("train.jsonl", 32, {4: {"question": "What is 4€ + 1 (½)?"},
                                    9: {"answer": "fünf\n#### 10"}})
  test = write("test.jsonl", 8, {2: {"question": "What is 2 − 1 ≈ 1?"}}, start=100)
  assert notes("sft", train, test) == (
      f"2 of the 30 train examples hold the tokenizer's unknown token (id 127) in their prompt"
      f" or answer: text its vocabulary lacks, which the model never sees (the first:"
      f" {train}:4, lacking '€', '½'); replace those characters in the data",
      f"1 of the 8 test examples hold the tokenizer's unknown token (id 127) in their prompt:"
      f" text its vocabulary lacks, which the model never sees (the first: {test}:2, lacking"
      " '−', '≈'); replace those characters in the data")
  (line,) = notes("rl", train, write("clean_test.jsonl", 8, start=100))  # no answer trained on
  assert line.startswith("1 of the 30 train examples hold the tokenizer's unknown token (id"
                         " 127) in their prompt: ")
  assert f"(the first: {train}:4, lacking '€', '½')" in line
