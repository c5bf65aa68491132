"""Each production config, shrunk to tiny data, runs one RL step on CPU through the real
code path: a converted HF LLaDA checkpoint (the parity fixture), a HF tokenizer from a
local directory, and a local GSM8K-format JSONL file."""

import json
import os

import numpy as np
import pytest

from dllm_rl.train import modes as run
from dllm_rl.config import ConfigError, load_config_file
from dllm_rl.train.validate import validate
from tests.helpers import assert_test_figures, hf_fixture_with_tokenizer as _hf_dir

tokenizers = pytest.importorskip("tokenizers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = {"llada_tpu": "llada_tiny", "llada_gpu": "llada_tiny", "sdar_tpu": "sdar_tiny",
            "dream_tpu": "dream_tiny"}


# The MATH and Countdown configs (StableDRL configs/{math,countdown}_spg_snis.yaml @26ad014):
# name → (task, tiny records, AdamW lr).
TASK_CONFIGS = {
    "llada_math": ("math500", [{"problem": f"What is {a} plus {b}?", "answer": str(a + b)}
                               for a in range(1, 9) for b in range(1, 6)], 2e-6),
    "llada_countdown": ("countdown_jsonl", [{"nums": [a, b, 3], "target": a + b + 3}
                                            for a in range(1, 9) for b in range(10, 15)], 1e-6),
}


def _load_config(name):
  return load_config_file(os.path.join(ROOT, "configs", f"{name}.py"))


def _gsm8k(tmp_path, n=40):
  path = tmp_path / "gsm8k.jsonl"
  rng = np.random.default_rng(0)
  with open(path, "w") as fh:
    for _ in range(n):
      a, b = (int(x) for x in rng.integers(1, 50, 2))
      fh.write(json.dumps({"question": f"What is {a}+{b}?",
                           "answer": f"{a}+{b}={a + b}\n#### {a + b}"}) + "\n")
  return path


def _tiny(config, hf_dir, data):
  c = config
  c.model.hf_checkpoint = str(hf_dir)
  c.task.options.train_file = str(data)
  c.task.options.test_file = str(data)
  c.task.options.prompt_template = "{question}"
  if c.task.options.get("prompt_preset") == "stabledrl":  # its instruction: 74 characters
    c.task.options.prompt_preset = ""
  c.task.train_size, c.task.val_size, c.task.test_size = 16, 8, 8
  c.data.prompt_len, c.data.completion_len, c.data.batch_size = 32, 16, 8
  if c.model.block_size:  # SDAR: blocks of the checkpoint's size (4)
    c.sampler.steps, c.sampler.block_len = 8, c.model.block_size
    # CPU has no compiled kernel: the dense reference (tests/test_plan.py lowers the
    # config's Mosaic kernel for a TPU slice, tests/models/test_llada2_moe.py compiles it).
    c.estimator.attention_impl = "auto"
  elif c.sampler.kind == "dream":  # Dream's sampler: the whole completion in one block
    c.sampler.steps, c.sampler.block_len = 4, c.data.completion_len
  else:
    c.sampler.steps, c.sampler.block_len = 4, 8
  c.rl.steps, c.rl.batch_prompts, c.rl.group_size, c.rl.eval_every = 1, 8, 2, 0
  # Two updates on the rollout batch: the rl_step scans one body over rl.inner_steps, so more
  # (wd1's 12, ESPO's 8) only repeat it (ESPO's 8: 5 more CPU seconds); the warm-up fits them.
  c.rl.inner_steps = min(c.rl.inner_steps, 2)
  c.rl.warmup_steps = min(c.rl.warmup_steps, c.rl.inner_steps)
  c.estimator.spg_block_len = 8
  c.eval.batch_size, c.eval.num_samples, c.eval.pass_k = 8, 2, (1, 2)
  c.log.progress = False
  return c


# llada_gpu differs from llada_tpu in its layout alone (prompts per batch, eval batch), which
# the tiny form sets for both: the two tiny runs are one config, so the second loads every
# program the first compiled from the persistent compilation cache.
STABLEDRL_PROMPT = ("llada_tpu", "llada_gpu")


@pytest.mark.parametrize("gpu, tpu", [("llada_gpu", "llada_tpu"), ("sdar_gpu", "sdar_tpu"),
                                      ("llada2_gpu", "llada2_tpu"), ("dream_gpu", "dream_tpu")])
def test_a_gpu_config_is_its_tpu_config_in_the_gpu_node_layout(gpu, tpu):
  """The GPU configs change the layout alone (dllm_rl.config.layouts.gpu_node: prompts a step,
  eval batch), never the experiment; the tiny runs below cover their TPU configs."""
  def flat(tree, prefix=""):
    return {k: v for key, value in tree.items() for k, v in (
        flat(value, f"{prefix}{key}.").items() if isinstance(value, dict)
        else [(f"{prefix}{key}", value)])}
  got, want = (flat(_load_config(name).to_dict()) for name in (gpu, tpu))
  assert set(got) == set(want)
  changed = {key for key in want if got[key] != want[key]}
  assert changed == {"rl.batch_prompts", "eval.batch_size"}, changed
  assert (got["rl.batch_prompts"], got["eval.batch_size"]) == (8, 32)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llada_tpu", "llada_gpu", "sdar_tpu", "dream_tpu"])
def test_production_config_runs_one_rl_step_at_tiny_size(tmp_path, name):
  config = _tiny(_load_config(name), _hf_dir(tmp_path, FIXTURES[name]), _gsm8k(tmp_path))
  if name in STABLEDRL_PROMPT:  # StableDRL's prompt, graded by math-verify in its worker, ±1
    config.task.options.prompt_preset, config.data.prompt_len = "stabledrl", 112
  summary = run.run(config, str(tmp_path / "work"))
  assert summary["rl_steps"] == 1 and set(summary["rl_pass_at_k"]) == {"1", "2"}
  if name in STABLEDRL_PROMPT:  # the untrained fixture answers nothing right: every reward -1
    rl = [r for r in map(json.loads, open(tmp_path / "work" / "metrics.jsonl"))
          if r.get("phase") == "rl" and "reward_mean" in r]
    assert rl and rl[0]["reward_mean"] == -1.0
  assert_test_figures(summary, tmp_path / "work", "rl", test_size=8)
  records = [json.loads(line) for line in open(tmp_path / "work" / "metrics.jsonl")]
  step = [r for r in records if r.get("phase") == "rl" and "reward_mean" in r]
  assert step and all(np.isfinite(float(step[0][k])) for k in ("loss", "grad_norm", "ratio_max"))


def test_a_converted_checkpoint_gives_a_run_the_same_start(tmp_path):
  """`python -m dllm_rl.convert import` output works as model.hf_checkpoint too: the run's
  architecture, tokenized data and starting parameters equal those of the HF folder it came
  from (the RL step on them is test_production_config_runs_one_rl_step_at_tiny_size's)."""
  import jax
  from dllm_rl.models.convert import import_hf
  from dllm_rl.train.context import build_context, init_params
  source, converted = _hf_dir(tmp_path), tmp_path / "converted"
  import_hf(str(source), str(converted))
  data = _gsm8k(tmp_path)
  starts = []
  for folder in (source, converted):
    config = _tiny(_load_config("llada_tpu"), folder, data)
    config.model.dtype = "float32"
    ctx = build_context(validate(config), str(tmp_path / "work" / folder.name))
    starts.append((ctx, init_params(ctx)[1]))
  (hf_ctx, hf_params), (ctx, params) = starts
  assert ctx.hf_checkpoint == str(converted) and ctx.model_cfg == hf_ctx.model_cfg
  for split in ("train", "val", "test"):
    got, want = getattr(ctx, split).arrays, getattr(hf_ctx, split).arrays
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
  got, want = jax.tree.leaves(params), jax.tree.leaves(hf_params)
  assert len(got) == len(want) > 0
  assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(got, want))


def test_block_size_must_match_the_sdar_checkpoint(tmp_path):
  config = _tiny(_load_config("sdar_tpu"), _hf_dir(tmp_path, "sdar_tiny"), _gsm8k(tmp_path))
  config.model.block_size = config.sampler.block_len = 8
  with pytest.raises(ConfigError, match="model.block_size.*block_size=4"):
    run.run(config, str(tmp_path / "work"))


def test_production_config_without_overrides_names_the_missing_key():
  with pytest.raises(ConfigError, match="task.options"):
    validate(_load_config("llada_tpu"))


@pytest.mark.parametrize("name", sorted(FIXTURES) + sorted(TASK_CONFIGS))
def test_official_configs_use_the_official_noise_surrogate_and_attention(name):
  """DESIGN: configs that claim the official setup use independent masks for ℓ̂_old and
  every ℓ̂_θ, the SPG surrogate in StableDRL's gradient, and SDAR's block-causal prompt."""
  c = _load_config(name)
  assert not c.estimator.antithetic
  assert c.rl.loss == "stabledrl" and c.rl.clip == "upper" and c.rl.clip_C == 5.0
  if name == "sdar_tpu":
    assert c.estimator.name == "block_elbo" and c.model.prompt_block_causal
    assert c.estimator.attention_impl == "pallas"  # the staircase kernel, never N×N
  else:
    assert c.estimator.name == "spg_block" and c.estimator.spg_omega == 0.5
    assert c.estimator.num_samples == 2 and c.estimator.prompt_mask_prob == 0.15


@pytest.mark.parametrize("name", sorted(TASK_CONFIGS))
def test_math_and_countdown_configs_are_stabledrls(name):
  """The values of the StableDRL yaml files (see TASK_CONFIGS), the d1 prompt preset, and all
  three required values named at once."""
  task, _, lr = TASK_CONFIGS[name]
  c = _load_config(name)
  assert (c.task.name, c.task.options.prompt_preset, c.rl.lr) == (task, "d1", lr)
  # total_steps: 2000 counts optimizer updates (a rollout every num_iterations = 2 of them):
  # 1000 rollout batches, and the linear decay reaches 0 at update 2000
  assert (c.rl.steps * c.rl.inner_steps, c.rl.schedule, c.rl.warmup_steps, c.rl.b1, c.rl.b2,
          c.rl.weight_decay, c.rl.grad_clip, c.rl.kl_coef) == (
              2000, "linear", 0, 0.9, 0.99, 0.1, 0.2, 0.0)
  from dllm_rl.train.rl_loop import rl_optimizer
  schedule = rl_optimizer(c.rl)[1]
  assert float(schedule(1000)) == pytest.approx(1e-6 if lr == 2e-6 else 5e-7)
  assert float(schedule(2000)) == 0.0
  assert (c.rl.group_size, c.rl.inner_steps, c.rl.temperature, c.rl.advantage) == (
      16, 2, 0.9, "centered")
  assert (c.data.completion_len, c.sampler.steps, c.sampler.block_len) == (256, 128, 32)
  assert (c.estimator.spg_beta, c.estimator.spg_block_len, c.model.param_dtype) == (
      1.5, 32, "float32")
  with pytest.raises(ConfigError) as err:
    validate(c)
  assert sorted(e.key for e in err.value.errors) == [
      "model.hf_checkpoint", "task.options.test_file", "task.options.train_file"]


# Prompt widths that hold the d1 preset's prompts with the character tokenizer of _hf_dir.
TINY_PROMPT_LEN = {"llada_math": 288, "llada_countdown": 640}


def _task_tiny(name, tmp_path):
  """``name`` shrunk like :func:`_tiny`, on tiny files of its own task; prompts keep the d1
  preset (one token per character with the tokenizer of :func:`_hf_dir`)."""
  _, records, _ = TASK_CONFIGS[name]
  tmp_path.mkdir(parents=True, exist_ok=True)
  data = tmp_path / "data.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in records))
  c = _tiny(_load_config(name), _hf_dir(tmp_path), data)
  c.data.prompt_len, c.data.prompt_buckets = TINY_PROMPT_LEN[name], ()
  return c


def test_math_and_countdown_configs_validate_with_their_files(tmp_path):
  for name in TASK_CONFIGS:
    validate(_task_tiny(name, tmp_path / name))


@pytest.mark.slow
def test_math_config_runs_one_rl_step_at_tiny_size(tmp_path):
  """llada_math end to end at tiny size (d1 prompts, math-verify on the last \\boxed{});
  llada_countdown differs from it only in the task and the learning rate (the Countdown
  prompt is 640 characters: a tiny run of it costs 2 minutes on 2 cores)."""
  summary = run.run(_task_tiny("llada_math", tmp_path), str(tmp_path / "work"))
  assert summary["rl_steps"] == 1
  assert_test_figures(summary, tmp_path / "work", "rl", test_size=8)


def test_stabledrls_prompt_and_plus_minus_one_reward_and_the_recipes_that_keep_0_1():
  """llada_tpu.py (and the StableDRL configs built on it) use StableDRL's own GSM8K prompt and
  reward: +1 right, -1 otherwise (StableDRL @26ad014 dataloaders/math.py reward_mixed); the
  other recipes built on it keep the task's 0/1 reward (StepRS needs binary rewards)."""
  for name in ("llada_tpu", "llada_gpu", "sdar_tpu", "dream_tpu", "llada2_tpu"):
    c = _load_config(name)
    assert (c.task.options.prompt_preset, c.task.options.wrong_reward,
            c.rl.malformed_reward) == ("stabledrl", -1.0, -1.0), name
  for name in ("wd1", "espo", "trajectory", "steprs_trajectory", "trajectory_sdar",
               "llada_math", "llada_countdown", "coupled_grpo"):
    c = _load_config(name)
    assert c.task.options.get("wrong_reward", 0.0) == 0.0 == c.rl.malformed_reward, name
  assert _load_config("wd1").task.options.prompt_preset == "d1"  # wd1/data_utils.py: d1's
