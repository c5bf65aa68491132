"""Transformer invariants: attention semantics, padding, GQA, sizes, logical axes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dllm_rl.models import transformer as T

TINY = dict(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=8,
            mlp_hidden=48)


def _forward(cfg, tokens, positions=None, mask=None, seed=0):
  g, p = T.init_model(cfg, jax.random.key(seed))
  if positions is None:
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  return T.apply(g, p, tokens, positions, mask)


def test_shape_and_float32_logits():
  cfg = T.ModelConfig(**TINY)
  tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, 40)
  logits = _forward(cfg, tokens)
  assert logits.shape == (2, 7, 40) and logits.dtype == jnp.float32


def test_bidirectional_by_default_and_mask_respected():
  cfg = T.ModelConfig(**TINY)
  tokens = jax.random.randint(jax.random.key(1), (1, 6), 0, 40)
  changed = tokens.at[0, 5].set((tokens[0, 5] + 1) % 40)
  a, b = _forward(cfg, tokens), _forward(cfg, changed)
  assert float(jnp.abs(a[0, 0] - b[0, 0]).max()) > 1e-4  # earlier position sees a later one
  causal = jnp.tril(jnp.ones((6, 6), bool))[None]
  a, b = _forward(cfg, tokens, mask=causal), _forward(cfg, changed, mask=causal)
  np.testing.assert_array_equal(a[0, :5], b[0, :5])  # the mask removes exactly that path


def test_key_padding_and_left_padding_invariance():
  cfg = T.ModelConfig(**TINY)
  g, p = T.init_model(cfg, jax.random.key(0))
  seq = jnp.array([[5, 6, 7, 8, 9]])
  valid_short = jnp.ones((1, 5), bool)
  short = T.apply(g, p, seq, T.positions_from_valid(valid_short), valid_short[:, None, :])
  padded = jnp.concatenate([jnp.array([[0, 3, 0]]), seq], axis=1)
  valid = jnp.array([[False, False, False, True, True, True, True, True]])
  long = T.apply(g, p, padded, T.positions_from_valid(valid), valid[:, None, :])
  np.testing.assert_allclose(long[:, 3:], short, atol=1e-5)


def test_gqa_equals_mha_with_repeated_kv_heads():
  gqa_cfg = T.ModelConfig(**dict(TINY, n_kv_heads=2))
  mha_cfg = T.ModelConfig(**TINY)
  g_gqa, p_gqa = T.init_model(gqa_cfg, jax.random.key(3))
  g_mha, p_mha = T.init_model(mha_cfg, jax.random.key(4))
  pure = nnx.to_pure_dict(p_gqa)
  for block in pure["blocks"].values():
    for name in ("k_proj", "v_proj"):  # kv head j serves query heads 2j, 2j+1
      block["attn"][name] = jnp.repeat(block["attn"][name], 2, axis=1)
  nnx.replace_by_pure_dict(p_mha, pure)
  tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 40)
  pos = jnp.broadcast_to(jnp.arange(9), tokens.shape)
  np.testing.assert_allclose(T.apply(g_gqa, p_gqa, tokens, pos), T.apply(g_mha, p_mha, tokens, pos),
                             atol=1e-5)


def test_every_param_has_logical_axes():
  cfg = T.ModelConfig(**dict(TINY, qk_norm=True, tie_embeddings=True))
  _, params = T.init_model(cfg, jax.random.key(0))
  leaves = jax.tree_util.tree_leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
  assert leaves
  for var in leaves:
    axes = var.get_metadata()["logical_axes"]
    assert len(axes) == var[...].ndim and set(axes) <= set(T.LOGICAL_AXES)


def test_tied_embeddings_have_no_lm_head():
  _, params = T.init_model(T.ModelConfig(**dict(TINY, tie_embeddings=True)), jax.random.key(0))
  assert "lm_head" not in nnx.to_pure_dict(params)


def test_llada_8b_size_without_allocating():
  cfg = T.ModelConfig(vocab_size=126464, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                      head_dim=128, mlp_hidden=12288)
  _, params = T.abstract_model(cfg)
  assert isinstance(jax.tree_util.tree_leaves(params)[0], jax.ShapeDtypeStruct)
  assert T.count_params(params) == pytest.approx(8.0156e9, rel=1e-4)  # LLaDA-8B: 8.02B


def test_bfloat16_compute_close_to_float32():
  tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, 40)
  f32 = _forward(T.ModelConfig(**TINY), tokens)
  bf16 = _forward(T.ModelConfig(**dict(TINY, dtype=jnp.bfloat16)), tokens)
  assert bf16.dtype == jnp.float32
  assert float(jnp.abs(f32 - bf16).max()) < 0.05 * float(jnp.abs(f32).max()) + 1e-2


def test_bad_head_config_errors():
  with pytest.raises(ValueError, match="n_kv_heads"):
    T.init_model(T.ModelConfig(**dict(TINY, n_kv_heads=3)), jax.random.key(0))
