"""``lax.top_k`` over the last axis that stays partitioned under ``vmap``.

The samplers vmap the model over the G completions of a prompt, so a sampler's [B, L, V]
logits are [G, B, L, V] inside, with B split over the mesh's batch axes. XLA's GPU compiler
lowers ``top_k`` through a [G·B·L, V] reshape, and a sharded B inside that merged axis cannot
be represented: the SPMD partitioner all-gathers B first, so every device ran the top-k (and
held the logits) of the whole global batch. Measured for an absent 8-H100 mesh:
Dream-7B's rollout sampler (8 prompts × 16, top-k 50) planned to 62.6 GiB a device, with
f32[16, 8, 256, 152064] buffers (all 8 prompts on each device). Under ``vmap`` this
:func:`top_k` moves the mapped axis after the leading (batch) axis first, [B, G, L, V], which
partitions; values and indices are the same (tests/parallel/test_topk.py). TPU lowers
``top_k`` natively and was not affected; XLA's CPU compiler all-gathers a sharded ``top_k``
with or without vmap (multi-device CPU is for tests). Not differentiable (``custom_vmap``):
for sampling.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import custom_batching


def top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """``jax.lax.top_k(x, k)``: (values, int32 indices) of the ``k`` largest along the last
  axis, ties to the lower index; under ``vmap`` laid out so that a sharded leading axis stays
  sharded (module docstring)."""
  return _top_k(int(k))(x)


@functools.cache
def _top_k(k: int):
  @custom_batching.custom_vmap
  def fn(x):
    return tuple(jax.lax.top_k(x, k))

  @fn.def_vmap
  def rule(axis_size, in_batched, x):
    del axis_size, in_batched  # one argument, batched (else the rule is not called)
    if x.ndim < 3:  # the op saw a vector: nothing to keep sharded
      return tuple(jax.lax.top_k(x, k)), (True, True)
    values, indices = fn(jnp.moveaxis(x, 0, 1))  # [B, G, …]: nested vmaps go on recursing
    return (jnp.moveaxis(values, 1, 0), jnp.moveaxis(indices, 1, 0)), (True, True)

  return fn
