"""Scan over layers and rematerialisation change how the layer stack is compiled, never
what it computes: logits and gradients equal the unrolled model's (float32)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.config import ConfigError, base_config

from dllm_rl.train.validate import validate
from dllm_rl.models import layers
from dllm_rl.models import transformer as T

CFG = T.ModelConfig(vocab_size=37, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8,
                    mlp_hidden=48, qk_norm=True)


def _inputs(b=2, n=12):
  tokens = jax.random.randint(jax.random.key(1), (b, n), 0, CFG.vocab_size)
  positions = jnp.broadcast_to(jnp.arange(n), (b, n))
  mask = jax.random.bernoulli(jax.random.key(2), 0.8, (b, 1, n)) | jnp.eye(n, dtype=bool)[None]
  return tokens, positions, mask


def _loss_and_grads(cfg, params, mask):
  graphdef, _ = T.abstract_model(cfg)
  tokens, positions, _ = _inputs()

  def loss(p):
    logits = T.apply(graphdef, p, tokens, positions, mask)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 3]), logits

  (value, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return value, logits, grads


@pytest.fixture(scope="module")
def unrolled():
  _, params = T.init_model(CFG, jax.random.key(0))
  with jax.default_matmul_precision("highest"):
    return params, _loss_and_grads(CFG, params, _inputs()[2])


@pytest.mark.parametrize("scan_layers,remat", [(True, "none"), (True, "full"),
                                               (True, "minimal"), (False, "full")])
def test_scan_and_remat_equal_the_unrolled_model(unrolled, scan_layers, remat):
  params, ref = unrolled
  with jax.default_matmul_precision("highest"):
    got = _loss_and_grads(dataclasses.replace(CFG, scan_layers=scan_layers, remat=remat),
                          params, _inputs()[2])
  np.testing.assert_allclose(got[1], ref[1], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[0], ref[0], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(got[2]), jax.tree.leaves(ref[2])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_scan_with_staircase_attention_and_bf16_compute():
  """The block-diffusion layout (a StaircaseSpec, not an array mask) passes through the
  scan; bf16 compute with fp32 params gives the unrolled model's logits up to bf16
  rounding (XLA fuses the casts differently inside a loop body)."""
  cfg = dataclasses.replace(CFG, dtype=jnp.bfloat16)
  _, params = T.init_model(cfg, jax.random.key(0))
  p, l, bs = 4, 8, 4
  tokens = jax.random.randint(jax.random.key(3), (2, p + 2 * l), 0, cfg.vocab_size)
  positions = jnp.broadcast_to(jnp.concatenate([jnp.arange(p + l), jnp.arange(p, p + l)]),
                               tokens.shape)
  spec = layers.StaircaseSpec(key_valid_BN=None, prompt_len=p, block_size=bs, impl="reference")
  graphdef, _ = T.abstract_model(cfg)
  ref = jax.jit(T.apply, static_argnums=0)(graphdef, params, tokens, positions, spec)
  scan_def, _ = T.abstract_model(dataclasses.replace(cfg, scan_layers=True, remat="full"))
  got = jax.jit(T.apply, static_argnums=0)(scan_def, params, tokens, positions, spec)
  np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=0, atol=1e-2)
  assert np.mean(np.abs(np.asarray(got) - np.asarray(ref))) < 1e-3


def test_scanned_program_has_one_layer_body():
  """With scan the compiled forward holds one copy of the block, not n_layers."""
  big = dataclasses.replace(CFG, n_layers=8)
  tokens, positions, mask = _inputs()

  def n_dots(cfg):
    graphdef, params = T.abstract_model(cfg)
    text = jax.jit(T.apply, static_argnums=0).lower(graphdef, params, tokens, positions,
                                                    mask).as_text()
    return text.count("dot_general")

  assert n_dots(dataclasses.replace(big, scan_layers=True)) < n_dots(big) / 4


def test_bad_remat_policy_is_named():
  c = base_config()
  c.model.remat = "everything"
  with pytest.raises(ConfigError, match="model.remat"):
    validate(c)
