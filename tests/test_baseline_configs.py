"""configs/wd1.py, espo.py, coupled_grpo.py: both forms validate (the full-scale one once
its required paths are given, without weights), carry the official hyper-parameters, and
the full-scale one runs one RL step at tiny size through the real code path."""

import json
import os

import numpy as np
import pytest

from dllm_rl.config import ConfigError, load_config_file, recipes
from dllm_rl.config.defaults import get_config as default_config
from dllm_rl.train.validate import validate
from tests import test_production_configs as prod

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = ("wd1", "espo", "coupled_grpo")
FIXTURE = {"wd1": "llada_tiny", "espo": "llada_tiny", "coupled_grpo": "dream_tiny"}

# The official values each config file cites (its docstring names the files).
OFFICIAL = {
    "wd1": {  # xiaohangt/wd1 run/wll_NP_gsm8k.sh + wd1/train.yaml
        "rl.loss": "wd1", "rl.advantage": "centered", "rl.inner_steps": 12,
        "rl.group_size": 6, "rl.batch_prompts": 8, "rl.lr": 3e-6, "rl.schedule": "constant",
        "rl.weight_decay": 0.1, "rl.grad_clip": 0.2, "rl.temperature": 0.9, "rl.kl_coef": 0.0,
        "estimator.name": "mean_field", "estimator.reduction": "sum",
        "estimator.prompt_mask_prob": 0.15, "data.completion_len": 256, "sampler.steps": 128,
        "sampler.block_len": 32, "data.prompt_len": 200},
    "espo": {  # ML-GSAI/ESPO recipes/run_gsm8k_llada.sh + recipes/train.yaml
        "rl.loss": "espo", "rl.advantage": "leave_one_out", "rl.inner_steps": 8,
        "rl.group_size": 6, "rl.batch_prompts": 16, "rl.lr": 3e-6, "rl.schedule": "constant",
        "rl.weight_decay": 0.01, "rl.grad_clip": 0.2, "rl.eps": 0.2, "rl.temperature": 1.0,
        "rl.kl_coef": 1e-3 / 256, "rl.kl_estimator": "k2", "estimator.name": "elbo",
        "estimator.coupled": True, "estimator.num_samples": 4, "estimator.reduction": "sum",
        "estimator.antithetic": True, "estimator.prompt_mask_prob": 0.0,
        "data.completion_len": 256, "sampler.steps": 256, "sampler.block_len": 32,
        "data.prompt_len": 400},
    "coupled_grpo": {  # apple/ml-diffucoder recipes/config_coupled_code.yaml
        "rl.loss": "grpo_token", "rl.advantage": "leave_one_out", "rl.inner_steps": 2,
        "rl.group_size": 10, "rl.batch_prompts": 8, "rl.lr": 1e-6, "rl.schedule": "cosine",
        "rl.weight_decay": 0.1, "rl.grad_clip": 0.2, "rl.eps": 0.5, "rl.temperature": 1.0,
        "rl.warmup_steps": 1,  # warmup_ratio 1e-4, rounded up by HF's ceil
        "rl.kl_coef": 0.01, "rl.kl_estimator": "k3", "rl.kl_level": "token",
        "rl.ref_sync_every": 64, "rl.ref_sync_alpha": 0.6,
        "estimator.name": "elbo", "estimator.coupled": True, "estimator.num_samples": 2,
        "estimator.t_eps": 0.2, "estimator.full_mask_term": True, "estimator.reduction": "sum",
        "estimator.antithetic": True, "estimator.prompt_mask_prob": 0.0,
        "data.completion_len": 256, "sampler.steps": 256, "sampler.block_len": 256,
        "sampler.remasking": "entropy", "sampler.kind": "dream", "sampler.top_p": 0.95,
        "sampler.top_k": 50,  # what diffusion_generate leaves it at (zoo/generators.py)
        "data.prompt_len": 200, "rl.min_lr_ratio": 0.1, "task.name": "code",
        "task.options.exec_weight": 2.0, "task.options.format_weight": 0.5,
        "data.system_prompt": "You are a helpful assistant."},
}


def _data(tmp_path, name, n=40):
  """A JSONL file of the config's task: GSM8K-style, or code problems for coupled_grpo."""
  if name != "coupled_grpo":
    return prod._gsm8k(tmp_path, n)
  path = tmp_path / "code.jsonl"
  path.write_text("".join(json.dumps({"question": f"f{i}(x) = x+{i}",
                                      "test_cases": [f"assert f{i}(1) == {1 + i}"]}) + "\n"
                          for i in range(n)))
  return path


def _load(name, variant=""):
  return load_config_file(os.path.join(ROOT, "configs", f"{name}.py" + (
      f":{variant}" if variant else "")))


def _get(config, dotted):
  node = config
  for part in dotted.split("."):
    node = node[part]
  return node


@pytest.mark.parametrize("name", NAMES)
def test_full_scale_config_has_the_official_values_and_validates_given_its_paths(tmp_path, name):
  config = _load(name)
  for key, want in OFFICIAL[name].items():
    assert _get(config, key) == pytest.approx(want), key
  assert config.rl.b1 == 0.9 and config.rl.b2 == 0.99
  with pytest.raises(ConfigError, match="model.hf_checkpoint"):
    validate(config)
  config.model.hf_checkpoint = str(tmp_path)
  data = str(_data(tmp_path, name, n=config.task.train_size + config.task.val_size))
  config.task.options.train_file = config.task.options.test_file = data
  validate(config)


@pytest.mark.parametrize("name", NAMES)
def test_tiny_form_is_the_embedded_default_with_the_recipe(name):
  """``--config=configs/NAME.py:tiny``: the embedded default, only the recipe's keys changed."""
  config = _load(name, "tiny")
  validate(config)
  default = default_config()
  recipe = getattr(recipes, name)(default)
  assert recipe and all(_get(config, k) == v for k, v in recipe.items())
  changed = {k for k in _flat(default.to_dict()) if _get(config, k) != _get(default, k)}
  assert changed <= set(recipe)
  assert config.rl.loss == OFFICIAL[name]["rl.loss"]


def _flat(d, prefix=""):
  for k, v in d.items():
    if isinstance(v, dict):
      yield from _flat(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}"


def test_an_unknown_variant_says_which_exist():
  with pytest.raises(ValueError, match="tiny"):
    _load("wd1", "huge")


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_full_scale_config_runs_one_rl_step_at_tiny_size(tmp_path, name):
  from dllm_rl.train import modes as run
  # (prod._tiny shrinks lengths and sizes; ESPO's kl_coef stays β / 256)
  config = prod._tiny(_load(name), prod._hf_dir(tmp_path, FIXTURE[name]), _data(tmp_path, name))
  if name == "coupled_grpo":  # the code task's system prompt: 50 of the tiny tokenizer's tokens
    config.data.prompt_len = 64
  if name == "wd1":  # d1's prompt (the d1 preset and its five-function reward): 108 characters
    config.data.prompt_len = 112
  summary = run.run(config, str(tmp_path / "work"))
  assert summary["rl_steps"] == 1
  records = [json.loads(line) for line in open(tmp_path / "work" / "metrics.jsonl")]
  step = [r for r in records if r.get("phase") == "rl" and "reward_mean" in r]
  assert step and all(np.isfinite(float(step[0][k])) for k in ("loss", "grad_norm", "entropy"))
