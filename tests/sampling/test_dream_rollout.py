"""``sampler.kind = "dream"``: Dream's own sampler as the run's sampler (rollouts, greedy eval,
pass@k), through the code path the RL loop calls (``evaluation.make_sample_fn``), against the
official ``diffusion_generate`` runs recorded in tests/fixtures/dream_tiny/sampler_parity.npz."""

import dataclasses
import json
import os

import jax
import numpy as np
import pytest

from dllm_rl.config import ConfigError
from dllm_rl.models import hf
from dllm_rl.sampling import dream_rollout, sampler
from dllm_rl.sampling.configs import sampler_config
from dllm_rl.sampling.dream_rollout import DreamRolloutConfig
from dllm_rl.train import evaluation
from dllm_rl.train.validate import validate
from tests.helpers import tiny_run_config

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                       "dream_tiny")
MASK, EOS = 156, 150  # the fixture's config.json


@pytest.fixture(scope="module")
def checkpoint():
  _, _, graphdef, params, _ = hf.load_checkpoint(FIXTURE)
  return graphdef, params, np.load(os.path.join(FIXTURE, "sampler_parity.npz"))


def _first_step(history_SBL):
  """The first step after which each position holds a token (-1: never), by loops."""
  s, b, l = history_SBL.shape
  out = np.full((b, l), -1)
  for i in range(b):
    for j in range(l):
      filled = np.nonzero(history_SBL[:, i, j] != MASK)[0]
      out[i, j] = filled[0] if filled.size else -1
  return out


@pytest.mark.parametrize("name", ["a_entropy", "b_maskgit_plus", "c_topk_margin", "p_entropy"])
def test_greedy_rollouts_are_the_official_runs(checkpoint, name):
  """Official greedy runs (left padding in p): the completion (EOS from the first EOS on),
  the step each token was first committed at, and the per-step trajectory."""
  graphdef, params, data = checkpoint
  kwargs = json.loads(str(data[f"{name}_kwargs"]))
  prompt_BP = data[f"{name[0]}_prompt"]
  valid_BP = (data["p_attention_mask"] if name[0] == "p" else np.ones_like(prompt_BP)).astype(bool)
  p, l = prompt_BP.shape[1], kwargs["max_new_tokens"]
  want_BL = data[f"{name}_output"][:, p:]
  eos = int(want_BL[0, l // 2])  # the random tiny model writes no EOS: a token it writes
  cfg = DreamRolloutConfig(completion_len=l, steps=kwargs["steps"], block_len=l,
                           remasking=kwargs["alg"], record_trajectory=True)
  fn = evaluation.make_sample_fn(graphdef, cfg, mask_id=MASK, eos_id=eos)
  with jax.default_matmul_precision("highest"):
    out = jax.tree.map(np.asarray, fn(params, prompt_BP, valid_BP, jax.random.key(0)))
  after_eos_BL = np.cumsum(want_BL == eos, axis=1) > 0
  filled_BL = np.where(after_eos_BL, eos, want_BL)
  assert (filled_BL != want_BL).any()  # the fill is exercised
  np.testing.assert_array_equal(out.completion_BL, filled_BL)
  history_SBL = data[f"{name}_history"][:, :, p:]
  np.testing.assert_array_equal(out.trajectory_SBL, history_SBL)
  np.testing.assert_array_equal(out.unmask_step_BL, _first_step(history_SBL))
  assert (int(out.num_steps), int(out.num_blocks)) == (kwargs["steps"], 1)


def test_unmask_steps_of_a_position_never_filled_are_minus_one():
  hist_SBL = np.full((3, 1, 4), MASK)
  hist_SBL[1:, 0, 0] = 7
  hist_SBL[2:, 0, 2] = 9
  got = np.asarray(dream_rollout.unmask_steps(hist_SBL, MASK))
  np.testing.assert_array_equal(got, [[1, -1, 2, -1]])


def test_groups_sample_at_temperature_with_top_p_and_each_group_is_its_own_draw(checkpoint):
  """G draws per prompt at temperature 1 with top-p 0.9: [B, G, L], each group the single
  sampler's draw on its split key, the groups not all equal."""
  graphdef, params, data = checkpoint
  prompt_BP = data["c_prompt"][:2]
  valid_BP = np.ones_like(prompt_BP, bool)
  cfg = DreamRolloutConfig(completion_len=16, steps=8, block_len=16, temperature=1.0,
                           remasking="entropy", top_p=0.9)
  assert cfg.dream(MASK).top_p == 0.9 and cfg.dream(MASK).top_k is None
  greedy = dataclasses.replace(cfg, temperature=0.0, top_k=5).dream(MASK)
  assert greedy.top_p is None  # DiffuCoder: top_p 1.0 at T = 0
  assert greedy.top_k == 5  # a top_k stays (it reshapes the confidences), as officially
  key = jax.random.key(3)
  groups = evaluation.make_sample_fn(graphdef, cfg, mask_id=MASK, eos_id=EOS, group_size=3)
  out = jax.tree.map(np.asarray, groups(params, prompt_BP, valid_BP, key))
  assert out.completion_BL.shape == out.unmask_step_BL.shape == (2, 3, 16)
  one = evaluation.make_sample_fn(graphdef, cfg, mask_id=MASK, eos_id=EOS)
  for g, k in enumerate(jax.random.split(key, 3)):
    np.testing.assert_array_equal(np.asarray(one(params, prompt_BP, valid_BP, k).completion_BL),
                                  out.completion_BL[:, g])
  assert len({out.completion_BL[0, g].tobytes() for g in range(3)}) > 1
  assert np.all(out.unmask_step_BL < 8) and np.all(out.unmask_step_BL >= -1)


def _config(**overrides):
  base = {"sampler.kind": "dream", "sampler.remasking": "entropy"}
  return tiny_run_config("rl", {**base, **overrides})


def test_the_config_builds_dreams_sampler_with_its_settings():
  cfg = sampler_config(validate(_config(**{"sampler.top_p": 0.95, "sampler.eps": 0.01})))
  assert isinstance(cfg, DreamRolloutConfig) and (cfg.top_p, cfg.eps) == (0.95, 0.01)
  assert (cfg.block_len, cfg.num_blocks, cfg.max_steps) == (8, 1, 8)
  assert type(sampler_config(tiny_run_config("rl"))) is sampler.SamplerConfig


@pytest.mark.parametrize("overrides, key, message", [
    ({"sampler.kind": "llada"}, "sampler.kind", "unknown sampler kind 'llada'"),
    ({"sampler.remasking": "low_confidence"}, "sampler.remasking",
     "Dream's name for it is 'maskgit_plus'"),
    ({"data.completion_len": 16, "sampler.block_len": 8, "sampler.steps": 8},
     "sampler.block_len", "as one block .*data.completion_len = 16"),
    ({"sampler.threshold": 0.9}, "sampler.threshold", "batch 1 only|one prompt at a time"),
    ({"sampler.cache": "dual"}, "sampler.cache", "full forwards"),
    ({"sampler.exclude_mask": True}, "sampler.exclude_mask", "whole vocabulary"),
    ({"sampler.top_p": 0.0}, "sampler.top_p", r"\(0, 1\]"),
    ({"sampler.kind": "masked", "sampler.top_p": 0.95}, "sampler.top_p",
     "only Dream's sampler filters"),
    ({"sampler.kind": "masked", "sampler.top_k": 5}, "sampler.top_k",
     "only Dream's sampler filters"),
])
def test_settings_dreams_sampler_does_not_have_are_errors(overrides, key, message):
  with pytest.raises(ConfigError) as err:
    validate(_config(**overrides))
  assert len(getattr(err.value, "errors", [err.value])) == 1  # said once, by its own rule
  found = [e for e in getattr(err.value, "errors", [err.value]) if e.key == key]
  assert found, [str(e) for e in getattr(err.value, "errors", [err.value])]
  assert any(__import__("re").search(message, str(e)) for e in found), [str(e) for e in found]


def test_more_steps_than_tokens_is_dreams_to_allow():
  """The official sampler runs steps that commit nothing (k = 0); the masked sampler's
  check does not apply to it."""
  assert sampler_config(validate(_config(**{"sampler.steps": 16}))).steps == 16
  with pytest.raises(ConfigError, match="steps per block exceed"):
    validate(_config(**{"sampler.kind": "masked", "sampler.steps": 16}))


def test_origin_draws_a_random_order_so_greedy_groups_are_allowed():
  validate(_config(**{"sampler.remasking": "origin", "rl.temperature": 0.0}))
  with pytest.raises(ConfigError, match="rl.temperature"):
    validate(_config(**{"rl.temperature": 0.0}))
