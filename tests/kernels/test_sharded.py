"""The staircase kernel in shard_map over the batch (and head) axes equals the
unsharded kernel, forward and gradients; a jitted step on a mesh holds the Pallas
call inside the shard_map."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.kernels import sharded
from dllm_rl.kernels import staircase as sc
from dllm_rl.parallel import shard
from dllm_rl.parallel.constraints import under_mesh
from dllm_rl.parallel.mesh import make_mesh

P, L, BS = 4, 8, 4


def _inputs(b, h, kh, qd=8):
  n = P + 2 * L
  ks = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(ks[0], (b, n, h, qd))
  k = jax.random.normal(ks[1], (b, n, kh, qd))
  v = jax.random.normal(ks[2], (b, n, kh, qd))
  valid = jnp.arange(n)[None, :] >= jnp.asarray([0, 2, 1, 0] * (b // 4))[:, None]
  return q, k, v, valid


def _fwd_and_grads(attn, mesh, q, k, v, valid, impl):
  def loss(q, k, v):
    o = attn(q, k, v, prompt_len=P, block_size=BS, key_valid_BN=valid, impl=impl)
    return jnp.sum(o * jnp.cos(o)), o
  fn = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
  if mesh is not None:  # the step's inputs arrive sharded over the batch axes
    q, k, v = (jax.device_put(x, shard.batch_sharding(mesh, x.ndim)) for x in (q, k, v))
  (_, o), grads = jax.jit(under_mesh(fn, mesh))(q, k, v)
  return [o, *grads]


@pytest.mark.parametrize("shape,h,kh", [((4, 2, 1), 4, 2),    # batch axes only
                                        ((2, 2, 2), 4, 2)])   # batch and heads
def test_sharded_kernel_equals_unsharded(shape, h, kh):
  mesh = make_mesh(dict(zip(("data", "fsdp", "tensor"), shape)))
  q, k, v, valid = _inputs(8, h, kh)
  ref = _fwd_and_grads(sc.staircase_attention, None, q, k, v, valid, "interpret")
  got = _fwd_and_grads(sharded.staircase_attention, mesh, q, k, v, valid, "interpret")
  for a, b in zip(got, ref):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_pallas_call_runs_inside_shard_map():
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  q, k, v, valid = _inputs(8, 4, 2)
  fn = lambda q, k, v: sharded.staircase_attention(q, k, v, prompt_len=P, block_size=BS,
                                                   key_valid_BN=valid, impl="interpret")
  closed = jax.make_jaxpr(under_mesh(fn, mesh))(q, k, v)
  top = {e.primitive.name for e in closed.jaxpr.eqns}
  assert "shard_map" in top and "pallas_call" not in top  # the kernel only inside
  assert "pallas_call" in str(closed)
  assert "f32[2,20,2,8]" in str(closed)  # per shard: 8/(2·2) sequences, 4/2 heads
  # Off a mesh: the plain kernel.
  assert "shard_map" not in str(jax.make_jaxpr(fn)(q, k, v))
