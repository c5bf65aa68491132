"""Transformer building blocks (NNX): RMSNorm, RoPE, GQA attention, SwiGLU MLP.

Every parameter carries ``logical_axes`` metadata (names from
``dllm_rl.models.transformer.LOGICAL_AXES``) so a rules table can map them onto
a device mesh later. Parameters are stored in ``param_dtype``; matmuls run in
``dtype`` (float32 or bfloat16); norms, RoPE and softmax run in float32.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx, struct

from dllm_rl.models import lora

_NEG_INF = -1e30


class FrozenParam(nnx.Param):
  """A parameter that lives in the params state (sharded, checkpointed, imported and
  exported like any other) but is never trained: the model reads it through
  ``jax.lax.stop_gradient`` and ``dllm_rl.train.optim`` zeroes the optimiser's update
  for it (so weight decay leaves it alone too). E.g. the MoE routing bias, which the
  official code moves by load balancing, not by gradients."""


def _param(rngs: nnx.Rngs, shape, axes, *, std: float, dtype) -> nnx.Param:
  value = std * jax.random.normal(rngs.params(), shape, dtype)
  return nnx.Param(value, logical_axes=tuple(axes))


class RMSNorm(nnx.Module):
  """RMSNorm computed in float32, cast back, then scaled (LLaDA / Llama)."""

  def __init__(self, dim: int, *, eps: float, param_dtype=jnp.float32):
    self.eps = eps
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=("norm",))

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return y.astype(x.dtype) * self.scale[...].astype(x.dtype)


def rope_tables(positions_BN: jax.Array, head_dim: int, theta: float):
  """cos/sin tables [B, N, Q] for the half-split (NeoX / rotate_half) layout."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  freqs = positions_BN.astype(jnp.float32)[..., None] * inv_freq  # [B, N, Q/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x_BNHQ: jax.Array, cos_BNQ: jax.Array, sin_BNQ: jax.Array) -> jax.Array:
  """Rotary embedding in float32: x·cos + rotate_half(x)·sin.

  Tables narrower than the head (``rope_tables(positions, rotary_dim, theta)``) give
  partial rotary (LLaDA2 / GPT-NeoX ``rotary_pct``): the first R dims are rotated,
  half-split within them, and the remaining dims pass through unchanged."""
  r = cos_BNQ.shape[-1]
  x = x_BNHQ[..., :r].astype(jnp.float32)
  half = r // 2
  rot = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  out = (x * cos_BNQ[:, :, None, :] + rot * sin_BNQ[:, :, None, :]).astype(x_BNHQ.dtype)
  if r == x_BNHQ.shape[-1]:
    return out
  return jnp.concatenate([out, x_BNHQ[..., r:]], axis=-1)


@struct.dataclass
class StaircaseSpec:
  """Structured attention for the block-diffusion training layout
  [prompt P | clean completion L | noisy completion L] (staircase rules in
  ``dllm_rl.kernels.staircase``), passed instead of a dense mask so the
  attention can run as a kernel that never materialises the N×N mask.
  ``key_valid_BN``: False on (left) padding keys, None = all valid.
  ``prompt_block_causal``: prompt rows attend block-causally over prompt blocks
  aligned to the prompt's end (SDAR), else to the whole prompt."""

  key_valid_BN: jax.Array | None
  prompt_len: int = struct.field(pytree_node=False)
  block_size: int = struct.field(pytree_node=False)
  impl: str = struct.field(pytree_node=False, default="auto")
  prompt_block_causal: bool = struct.field(pytree_node=False, default=False)


def attention(q_BNHQ, k_BMJQ, v_BMJQ, mask_BNM) -> jax.Array:
  """Masked softmax attention with grouped query heads.

  ``mask_BNM`` may also be a :class:`StaircaseSpec`: then the staircase
  attention (Pallas kernel or its reference, see dllm_rl.kernels.staircase) runs.

  Query head h reads key/value head h // (H / K) (``repeat_interleave``
  convention). ``mask_BNM`` (True = may attend) broadcasts against [B, N, M];
  a floating-point mask is added to the scores instead (−inf = blocked; LLaDA2.1's
  official generate passes a 0/1 float mask that SDPA adds, see sampling.aligned_block);
  ``None`` means full bidirectional attention. Scores and softmax in float32.
  Query rows with no allowed key get a uniform (finite) distribution.
  """
  if isinstance(mask_BNM, StaircaseSpec):
    from dllm_rl.kernels.sharded import staircase_attention  # per shard on a mesh
    return staircase_attention(q_BNHQ, k_BMJQ, v_BMJQ, prompt_len=mask_BNM.prompt_len,
                               block_size=mask_BNM.block_size,
                               key_valid_BN=mask_BNM.key_valid_BN, impl=mask_BNM.impl,
                               prompt_block_causal=mask_BNM.prompt_block_causal)
  b, n, h, qd = q_BNHQ.shape
  kh = k_BMJQ.shape[2]
  q = q_BNHQ.reshape(b, n, kh, h // kh, qd)
  scores = jnp.einsum("bnkgq,bmkq->bkgnm", q, k_BMJQ,
                      preferred_element_type=jnp.float32) / math.sqrt(qd)
  if mask_BNM is not None and jnp.issubdtype(mask_BNM.dtype, jnp.floating):
    scores = scores + mask_BNM[:, None, None, :, :].astype(jnp.float32)  # additive (−inf = blocked)
  elif mask_BNM is not None:
    scores = jnp.where(mask_BNM[:, None, None, :, :], scores, _NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(v_BMJQ.dtype)
  out = jnp.einsum("bkgnm,bmkq->bnkgq", probs, v_BMJQ)
  return out.reshape(b, n, h, qd)


@struct.dataclass
class KVCache:
  """Fixed-size key/value cache for incremental decoding: one [B, M, K, Q]
  array per layer for keys (RoPE already applied) and for values, slot m
  holding sequence position m of the caller's layout (static M, so loops
  jit). Which slots hold real entries is tracked by the caller
  (``cache_valid_BM``); see ``Transformer.forward_cached``."""

  k_BMJQ: tuple[jax.Array, ...]
  v_BMJQ: tuple[jax.Array, ...]


class Attention(nnx.Module):
  """Multi-head attention with GQA, RoPE, optional qk-norm and optional q/k/v
  biases (``cfg.qkv_bias``, Qwen2 / Dream: added to the projections before the
  qk-norm and RoPE); no output bias."""

  def __init__(self, cfg, rngs: nnx.Rngs):
    d, h, kh, qd = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    pdt, std = cfg.param_dtype, cfg.init_std
    self.cfg = cfg
    self.q_proj = _param(rngs, (d, h, qd), ("embed", "heads", "head_dim"), std=std, dtype=pdt)
    self.k_proj = _param(rngs, (d, kh, qd), ("embed", "kv_heads", "head_dim"), std=std, dtype=pdt)
    self.v_proj = _param(rngs, (d, kh, qd), ("embed", "kv_heads", "head_dim"), std=std, dtype=pdt)
    self.o_proj = _param(rngs, (h, qd, d), ("heads", "head_dim", "embed"),
                         std=std / math.sqrt(2 * cfg.n_layers), dtype=pdt)
    for name, n_in in (("q_proj", 1), ("k_proj", 1), ("v_proj", 1), ("o_proj", 2)):
      setattr(self, name + lora.SUFFIX, lora.adapter(cfg, name, getattr(self, name), n_in, rngs))
    if cfg.qkv_bias:
      self.q_bias = nnx.Param(jnp.zeros((h, qd), pdt), logical_axes=("heads", "head_dim"))
      self.k_bias = nnx.Param(jnp.zeros((kh, qd), pdt), logical_axes=("kv_heads", "head_dim"))
      self.v_bias = nnx.Param(jnp.zeros((kh, qd), pdt), logical_axes=("kv_heads", "head_dim"))
    if cfg.qk_norm:
      self.q_norm = RMSNorm(qd, eps=cfg.rms_norm_eps, param_dtype=pdt)
      self.k_norm = RMSNorm(qd, eps=cfg.rms_norm_eps, param_dtype=pdt)

  def _qkv(self, x_BND, cos_BNQ, sin_BNQ):
    """Projections (+ optional biases), optional qk-norm, RoPE on queries and keys."""
    dt = self.cfg.dtype
    q = lora.add(jnp.einsum("bnd,dhq->bnhq", x_BND, self.q_proj[...].astype(dt)),
                 self.q_proj_lora, x_BND, dt)
    k = lora.add(jnp.einsum("bnd,dkq->bnkq", x_BND, self.k_proj[...].astype(dt)),
                 self.k_proj_lora, x_BND, dt)
    v = lora.add(jnp.einsum("bnd,dkq->bnkq", x_BND, self.v_proj[...].astype(dt)),
                 self.v_proj_lora, x_BND, dt)
    if self.cfg.qkv_bias:
      q = q + self.q_bias[...].astype(dt)
      k = k + self.k_bias[...].astype(dt)
      v = v + self.v_bias[...].astype(dt)
    if self.cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    return apply_rope(q, cos_BNQ, sin_BNQ), apply_rope(k, cos_BNQ, sin_BNQ), v

  def out_proj(self, out_BNHQ):
    """The output projection (+ its adapter) of the attention output."""
    dt = self.cfg.dtype
    return lora.add(jnp.einsum("bnhq,hqd->bnd", out_BNHQ, self.o_proj[...].astype(dt)),
                    self.o_proj_lora, out_BNHQ, dt)

  def __call__(self, x_BND, cos_BNQ, sin_BNQ, mask_BNM):
    q, k, v = self._qkv(x_BND, cos_BNQ, sin_BNQ)
    return self.out_proj(attention(q, k, v, mask_BNM))

  def cached(self, x_BTD, cos_BTQ, sin_BTQ, k_BMJQ, v_BMJQ, offset, mask_BTM):
    """T new tokens against a fixed-size KV cache: their keys (RoPE applied)
    and values are written into cache slots [offset, offset + T), then their
    queries attend over all M slots as ``mask_BTM`` allows (keys in cache
    order, so a cache laid out like the full sequence gives the same sums).
    Returns (out_BTD, k_BMJQ, v_BMJQ) with the written cache."""
    q, k, v = self._qkv(x_BTD, cos_BTQ, sin_BTQ)
    k_BMJQ = jax.lax.dynamic_update_slice_in_dim(k_BMJQ, k.astype(k_BMJQ.dtype), offset, axis=1)
    v_BMJQ = jax.lax.dynamic_update_slice_in_dim(v_BMJQ, v.astype(v_BMJQ.dtype), offset, axis=1)
    out_BTD = self.out_proj(attention(q, k_BMJQ, v_BMJQ, mask_BTM))
    return out_BTD, k_BMJQ, v_BMJQ


class SwiGLU(nnx.Module):
  """down(silu(gate(x)) * up(x)); no biases. ``hidden``: the width F (default
  ``cfg.mlp_hidden``; the MoE's shared expert passes its own)."""

  def __init__(self, cfg, rngs: nnx.Rngs, hidden: int | None = None):
    d, pdt, std = cfg.d_model, cfg.param_dtype, cfg.init_std
    f = hidden or cfg.mlp_hidden
    self.dtype = cfg.dtype
    self.gate_proj = _param(rngs, (d, f), ("embed", "mlp"), std=std, dtype=pdt)
    self.up_proj = _param(rngs, (d, f), ("embed", "mlp"), std=std, dtype=pdt)
    self.down_proj = _param(rngs, (f, d), ("mlp", "embed"),
                            std=std / math.sqrt(2 * cfg.n_layers), dtype=pdt)
    for name in ("gate_proj", "up_proj", "down_proj"):
      setattr(self, name + lora.SUFFIX, lora.adapter(cfg, name, getattr(self, name), 1, rngs))

  def __call__(self, x_BND):
    dt = self.dtype
    gate = lora.add(x_BND @ self.gate_proj[...].astype(dt), self.gate_proj_lora, x_BND, dt)
    up = lora.add(x_BND @ self.up_proj[...].astype(dt), self.up_proj_lora, x_BND, dt)
    h = jax.nn.silu(gate) * up
    return lora.add(h @ self.down_proj[...].astype(dt), self.down_proj_lora, h, dt)
