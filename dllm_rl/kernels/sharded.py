"""The staircase kernel inside ``shard_map``: GSPMD cannot partition a ``pallas_call``
(a custom call), so on a mesh with more than one device the kernel runs per shard,
over the batch axes (``data``, ``fsdp``, ``expert``) and, when the heads divide, ``tensor``.

Attention is independent per sequence and per key/value head group, so every shard
computes exactly its slice of the unsharded result. The mesh is the abstract mesh that
jitted steps trace under (dllm_rl.parallel.constraints.under_mesh); without one, or on
one device, this is ``staircase_attention`` itself.
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import PartitionSpec as P

from dllm_rl.kernels.staircase import staircase_attention as _staircase
from dllm_rl.parallel.constraints import shard_axes


def staircase_attention(q_BNHQ, k_BNJQ, v_BNJQ, *, key_valid_BN=None, **options):
  """``dllm_rl.kernels.staircase.staircase_attention`` (same arguments), per shard."""
  b, _, h, _ = q_BNHQ.shape
  axes = shard_axes(b, (h, k_BNJQ.shape[2]))
  if axes is None or (axes.batch is None and axes.tensor is None):
    return _staircase(q_BNHQ, k_BNJQ, v_BNJQ, key_valid_BN=key_valid_BN, **options)
  mesh, batch = axes.mesh, axes.batch
  qkv = P(batch, None, axes.tensor, None)
  if key_valid_BN is None:
    fn = functools.partial(_staircase, key_valid_BN=None, **options)
    return jax.shard_map(fn, mesh=mesh, in_specs=(qkv, qkv, qkv), out_specs=qkv,
                         check_vma=False)(q_BNHQ, k_BNJQ, v_BNJQ)
  fn = lambda q, k, v, valid: _staircase(q, k, v, key_valid_BN=valid, **options)
  return jax.shard_map(fn, mesh=mesh, in_specs=(qkv, qkv, qkv, P(batch, None)), out_specs=qkv,
                       check_vma=False)(q_BNHQ, k_BNJQ, v_BNJQ, key_valid_BN)
