"""Config validation of checks derived from other keys: an invalid key is reported once,
under its own name, and the checks that compare against it add nothing (once
``--config.rl.steps=-1`` also said ``rl.warmup_steps: must be in [0, -2]``)."""

import pytest

from dllm_rl.config import ConfigError, base_config
from dllm_rl.config.defaults import get_config
from dllm_rl.config.unread import unread_settings
from dllm_rl.train.validate import validate
from tests.helpers import set_dotted


def _problems(config) -> list[str]:
  """The keys ``validate(config)`` names, in order ([] when it passes)."""
  try:
    validate(config)
  except ConfigError as err:
    return [e.key for e in getattr(err, "errors", [err])]
  return []


def test_a_negative_rl_steps_of_the_embedded_default_is_one_error():
  """The embedded default warms up for 50 updates: rl.steps=-1 is the problem, not the
  warm-up's bound rl.steps × rl.inner_steps = -2."""
  assert _problems(set_dotted(get_config(), {"rl.steps": -1})) == ["rl.steps"]
  assert _problems(set_dotted(get_config(), {"rl.inner_steps": 0})) == ["rl.inner_steps"]


@pytest.mark.parametrize("updates, keys", [
    ({"sft.steps": -1}, ["sft.steps"]),
    ({"eval.num_samples": 0}, ["eval.num_samples"]),
    ({"mode": "rl", "profile.steps": "2:3", "rl.steps": -1}, ["rl.steps"]),
    ({"rl.group_size": 1, "rl.micro_batch": 16}, ["rl.group_size"]),
    ({"rl.temperature": 0.0, "sampler.remasking": "rnadom"}, ["sampler.remasking"]),
    ({"data.prompt_len": -1, "data.prompt_buckets": (8,)}, ["data.prompt_len"]),
    ({"rl.loss": "grpo_token", "estimator.name": "mean_feild"}, ["estimator.name"]),
    ({"rl.loss": "spg", "estimator.name": "spg_blok"}, ["estimator.name"]),
    ({"estimator.coupled": True, "estimator.num_samples": -1}, ["estimator.num_samples"]),
    ({"sampler.remasking": "entropy", "sampler.threshold": 1.5}, ["sampler.threshold"]),
    ({"sampler.kind": "dreem", "sampler.top_k": 5}, ["sampler.kind"]),
    ({"model.block_size": -1, "sampler.cache": "prefix"}, ["model.block_size"]),
    ({"data.completion_len": 10, "sampler.block_len": 4, "sampler.steps": 3},
     ["sampler.block_len"]),
    ({"sampler.kind": "dream", "sampler.remasking": "entropy", "data.completion_len": -1},
     ["data.completion_len"]),
    ({"task.train_size": -5}, ["task.train_size"]),
    ({"mode": "rl", "task.train_size": 0}, ["task.train_size"]),
], ids=lambda v: ",".join(v) if isinstance(v, list) else None)
def test_a_check_derived_from_an_invalid_key_adds_no_error(updates, keys):
  assert _problems(set_dotted(base_config(), updates)) == keys


@pytest.mark.parametrize("updates, keys", [
    ({"rl.steps": 4, "rl.warmup_steps": 20}, ["rl.warmup_steps"]),
    ({"eval.num_samples": 2, "eval.pass_k": (1, 4)}, ["eval.pass_k"]),
    ({"data.completion_len": 10, "sampler.block_len": 4, "sampler.steps": -1},
     ["sampler.block_len", "sampler.steps"]),
    ({"rl.steps": -1, "rl.warmup_steps": -1}, ["rl.steps", "rl.warmup_steps"]),
    ({"mode": "rl", "task.train_size": 4}, ["rl.batch_prompts"]),
    ({"task.train_size": 10}, ["task.train_size"]),
], ids=lambda v: ",".join(v) if isinstance(v, list) else None)
def test_a_derived_check_still_reports_its_own_problem(updates, keys):
  """Against valid keys it reports as before; a value wrong whatever the bound (a negative
  warm-up, a non-positive sampler.steps) is still its own error beside the other key's."""
  assert _problems(set_dotted(base_config(), updates)) == keys


def test_coupled_pairs_are_checked_only_where_coupled_is_read():
  """An odd ``estimator.num_samples`` with ``estimator.coupled`` was a "pairs" error under any
  estimator and mode, though only the 1/t ELBO of an RL run reads ``coupled`` (elsewhere the
  run warns that it is not read: dllm_rl.config.unread): spg_block draws K = 3 samples, and
  an SFT run scores with no estimator."""
  odd = {"estimator.coupled": True, "estimator.num_samples": 3}
  for mode in ("rl", "pipeline"):
    assert _problems(set_dotted(base_config(), {"mode": mode, **odd, "estimator.name": "elbo"})
                     ) == ["estimator.num_samples"], mode
  for updates, said in (({"mode": "rl", "estimator.name": "spg_block"}, ["estimator.coupled"]),
                        ({"mode": "rl", "estimator.name": "mean_field"},  # one draw
                         ["estimator.num_samples", "estimator.coupled"]),
                        ({"mode": "sft", "estimator.name": "elbo"}, [])):
    config = set_dotted(base_config(), {**odd, **updates})
    assert _problems(config) == [], updates
    assert [line.split("=")[0][len("config."):] for line in unread_settings(config)] == said
