"""LLaDA2.0 and 2.1 ``generate`` through ``dllm_rl.load_pretrained``, token-exact against the
official outputs in tests/fixtures/llada2_moe_tiny/sampler_parity.npz (README there: 2.0 run
greedy with 2.1's argmax fix, 2.1 as shipped with its 0/1 additive mask and token editing; one
official call per row, outputs = generated tokens up to and including the first EOS)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dllm_rl
from dllm_rl.sampling import aligned_block

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                       "llada2_moe_tiny")
pytestmark = pytest.mark.slow  # a generate compile per shape (MoE model)


@pytest.fixture(scope="module")
def data():
  return np.load(os.path.join(FIXTURE, "sampler_parity.npz"))


@pytest.fixture(scope="module")
def v20():
  return dllm_rl.load_pretrained(FIXTURE)


@pytest.fixture(scope="module")
def v21():
  return dllm_rl.load_pretrained(FIXTURE, generator="llada2.1")


def test_llada2_logits_through_the_public_api(v20):
  """Block-causal (block 4, as generate builds it) and bidirectional logits of the fixture."""
  data = np.load(os.path.join(FIXTURE, "expected.npz"))
  with jax.default_matmul_precision("highest"):
    block = np.asarray(v20.logits(data["input_ids"], attention="block_causal", block_size=4))
    full = np.asarray(v20.logits(data["input_ids"]))
  assert np.max(np.abs(block - data["logits"])) < 1e-4
  assert np.max(np.abs(full - data["logits_full"])) < 1e-4
  assert (v20.family, v20.token_ids.mask_id, v20.token_ids.eos_id) == ("llada2", 189, 186)


def _check(out_BN, data, name, p):
  for row, (got, want, n) in enumerate(zip(np.asarray(out_BN)[:, p:], data[f"{name}_output"],
                                           data[f"{name}_output_len"])):
    np.testing.assert_array_equal(got[:n], want[:n], err_msg=f"{name} row {row}")


@pytest.mark.parametrize("shape", ["a", "b", "c"])
def test_llada20_generate_is_token_exact(v20, data, shape):
  assert v20.generator == "llada2.0"
  b, p, gen_length, block_length, steps, minimal_topk = (
      int(v) for v in data[f"v20_{shape}_params"])
  kwargs = dict(temperature=0.0, block_length=block_length, steps=steps, gen_length=gen_length,
                minimal_topk=minimal_topk, threshold=float(data[f"v20_{shape}_threshold"]),
                eos_id=int(data["eos_token_id"]), mask_id=int(data["mask_token_id"]))
  prompt = data[f"v20_{shape}_prompt"]
  with jax.default_matmul_precision("highest"):
    out = v20.generate(prompt, **kwargs)
    cfg = aligned_block.AlignedBlockConfig(
        gen_length=gen_length, block_length=block_length,
        steps=min(steps, gen_length // minimal_topk), threshold=kwargs["threshold"],
        stop_ids=(kwargs["eos_id"],))
    _, nfe_B = jax.jit(aligned_block.generate, static_argnums=0,
                       static_argnames=("cfg", "mask_id"))(
        v20.graphdef, v20.params, jnp.asarray(prompt), jax.random.key(0), cfg=cfg,
        mask_id=kwargs["mask_id"])
  assert out.shape == (b, p + gen_length)
  _check(out, data, f"v20_{shape}", p)
  np.testing.assert_array_equal(np.asarray(nfe_B), data[f"v20_{shape}_nfe"])


@pytest.mark.parametrize("shape", ["a", "b", "c"])
def test_llada21_generate_with_editing_is_token_exact(v21, data, shape):
  b, p, gen_length, block_length, steps, minimal_topk, post, n_transfer = (
      int(v) for v in data[f"v21_{shape}_params"])
  with jax.default_matmul_precision("highest"):
    out = v21.generate(data[f"v21_{shape}_prompt"], temperature=0.0, block_length=block_length,
                       steps=steps, gen_length=gen_length, minimal_topk=minimal_topk,
                       threshold=float(data[f"v21_{shape}_threshold"]),
                       editing_threshold=float(data[f"v21_{shape}_editing_threshold"]),
                       max_post_steps=post, num_to_transfer=n_transfer,
                       eos_id=int(data["eos_token_id"]), mask_id=int(data["mask_token_id"]))
    cfg = aligned_block.EditingConfig(
        gen_length=gen_length, block_length=block_length,
        threshold=float(data[f"v21_{shape}_threshold"]),
        editing_threshold=float(data[f"v21_{shape}_editing_threshold"]),
        max_post_steps=post, num_to_transfer=n_transfer, stop_ids=(int(data["eos_token_id"]),))
    _, nfe_B = jax.jit(aligned_block.generate_editing, static_argnums=0,
                       static_argnames=("cfg", "mask_id"))(
        v21.graphdef, v21.params, jnp.asarray(data[f"v21_{shape}_prompt"]), jax.random.key(0),
        cfg=cfg, mask_id=int(data["mask_token_id"]))
  _check(out, data, f"v21_{shape}", p)
  # The forward count too (when a block ends: post steps, the no-mask-and-no-edit rule): the
  # official loop decodes every block of a row, ours stops a row at its first EOS (same
  # tokens), so a row without an EOS counts the official forwards, one with an EOS fewer.
  nfe_B, want_B = np.asarray(nfe_B), data[f"v21_{shape}_nfe"]
  full_B = data[f"v21_{shape}_output_len"] == gen_length
  np.testing.assert_array_equal(nfe_B[full_B], want_B[full_B])
  assert full_B.any() and (nfe_B[~full_B] < want_B[~full_B]).all()


def test_the_two_versions_take_their_own_keywords(v20, v21):
  with pytest.raises(TypeError, match="editing_threshold"):
    v20.generate(np.zeros((1, 4), np.int32), editing_threshold=0.5)
  with pytest.raises(TypeError, match="num_to_transfer"):
    v21.generate(np.zeros((1, 4), np.int32), remasking="low_confidence")


def test_settings_that_would_hang_or_divide_by_zero_are_named(v20, v21):
  """num_to_transfer=0 commits nothing when no token passes the threshold, so 2.1's block loop
  never ended; minimal_topk > gen_length leaves 0 steps (a ZeroDivisionError in the schedule)."""
  prompt = np.zeros((1, 4), np.int32)
  with pytest.raises(ValueError, match="num_to_transfer must be a positive integer, got 0"):
    v21.generate(prompt, gen_length=8, block_length=4, num_to_transfer=0)
  with pytest.raises(ValueError, match="minimal_topk=16 is larger than gen_length=8"):
    v20.generate(prompt, gen_length=8, block_length=4, steps=4, minimal_topk=16)
