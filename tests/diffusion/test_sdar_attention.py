"""SDAR prompt attention: the framework's own masks reproduce the official logits.

SDAR's official ``block_diffusion_generate`` runs the whole sequence under a
block-lower-triangular mask, the prompt included (tests/fixtures/sdar_tiny).
With a prompt of 16 tokens (a block multiple) and a completion of 16, every
path of the framework — the dense block-causal mask, the staircase layout of
the likelihood, the KV-cached sampler's prefill + block step — must give the
fixture's logits; treating the prompt as one bidirectional block must not.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.config import load_config_file
from dllm_rl.diffusion.estimators import EstimatorConfig
from dllm_rl.kernels.block_mask import block_causal_mask, prompt_block_mask
from dllm_rl.models import hf
from dllm_rl.models import transformer as T
from dllm_rl.models.layers import StaircaseSpec
from dllm_rl.sampling.block_sampler import BlockSamplerConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "sdar_tiny")
P, L, BS = 16, 16, 4
TOL = 1e-5


@pytest.fixture(scope="module")
def sdar():
  _, ids, graphdef, params, family = hf.load_checkpoint(FIXTURE)
  assert family == "sdar" and ids.block_size == BS
  e = np.load(os.path.join(FIXTURE, "expected.npz"))
  return (graphdef, params, jnp.asarray(e["input_ids"], jnp.int32), e["logits"],
          e["attention_mask"][0])


def _forward(graphdef, params, tokens, positions, mask):
  with jax.default_matmul_precision("highest"):
    return np.asarray(T.apply(graphdef, params, tokens, positions, mask))


@pytest.mark.parametrize("prompt_block_causal", [True, False])
def test_dense_block_causal_mask_matches_the_official_forward(sdar, prompt_block_causal):
  graphdef, params, ids, expected, official_mask = sdar
  b = ids.shape[0]
  mask = block_causal_mask(jnp.ones((b, P), bool), L, BS, prompt_block_causal)
  positions = jnp.broadcast_to(jnp.arange(P + L), ids.shape)
  err = np.abs(_forward(graphdef, params, ids, positions, mask) - expected).max(axis=(0, 2))
  if prompt_block_causal:
    np.testing.assert_array_equal(np.asarray(mask[0]), official_mask)
    assert err.max() <= TOL
  else:  # one bidirectional prompt block: prompt rows (and all later layers' keys) differ
    assert err[:P].max() > 1e-2 and err[P:].max() > 1e-3


def test_staircase_likelihood_layout_matches_the_official_forward(sdar):
  """[prompt | clean | noisy] with noisy = clean: noisy block b sees the prompt,
  clean blocks < b and itself — the official row of block b."""
  graphdef, params, ids, expected, _ = sdar
  prompt, completion = ids[:, :P], ids[:, P:]
  tokens = jnp.concatenate([prompt, completion, completion], axis=1)
  pos = jnp.arange(P + L)
  positions = jnp.broadcast_to(jnp.concatenate([pos, pos[P:]]), tokens.shape)
  for pbc, ok in ((True, True), (False, False)):
    spec = StaircaseSpec(jnp.ones(tokens.shape, bool), prompt_len=P, block_size=BS,
                         impl="reference", prompt_block_causal=pbc)
    got = _forward(graphdef, params, tokens, positions, spec)
    err = max(np.abs(got[:, :P] - expected[:, :P]).max(),
              np.abs(got[:, P + L:] - expected[:, P:]).max())
    assert (err <= TOL) == ok, (pbc, err)


def test_cached_sampler_prefill_and_first_block_match_the_official_forward(sdar):
  graphdef, params, ids, expected, _ = sdar
  b = ids.shape[0]
  cfg = hf.load_checkpoint(FIXTURE)[0]
  cache = T.init_kv_cache(cfg, b, P + L)
  positions = jnp.broadcast_to(jnp.arange(P + L), ids.shape)
  with jax.default_matmul_precision("highest"):
    logits_p, cache = T.apply_cached(graphdef, params, ids[:, :P], positions[:, :P], cache,
                                     jnp.zeros((b, P + L), bool), 0,
                                     new_mask_TT=prompt_block_mask(P, BS), write=True)
    valid = jnp.arange(P + L)[None, :] < P
    logits_b, _ = T.apply_cached(graphdef, params, ids[:, P:P + BS], positions[:, P:P + BS],
                                 cache, jnp.broadcast_to(valid, (b, P + L)), P, write=False)
  assert np.abs(np.asarray(logits_p) - expected[:, :P]).max() <= TOL
  assert np.abs(np.asarray(logits_b) - expected[:, P:P + BS]).max() <= TOL


@pytest.mark.parametrize("block_causal", [True, False])
def test_sdar_config_wires_block_causal_prompts_into_sampler_and_estimator(block_causal):
  """What a run builds from configs/sdar_tpu.py — its sampler, its RL step's estimator and
  its SFT step's options — carries model.block_size and model.prompt_block_causal, for
  either value of the flag (a wiring that drops or hard-codes it fails one case)."""
  from dllm_rl.sampling.configs import sampler_config
  from dllm_rl.train.rl_loop import step_config
  from dllm_rl.train.sft_step import step_options
  config = load_config_file(os.path.join(ROOT, "configs", "sdar_tpu.py"))
  assert config.model.prompt_block_causal and config.model.block_size == BS  # SDAR's setting
  config.model.prompt_block_causal = block_causal
  sampler = sampler_config(config)
  assert isinstance(sampler, BlockSamplerConfig) and sampler.prompt_block_causal is block_causal
  est = step_config(config, sampler, mask_id=3, eos_id=1).estimator_cfg
  assert isinstance(est, EstimatorConfig)
  assert est.prompt_block_causal is block_causal and est.block_size == BS
  options = step_options(config)
  assert options["prompt_block_causal"] is block_causal and options["block_size"] == BS
