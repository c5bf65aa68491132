"""Config validation: every error names its key, and fails before compilation."""

import os
import re
import subprocess
import sys

import ml_collections
import pytest

from dllm_rl.config import ConfigError, base_config, load_config_file, locked

from dllm_rl.train.validate import validate
from tests.helpers import set_dotted

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cfg(**updates):
  """``base_config()`` with ``section__key=value`` updates."""
  return set_dotted(base_config(), {k.replace("__", "."): v for k, v in updates.items()})


def test_base_and_tiny_cpu_configs_validate():
  validate(base_config())
  validate(_cfg(profile__steps="2:3", log__peak_tflops=100.0))
  for name in ("tiny_cpu", "tiny_block_cpu"):
    validate(load_config_file(os.path.join(ROOT, "configs", f"{name}.py")))


def test_the_estimator_must_suit_the_model_only_where_rl_scores_with_it():
  """SFT and eval never score with estimator.name: evaluating (or fine-tuning) an SDAR model
  needed --config.estimator.name=block_elbo all the same."""
  block = {"model__block_size": 4, "sampler__block_len": 4}
  for mode in ("sft", "eval"):
    validate(_cfg(mode=mode, **block))
    validate(_cfg(mode=mode, estimator__name="block_elbo"))
  for mode in ("rl", "pipeline"):
    with pytest.raises(ConfigError, match="^config.estimator.name: a block-diffusion model"):
      validate(_cfg(mode=mode, **block))


@pytest.mark.parametrize("updates, key", [
    ({"data__completion_len": 10, "sampler__block_len": 4}, "sampler.block_len"),
    ({"sampler__block_len": 4, "sampler__steps": 3}, "sampler.steps"),
    ({"sampler__steps": 64}, "sampler.steps"),
    ({"sampler__remasking": "low_confidance"}, "sampler.remasking"),
    ({"task__name": "sudokuu"}, "task.name"),
    ({"mode": "train"}, "mode"),
    ({"model__n_kv_heads": 3}, "model.n_kv_heads"),
    ({"model__dtype": "float16"}, "model.dtype"),
    ({"sft__schedule": "step"}, "sft.schedule"),
    ({"sampler__threshold": 1.5}, "sampler.threshold"),
    ({"data__batch_size": 0}, "data.batch_size"),
    ({"estimator__name": "block_elbo", "mode": "rl"}, "estimator.name"),
    ({"model__block_size": 4, "estimator__name": "block_elbo"}, "sampler.block_len"),
    ({"model__block_size": 4, "sampler__block_len": 4, "mode": "rl"}, "estimator.name"),
    ({"model__block_size": -1}, "model.block_size"),
    ({"model__logit_shift": True, "model__block_size": 4, "sampler__block_len": 4,
      "estimator__name": "block_elbo"}, "model.logit_shift"),
    ({"estimator__attention_impl": "triton"}, "estimator.attention_impl"),
    ({"rl__loss": "spg"}, "rl.loss"),
    ({"rl__loss": "espo"}, "rl.loss"),  # needs a summed ELBO (estimator.reduction=sum)
    ({"rl__loss": "grpo_token", "estimator__reduction": "sum",
      "estimator__name": "spg_block"}, "rl.loss"),
    ({"estimator__full_mask_term": True, "estimator__name": "mean_field"},
     "estimator.full_mask_term"),
    ({"rl__clip": "none", "rl__self_normalize": False}, "rl.self_normalize"),
    ({"rl__clip": "lower"}, "rl.clip"),
    ({"mesh__data": 0}, "mesh.data"),
    ({"rl__micro_batch": 3}, "rl.micro_batch"),  # does not divide 8 × 16 sequences
    ({"rl__micro_batch": -2}, "rl.micro_batch"),
    ({"rl__batch_prompts": 128, "task__train_size": 64, "mode": "pipeline"},
     "rl.batch_prompts"),  # more than the training prompts
    ({"rl__malformed_reward": float("nan")}, "rl.malformed_reward"),
    ({"model__logits_chunk": -1}, "model.logits_chunk"),
    ({"model__moe_dispatch": "megablox"}, "model.moe_dispatch"),
    ({"model__moe_dispatch": "mosaic_gpu"}, "model.moe_dispatch"),  # float32 compute: no wgmma
    ({"profile__steps": "3:2"}, "profile.steps"),
    ({"profile__steps": "0:2"}, "profile.steps"),
    ({"profile__steps": "2"}, "profile.steps"),
    ({"profile__steps": "a:b"}, "profile.steps"),
    ({"log__peak_tflops": -1.0}, "log.peak_tflops"),
    # optimizer and model numbers (a nan lr once wrote NaN weights into every RL checkpoint)
    ({"rl__lr": float("nan")}, "rl.lr"),
    ({"rl__lr": -1e-4}, "rl.lr"),  # gradient ascent
    ({"rl__lr": 0.0}, "rl.lr"),
    ({"sft__lr": float("inf")}, "sft.lr"),
    ({"rl__b2": 1.5}, "rl.b2"),
    ({"sft__b1": -1.0}, "sft.b1"),
    ({"rl__weight_decay": -1.0}, "rl.weight_decay"),
    ({"rl__grad_clip": -1.0}, "rl.grad_clip"),
    ({"rl__grad_clip": float("nan")}, "rl.grad_clip"),
    ({"model__rope_theta": 0.0}, "model.rope_theta"),
    ({"model__rms_norm_eps": -1.0}, "model.rms_norm_eps"),
    ({"model__init_std": float("nan")}, "model.init_std"),
    ({"rl__beta": float("nan")}, "rl.beta"),
    ({"estimator__spg_beta": float("nan")}, "estimator.spg_beta"),
    ({"estimator__spg_beta": 0.0}, "estimator.spg_beta"),  # the EUBO's 1/β: NaN losses
    ({"estimator__spg_omega": 2.0}, "estimator.spg_omega"),  # not a mixture of the bounds
    ({"rl__clip_C": float("inf")}, "rl.clip_C"),
    ({"rl__kl_coef": float("inf")}, "rl.kl_coef"),
    ({"sampler__temperature": float("inf")}, "sampler.temperature"),
    ({"rl__temperature": 0.0}, "rl.temperature"),  # greedy groups: advantages 0, no learning
    ({"rl__temperature": -1.0, "sampler__remasking": "random"},
     "rl.temperature"),  # rollouts from softmax(−logits): the least likely tokens
    # set, but silently without effect
    ({"sampler__temperature": 0.7}, "sampler.temperature"),  # no sampler reads it
    ({"sampler__threshold": 0.5, "sampler__remasking": "entropy"}, "sampler.threshold"),
    ({"sampler__cache_refresh": 2}, "sampler.cache_refresh"),  # with cache "none"
    ({"sampler__cache": "dual", "sampler__cache_refresh": 8},
     "sampler.cache_refresh"),  # 8 steps a block (0..7): refreshes only where 0 does
    ({"sampler__cache": "prefix", "sampler__cache_refresh": 8, "sampler__threshold": 0.5},
     "sampler.cache_refresh"),  # threshold mode: at most block_len = 8 steps a block
    ({"profile__steps": "700:800", "mode": "pipeline"}, "profile.steps"),  # after rl.steps
    ({"eval__temperature": 0.0, "eval__num_samples": 4, "eval__pass_k": (1, 4)},
     "eval.temperature"),  # identical samples
    # config.distributed: what the config alone shows, with the other config errors (once
    # raised by initialize() after validation had passed; ports were not range-checked)
    ({"distributed__coordinator_address": "10.0.0.1:70000"}, "distributed.coordinator_address"),
    ({"distributed__coordinator_address": "10.0.0.1:0"}, "distributed.coordinator_address"),
    ({"distributed__coordinator_address": "10.0.0.1"}, "distributed.coordinator_address"),
    ({"distributed__initialize": "explicit", "distributed__coordinator_address": "h:port"},
     "distributed.coordinator_address"),
    ({"distributed__num_processes": 2, "distributed__process_id": 2}, "distributed.process_id"),
    ({"distributed__process_id": -2}, "distributed.process_id"),
    ({"distributed__num_processes": -1}, "distributed.num_processes"),
    ({"distributed__local_device_ids": "0,0"}, "distributed.local_device_ids"),
    ({"distributed__local_device_ids": "0,a", "distributed__initialize": "never"},
     "distributed.local_device_ids"),
    ({"distributed__initialize": "sometimes"}, "distributed.initialize"),
])
def test_bad_values_name_their_key(updates, key):
  with pytest.raises(ConfigError) as err:
    validate(_cfg(**updates))
  assert err.value.key == key and str(err.value).startswith(f"config.{key}:")


def test_distributed_values_left_to_the_environment_validate():
  """Only initialize() can check what DLLM_* env vars fill in: a process id without a count,
  a count without an id, a port at either end of its range, and initialize="never" (the
  process keys unread) pass validation."""
  for updates in ({"distributed__process_id": 3}, {"distributed__num_processes": 4},
                  {"distributed__coordinator_address": "[::1]:65535",
                   "distributed__num_processes": 2, "distributed__process_id": 1},
                  {"distributed__coordinator_address": "node-a:1"},
                  {"distributed__initialize": "never", "distributed__process_id": 9,
                   "distributed__num_processes": 2, "distributed__coordinator_address": "x"}):
    validate(_cfg(**updates))


def test_a_non_finite_number_is_one_error_and_greedy_rollouts_need_random_remasking():
  """nan fails every comparison, so it is reported once, as not finite; rl.temperature 0 is
  allowed where the unmasking order is random (a group's completions can still differ)."""
  with pytest.raises(ConfigError) as err:
    validate(_cfg(rl__lr=float("nan")))
  assert str(err.value) == "config.rl.lr: must be finite, got nan"
  assert "learns nothing" in str(pytest.raises(ConfigError, validate, _cfg(rl__temperature=0.0)
                                               ).value)
  validate(_cfg(rl__temperature=0.0, sampler__remasking="random"))


def test_a_cache_refresh_inside_a_block_validates():
  """Below the steps of a block the refresh runs: 8 steps a block, refresh every 7 (at step 7);
  threshold mode counts up to sampler.block_len steps."""
  validate(_cfg(sampler__cache="dual", sampler__cache_refresh=7))
  validate(_cfg(sampler__cache="prefix", sampler__cache_refresh=7, sampler__threshold=0.5))


def test_a_negative_eval_temperature_is_one_error_naming_its_value():
  """-1 is below 0, not "0 with eval.num_samples=8 draws identical samples" as well."""
  with pytest.raises(ConfigError) as err:
    validate(_cfg(eval__temperature=-1.0))
  assert [str(e) for e in getattr(err.value, "errors", [err.value])] == [
      "config.eval.temperature: must be >= 0, got -1.0"]


def test_a_short_sft_run_names_its_warmup_bound_and_the_fix():
  """`--config.sft.steps=4` under the default 50-step warm-up: both numbers and the way out
  (the message once read only "must be in [0, sft.steps]")."""
  with pytest.raises(ConfigError) as err:
    validate(_cfg(sft__steps=4))
  assert str(err.value) == ("config.sft.warmup_steps: must be in [0, sft.steps] = [0, 4], got 50"
                            " (for a run this short set sft.warmup_steps=0)")
  validate(_cfg(sft__steps=4, sft__warmup_steps=0))


def test_the_sft_batch_bounds_the_train_split_only_in_modes_that_train_sft():
  """data.batch_size is the SFT batch: an RL run (or eval) on 12 problems is not refused for
  it (once: "task.train_size: 12 is smaller than data.batch_size=64" in mode=rl)."""
  for mode in ("rl", "eval"):
    validate(_cfg(mode=mode, task__train_size=12, rl__batch_prompts=2))
  for mode in ("sft", "pipeline"):
    with pytest.raises(ConfigError, match="data.batch_size = 64, the SFT batch") as err:
      validate(_cfg(mode=mode, task__train_size=12, rl__batch_prompts=2))
    assert err.value.key == "task.train_size"


def test_per_token_sum_estimators_serve_espo_and_grpo_token():
  for loss in ("espo", "grpo_token"):
    for name in ("elbo", "mean_field"):
      validate(_cfg(rl__loss=loss, estimator__name=name, estimator__reduction="sum",
                    estimator__antithetic=loss == "grpo_token" and name == "elbo"))


def test_grpo_token_on_elbo_needs_shared_masks():
  """Per-token ratios on independent ELBO masks compare a token scored in one draw with the
  same token unscored in the other: an error naming estimator.antithetic. ESPO's sequence-level
  ratio and mean_field's fully masked completion are fine with independent draws."""
  with pytest.raises(ConfigError, match="estimator.antithetic: must be True with rl.loss=grpo_tok"):
    validate(_cfg(rl__loss="grpo_token", estimator__name="elbo", estimator__reduction="sum"))
  validate(_cfg(rl__loss="espo", estimator__name="elbo", estimator__reduction="sum"))
  validate(_cfg(rl__loss="grpo_token", estimator__name="mean_field", estimator__reduction="sum"))


def test_unknown_registry_name_lists_choices():
  with pytest.raises(ConfigError, match="Did you mean 'low_confidence'"):
    validate(_cfg(sampler__remasking="low_confidance"))


def test_unknown_and_mistyped_keys():
  c = base_config()
  c.sft.stepz = 3
  with pytest.raises(ConfigError,
                     match=r"config\.sft\.stepz: unknown key; did you mean sft\.steps"):
    validate(c)
  c = base_config()
  with pytest.raises(TypeError):
    c.sft.steps = "many"  # ConfigDict is type-safe on assignment
  raw = base_config().to_dict()
  raw["sft"]["lr"] = "fast"
  with pytest.raises(ConfigError, match=r"config\.sft\.lr: expected float"):
    validate(ml_collections.ConfigDict(raw))


def test_other_frameworks_names_suggest_ours():
  """A misspelt long name that another framework uses (TRL's learning_rate,
  num_generations) points at our key, on the command line and in a config file."""
  from dllm_rl.config import apply_overrides as apply
  errors = apply(base_config(), [("rl.lerning_rate", "1e-3"), ("rl.num_generations", "4")])
  assert [str(e) for e in errors] == [
      "config.rl.lerning_rate: unknown key; did you mean rl.lr (other frameworks' "
      "'learning_rate')?",
      "config.rl.num_generations: unknown key; did you mean rl.group_size (other frameworks' "
      "'num_generations')?"]
  # an update count of TRL / SPG / StableDRL: rl.steps counts rollout batches, and says so
  [total] = apply(base_config(), [("rl.total_steps", "2000")])
  assert str(total).startswith("config.rl.total_steps: unknown key; did you mean rl.steps (it"
                               " counts rollout batches, each followed by rl.inner_steps")
  assert "rl.steps = theirs / rl.inner_steps" in str(total)
  [sft] = apply(base_config(), [("sft.max_steps", "2000")])  # SFT steps are updates: no note
  assert str(sft) == "config.sft.max_steps: unknown key; did you mean sft.steps?"
  c = base_config()
  c.rl.learning_rate = 1e-3
  with pytest.raises(ConfigError, match=r"config\.rl\.learning_rate: unknown key; did you mean "
                                        r"rl\.lr"):
    validate(c)


def test_every_required_placeholder_is_named_at_once():
  """configs/llada_tpu.py leaves three values for the user: all three are reported, and the
  task is not built from the placeholders."""
  from dllm_rl.config import ConfigErrors
  c = load_config_file(os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs",
                                    "llada_tpu.py"))
  with pytest.raises(ConfigErrors) as err:
    validate(c)
  lines = str(err.value).splitlines()
  for key in ("model.hf_checkpoint", "task.options.train_file", "task.options.test_file"):
    assert any(line.startswith(f"config.{key}: required value not set") for line in lines), key
  assert not any("does not exist" in line for line in lines)


def test_mode_eval_asks_for_a_required_train_file_only_where_it_reads_it(tmp_path):
  """mode=eval reads only the test split: beside a test file, configs/llada_tpu.py's train
  file placeholder is no error (it was, though task_options leaves that file out); without a
  test file the train file is read, and its error says a test file leaves it out (the other
  modes keep the plain error)."""
  c = load_config_file(os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs",
                                    "llada_tpu.py"))
  test = tmp_path / "test.jsonl"
  test.write_text('{"question": "What is 1+1?", "answer": "1+1\\n#### 2"}\n')
  c.model.hf_checkpoint, c.task.options.test_file, c.mode = "/ckpt", str(test), "eval"
  validate(c)
  for mode, test_file, hint in (("eval", "", True), ("rl", str(test), False)):
    c.mode, c.task.options.test_file = mode, test_file
    with pytest.raises(ConfigError) as err:
      validate(c)
    assert str(err.value).startswith("config.task.options.train_file: required value not set")
    assert ("mode=eval reads it only without a test file: --config.task.options.test_file=..."
            " leaves it out" in str(err.value)) == hint, mode


def test_mode_eval_neither_loads_nor_checks_a_train_file_beside_its_test_file(tmp_path):
  """mode=eval reads the test split only: a given train file that is malformed (or huge) no
  longer stops (or slows) it, as it did when validation and the context built the task from
  both files. Without a test file the test split is carved out of the train file, which is
  then read; the training modes read it as before."""
  from dllm_rl.train.context import task_options
  test = tmp_path / "test.jsonl"
  test.write_text('{"question": "What is 1+1?", "answer": "1+1\\n#### 2"}\n')
  bad = tmp_path / "train.jsonl"
  bad.write_text('{"question": "x"\n')
  c = base_config()
  c.task.name, c.model.hf_checkpoint = "gsm8k", "/ckpt"
  c.task.options = ml_collections.ConfigDict({"train_file": str(bad), "test_file": str(test)})
  c.mode = "eval"
  validate(c)
  assert task_options(c) == {"test_file": str(test)}
  c.task.options.test_file = ""
  assert task_options(c) == {"train_file": str(bad), "test_file": ""}
  for mode, test_file in (("eval", ""), ("rl", str(test))):
    c.mode, c.task.options.test_file = mode, test_file
    with pytest.raises(ConfigError, match=r"train\.jsonl:1: invalid JSON"):
      validate(c)


def test_locked_config_rejects_typos_where_written():
  c = locked(base_config())
  with pytest.raises(AttributeError):
    c.sampler.block_lenght = 4
  c.task.options.num_digits = 2  # task options stay free-form (checked by the task)
  validate(c)


def test_bad_task_option_is_reported():
  c = base_config()
  c.task.options.num_digitz = 2
  with pytest.raises(ConfigError, match=r"config\.task\.options:.*num_digitz"):
    validate(c)


@pytest.mark.parametrize("override, key", [
    ("--config.sampler.block_len=3", "sampler.block_len"),
    ("--config.sft.stepz=3", "stepz"),
])
def test_cli_fails_fast_naming_the_key(tmp_path, override, key):
  """Refused before anything runs: nothing is written to the workdir (no timing asserted)."""
  proc = subprocess.run(
      [sys.executable, "-m", "dllm_rl.main", "--config=configs/tiny_cpu.py",
       f"--workdir={tmp_path}", override],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode != 0
  assert key in proc.stderr
  assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())


# --- every error at once, overrides on the embedded default, no traceback (issue 11) ---

from hypothesis import given, settings, strategies as st  # noqa: E402

from dllm_rl.config import ConfigErrors, apply_overrides  # noqa: E402
from dllm_rl.config.defaults import get_config as default_config  # noqa: E402


def test_validate_lists_every_error_at_once():
  c = base_config()
  c.sft.stepz = 3
  c.seed = -1
  c.sampler.threshold = 1.5
  c.checkpoint.save_every_seconds = -1.0
  with pytest.raises(ConfigErrors) as err:
    validate(c)
  keys = [e.key for e in err.value.errors]
  assert keys == ["sft.stepz", "sampler.threshold", "checkpoint.save_every_seconds", "seed"]
  assert str(err.value).splitlines()[0].startswith("config.sft.stepz: unknown key")


def test_mistyped_key_is_reported_and_the_rest_still_checked():
  raw = base_config().to_dict()
  raw["sampler"]["block_len"] = "four"
  raw["train"]["max_consecutive_nonfinite"] = 0
  with pytest.raises(ConfigErrors) as err:
    validate(ml_collections.ConfigDict(raw))
  assert [e.key for e in err.value.errors] == ["sampler.block_len",
                                               "train.max_consecutive_nonfinite"]


def test_apply_overrides_parses_types_and_collects_errors():
  c = default_config()
  errors = apply_overrides(c, [("rl.lr", "1e-3"), ("log.progress", "false"),
                               ("eval.pass_k", "1,2"), ("task.options.num_digits", "2"),
                               ("rl.nosuch", "1"), ("seed", "x"), ("rl", "3"),
                               ("sft.steps.deeper", "1"), ("nosect.key", "1")])
  assert c.rl.lr == 1e-3 and c.log.progress is False and tuple(c.eval.pass_k) == (1, 2)
  assert c.task.options.num_digits == 2
  assert [e.key for e in errors] == ["rl.nosuch", "seed", "rl", "sft.steps", "nosect"]
  assert "expected int, got 'x'" in str(errors[1])


def test_a_tuple_of_names_takes_bare_comma_separated_words():
  """``--config.lora.targets=q,v`` (as the checkpoint-layout error's fix writes it) and the
  literal forms give the same tuple; an int tuple still refuses words."""
  for text in ("q,v", "(q, v)", "('q', 'v')", "['q','v']"):
    c = default_config()
    assert apply_overrides(c, [("lora.targets", text)]) == []
    assert tuple(c.lora.targets) == ("q", "v")
  c = default_config()
  assert apply_overrides(c, [("lora.targets", "q")]) == [] and tuple(c.lora.targets) == ("q",)
  errors = apply_overrides(default_config(), [("eval.pass_k", "a,b")])
  assert [e.key for e in errors] == ["eval.pass_k"]


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(key=st.sampled_from([k for k, _ in base_config().items(preserve_field_references=False)
                            if not isinstance(base_config()[k], ml_collections.ConfigDict)]
                           + [f"{s}.{k}" for s in base_config().keys()
                              if isinstance(base_config()[s], ml_collections.ConfigDict)
                              for k in base_config()[s].keys() if s != "task" or k != "options"]),
       text=st.one_of(st.integers(-2**40, 2**40).map(str),
                      st.floats(allow_nan=True).map(str),
                      st.sampled_from(["", "true", "x", "-1", "0", "(1,)", "1,0"]),
                      st.text(max_size=8)))
def test_any_single_override_gives_config_errors_only(key, text):
  """Whatever one override says, validation reports ConfigErrors naming keys, never crashes."""
  c = default_config()
  errors = apply_overrides(c, [(key, text)])
  try:
    validate(c)
  except ConfigError as err:
    errors += getattr(err, "errors", [err])
  for e in errors:
    assert str(e).startswith(f"config.{e.key}: ")


def test_cli_overrides_on_embedded_default_list_all_errors(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "dllm_rl.main", f"--workdir={tmp_path}", "--config.rl.lr=1e-3",
       "--config.rl.nosuch=1", "--config.seed=-1", "--config.rl.steps=many"],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 2, proc.stderr
  assert "Traceback" not in proc.stderr
  assert proc.stderr.splitlines() == [
      "error: config.rl.nosuch: unknown key",
      "error: config.rl.steps: expected int, got 'many'",
      "error: config.seed: must be in [0, 2**31), got -1"]
  assert not os.path.exists(tmp_path / "checkpoints")


def test_micro_batch_must_split_over_the_batch_devices():
  from dllm_rl.parallel.mesh import make_mesh
  from dllm_rl.train.context import check_batch_sizes
  config = _cfg(mode="rl", rl__micro_batch=4, data__batch_size=64, eval__batch_size=128)
  mesh = make_mesh({"data": 8, "fsdp": 1, "tensor": 1})
  with pytest.raises(ConfigError) as err:
    check_batch_sizes(config, mesh)
  assert err.value.key == "rl.micro_batch" and "data × fsdp = 8" in str(err.value)
  check_batch_sizes(_cfg(mode="rl", rl__micro_batch=16), mesh)  # a multiple of 8 is fine
  config.rl.batch_prompts = config.eval.batch_size = 12  # every misfit at once, in key order
  with pytest.raises(ConfigErrors) as err:
    check_batch_sizes(config, mesh)
  assert [e.key for e in err.value.errors] == ["rl.batch_prompts", "eval.batch_size",
                                               "rl.micro_batch"]


def test_batch_sizes_a_mode_never_reads_are_not_checked_against_the_mesh():
  """mode=rl never reads the SFT batch (data.batch_size), mode=sft the RL ones: a value
  that does not split over the mesh is no error there; the mode's own batches still are."""
  from dllm_rl.parallel.mesh import make_mesh
  from dllm_rl.train.context import check_batch_sizes
  mesh = make_mesh({"data": 8, "fsdp": 1, "tensor": 1})
  check_batch_sizes(_cfg(mode="rl", data__batch_size=12, rl__batch_prompts=16,
                         eval__batch_size=8), mesh)
  check_batch_sizes(_cfg(mode="sft", rl__batch_prompts=12, rl__micro_batch=4,
                         data__batch_size=16, eval__batch_size=8), mesh)
  for mode, key in (("pipeline", "data.batch_size"), ("rl", "rl.batch_prompts"),
                    ("eval", "eval.batch_size")):
    config = _cfg(mode=mode, data__batch_size=16, rl__batch_prompts=16, eval__batch_size=16)
    config[key.split(".")[0]][key.split(".")[1]] = 12
    with pytest.raises(ConfigError) as err:
      check_batch_sizes(config, mesh)
    assert err.value.key == key


@pytest.mark.parametrize("sizes, key", [((30, 20, 8), "task.train_size"),
                                        ((8, 4, 50), "task.test_size"),
                                        ((30, 20, 50), "task.train_size")])
def test_a_data_file_smaller_than_the_split_names_the_sizes(tmp_path, sizes, key):
  """40 GSM8K lines cannot give train_size + val_size = 50 (or test_size = 50): a ConfigError
  naming the key, the counts and the file, before anything compiles; both splits too large:
  both named at once."""
  from dllm_rl.train.context import build_context
  from tests.test_production_configs import _gsm8k
  path = str(_gsm8k(tmp_path))
  c = base_config()
  c.task.name = "gsm8k"
  c.task.options = {"train_file": path, "test_file": path}
  c.task.train_size, c.task.val_size, c.task.test_size = sizes
  c.data.batch_size = c.rl.batch_prompts = c.eval.batch_size = 8
  with pytest.raises(ConfigError, match=rf"config\.{key}: .*has only 40.*lower it") as err:
    build_context(validate(c), str(tmp_path / "w"))
  assert err.value.key == key
  keys = [e.key for e in getattr(err.value, "errors", [err.value])]
  assert keys == (["task.train_size", "task.test_size"] if sizes == (30, 20, 50) else [key])


def test_a_generated_task_too_small_for_the_sizes_names_keys_count_and_options(tmp_path,
                                                                              monkeypatch):
  """1-digit addition (100 instances) at the default sizes (20000 + 256, 256): both size
  keys named, with each split's count and the options that enlarge the task (with their
  values), not a file, before any draw (the splits are counted; was the stall, 5,000 draws
  past the last new instance, and a count found, not the count there is)."""
  from dllm_rl.tasks.arithmetic import ArithmeticTask
  from dllm_rl.train.context import build_context
  draws = []
  sample = ArithmeticTask.sample
  monkeypatch.setattr(ArithmeticTask, "sample", lambda self, rng: draws.append(1) or sample(
      self, rng))
  c = base_config()
  c.task.name, c.task.options = "arithmetic", {"num_digits": 1, "test_fraction": 0.5}
  c.data.batch_size = c.rl.batch_prompts = c.eval.batch_size = 8
  with pytest.raises(ConfigError) as err:
    build_context(validate(c), str(tmp_path / "w"))
  assert not draws
  train, test = err.value.errors
  assert train.key == "task.train_size" and test.key == "task.test_size"
  assert ("task 'arithmetic': its options give only 49 distinct 'train' instances, fewer than"
          " the 20256 requested (task.train_size + task.val_size = 20000 + 256): lower it or"
          " raise task.options.num_digits (now 1) or add '-' or '*' to task.options.ops (now"
          " '+') for more distinct instances") in str(train)
  assert "only 51 distinct 'test' instances, fewer than the 256 requested" in str(test)
  assert "file" not in str(err.value)


def test_countdown_at_the_default_sizes_fails_at_once_naming_what_to_raise(tmp_path,
                                                                          monkeypatch):
  """--config.task.name=countdown at the default sizes: its default options (3 numbers in
  [1, 20], target <= 100) have 14,593 training instances, fewer than 20,000 + 256, so the run
  stops before drawing the train split (was ~2 min: 814k draws to give up on the last rare
  instances) with the count and the options to raise, with their values; the test split (256)
  is fine."""
  from dllm_rl.tasks.countdown import CountdownTask
  from dllm_rl.train.context import build_context
  draws = []
  sample = CountdownTask.sample
  monkeypatch.setattr(CountdownTask, "sample", lambda self, rng: draws.append(1) or sample(
      self, rng))
  c = base_config()
  c.task.name, c.task.options = "countdown", {}
  c.data.batch_size = c.rl.batch_prompts = c.eval.batch_size = 8
  with pytest.raises(ConfigError) as err:
    build_context(validate(c), str(tmp_path / "w"))
  assert len(draws) < 21_000  # the test split's 256 at most; the old give-up took 814k
  assert err.value.key == "task.train_size" and not getattr(err.value, "errors", None)
  assert ("task 'countdown': its options give only 14593 distinct 'train' instances, fewer than"
          " the 20256 requested (task.train_size + task.val_size = 20000 + 256): lower it or"
          " raise task.options.max_number (now 20) or task.options.max_target (now 100) or set"
          " task.options.num_numbers=4 (now 3) for more distinct instances") in str(err.value)


@pytest.mark.parametrize("body, expected", [
    ("  c.rl.lr = undefined_name\n", r", line 6: NameError: name 'undefined_name' is not defined"),
    ("  c.rl.lr = 'abc'\n", r", line 6: TypeError: Could not override field 'lr'.*"),
    ("  c.rl.lr = (\n", r", line 6: SyntaxError: .*"),
    (None, r": IsADirectoryError: .* is a folder: name a config file .*"),
    ("", r": AttributeError: .* defines no get_config\(\)"),
])
def test_a_broken_config_file_is_one_error_naming_its_line(tmp_path, capsys, body, expected):
  """A config file that raises (or does not parse) is `error: --config=PATH, line N: ...`,
  exit 2, no traceback; a folder or a file without get_config() is named as such."""
  from dllm_rl.config import cli
  path = tmp_path / "broken.py"
  if body is None:
    path.mkdir()
  else:
    head = "from dllm_rl.config import base_config\n\n\n" if body else "x = 1\n"
    path.write_text(head + ("def get_config():\n  c = base_config()\n" + body + "  return c\n"
                            if body else ""))
  with pytest.raises(SystemExit) as stop:
    cli.load(str(path), [], check=validate)
  err = capsys.readouterr().err
  assert stop.value.code == 2 and "Traceback" not in err
  assert re.fullmatch(rf"error: --config={re.escape(str(path))}{expected}\n", err), err


def test_a_variant_of_a_config_without_variants_says_so(capsys):
  """``--config=configs/tiny_cpu.py:tiny`` (the baselines' ``:tiny`` on a file without
  variants) was "TypeError: get_config() takes 0 positional arguments but 1 was given",
  which names neither the suffix nor the fix."""
  from dllm_rl.config import cli
  tiny = os.path.join(ROOT, "configs", "tiny_cpu.py")
  with pytest.raises(SystemExit) as stop:
    cli.load(f"{tiny}:tiny", [], check=validate)
  assert stop.value.code == 2
  assert capsys.readouterr().err == (
      f"error: --config={tiny}:tiny: TypeError: {tiny}'s get_config() takes no argument, so"
      f" ':tiny' names no variant of it: pass --config={tiny}\n")
  wd1 = os.path.join(ROOT, "configs", "wd1.py")
  assert load_config_file(f"{wd1}:tiny").rl.loss == "wd1"  # a file with variants


def test_a_config_path_outside_the_checkout_says_where_the_file_is(tmp_path, monkeypatch, capsys):
  """``--config=configs/wd1.py:tiny`` run from another folder: the error names the folder it
  was read from and the checkout's file; an install without the checkout (a wheel) is told
  that configs/ comes with the checkout."""
  from dllm_rl.config import cli, schema
  monkeypatch.chdir(tmp_path)
  with pytest.raises(SystemExit) as stop:
    cli.load("configs/wd1.py:tiny", [], check=validate)
  checkout = os.path.dirname(os.path.dirname(os.path.abspath(schema.__file__)))
  checkout = os.path.dirname(checkout)
  assert stop.value.code == 2
  assert capsys.readouterr().err == (
      f"error: --config=configs/wd1.py:tiny: FileNotFoundError: configs/wd1.py: no such file"
      f" (relative paths are read from the current folder, {tmp_path}); this install's"
      f" checkout has it: --config={os.path.join(checkout, 'configs', 'wd1.py')}:tiny\n")
  wheel = schema.missing_config("configs/wd1.py", cwd="/x", checkout=str(tmp_path))
  assert wheel.endswith("; the configs/ files come with the source checkout (README: Set-up),"
                        " not with an installed wheel; without --config the embedded default"
                        " runs")
  assert schema.missing_config("/abs/c.py") == "/abs/c.py: no such file"


def test_a_config_file_that_returns_nothing_or_a_part_is_said_or_completed(tmp_path):
  """get_config() without its return is an error naming it; one that builds only some
  sections gets the defaults of the others (validation checked it so; the run then failed
  on the first missing section with a traceback)."""
  none = tmp_path / "none_cfg.py"
  none.write_text("from dllm_rl.config import base_config\n\n"
                  "def get_config():\n  c = base_config()\n")
  with pytest.raises(TypeError, match=r"get_config\(\) returned NoneType, not an"
                                      r" ml_collections.ConfigDict \(a missing `return`\?"):
    load_config_file(str(none))
  part = tmp_path / "part_cfg.py"
  part.write_text("import ml_collections\n\n"
                  "def get_config():\n  return ml_collections.ConfigDict({'rl': {'lr': 1e-3}})\n")
  c = load_config_file(str(part))
  want = base_config()
  assert c.rl.lr == 1e-3 and c.rl.steps == want.rl.steps
  assert c.distributed.to_dict() == want.distributed.to_dict()
  assert set(c.keys()) == set(want.keys())
  validate(c)


def test_another_task_on_the_command_line_drops_the_files_task_options(capsys):
  """--config.task.name=countdown on the embedded default (arithmetic's num_digits, ...):
  the file's options are dropped and said (by the CLI, once the config is good), options
  given beside it stay, and the config validates; the same task name keeps them."""
  from dllm_rl.config import apply_overrides as apply
  from dllm_rl.config import cli
  from dllm_rl.config.defaults import get_config as default_config
  c, notes = default_config(), []
  assert "num_digits" in c.task.options
  assert apply(c, [("task.options.max_number", "20"), ("task.name", "countdown")], notes) == []
  assert c.task.name == "countdown" and c.task.options.to_dict() == {"max_number": 20}
  assert len(notes) == 1 and notes[0].startswith(
      "--config.task.name=countdown replaces the config's task 'arithmetic': its task.options"
      " ['num_digits',")
  validate(c)
  same, notes = default_config(), []
  assert apply(same, [("task.name", "arithmetic")], notes) == [] and notes == []
  assert "num_digits" in same.task.options
  capsys.readouterr()
  cli.load(None, [("task.name", "countdown")], check=validate, default=default_config)
  assert capsys.readouterr().err.startswith("note: --config.task.name=countdown replaces")


def test_the_dropped_options_said_are_not_those_given_beside_the_new_task():
  """configs/dream_tpu.py (gsm8k) with --config.task.name=code and both files given: the
  note named train_file and test_file as dropped, as if the ones given were lost."""
  from dllm_rl.config import apply_overrides as apply
  c, notes = load_config_file(os.path.join(ROOT, "configs", "dream_tpu.py")), []
  assert apply(c, [("task.name", "code"), ("task.options.train_file", "a.jsonl"),
                   ("task.options.test_file", "b.jsonl")], notes) == []
  assert c.task.options.to_dict() == {"train_file": "a.jsonl", "test_file": "b.jsonl"}
  assert len(notes) == 1 and "task.options ['prompt_preset', 'wrong_reward'] are dropped" \
      in notes[0]


def test_a_task_option_of_the_wrong_type_names_the_type():
  """The file's option is an int: 'three' is said as such, not as ml_collections' "Could not
  override field ... (reference)"."""
  from dllm_rl.config import apply_overrides as apply
  from dllm_rl.config.defaults import get_config as default_config
  [err] = apply(default_config(), [("task.options.num_digits", "three")])
  assert str(err) == ("config.task.options.num_digits: expected int (the config's value is 3),"
                      " got 'three'")


def test_a_locked_config_files_task_options_stay_free_form(tmp_path):
  """load_config_file completes a config and keeps locked()'s shape: locked, with free-form
  task options (a test or a config built on another sets a new option)."""
  c = load_config_file(os.path.join(ROOT, "configs", "llada_math.py"))
  c.task.options.prompt_template = "{question}"
  with pytest.raises((KeyError, AttributeError)):
    c.rl.no_such_key = 1


def test_per_token_losses_name_every_estimator_that_gives_per_token_sums():
  """grpo_token / espo need per-token sums: the error names mean_field, elbo and trajectory
  (each with reduction=sum), and trajectory with sum validates."""
  c = default_config()
  c.rl.loss, c.estimator.name = "grpo_token", "spg_block"
  with pytest.raises(ConfigError, match=r"rl\.loss: grpo_token .*mean_field .*elbo .*trajectory"):
    validate(c)
  c.estimator.name, c.estimator.reduction = "trajectory", "sum"
  validate(c)
