"""The staircase kernel in shard_map over the batch (and head) axes equals the
unsharded kernel, forward and gradients; a jitted step on a mesh holds the Pallas
call inside the shard_map."""

import jax
import jax.extend
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


def _pallas_calls(jaxpr):
  """Every pallas_call equation of a (closed) jaxpr, sub-jaxprs included."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "pallas_call":
      found.append(eqn)
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      found += _pallas_calls(sub)
  return found


def _tpu_abstract_mesh(shape=(1, 4, 2)):
  """The abstract mesh of a TPU slice (what a step traces under when compiled for TPU
  devices, e.g. by the planner in a CPU process)."""
  device = jax.sharding.AbstractDevice(device_kind="TPU v5", num_cores=1, platform="tpu")
  # Auto axes, as dllm_rl.parallel.mesh builds them (jax 0.11's AbstractMesh defaults to
  # Explicit, under which shard_map also checks its inputs' sharding types)
  return jax.sharding.AbstractMesh(shape, ("data", "fsdp", "tensor"), abstract_device=device,
                                   axis_types=(jax.sharding.AxisType.Auto,) * len(shape))


@pytest.mark.parametrize("impl", ["pallas", "auto"])
def test_kernel_is_built_for_the_traced_meshs_platform(impl):
  """A CPU process tracing for TPU devices builds the Mosaic kernel (compiled, TPU
  compiler parameters), per shard: the platform comes from the mesh, not the process."""
  q, k, v, valid = _inputs(8, 4, 2)
  fn = lambda q, k, v: sharded.staircase_attention(q, k, v, prompt_len=P, block_size=BS,
                                                   key_valid_BN=valid, impl=impl)
  assert jax.default_backend() == "cpu"
  with jax.sharding.use_abstract_mesh(_tpu_abstract_mesh()):
    assert sc.target_platform() == "tpu"
    closed = jax.make_jaxpr(fn)(q, k, v)
  assert "shard_map" in {e.primitive.name for e in closed.jaxpr.eqns}
  calls = _pallas_calls(closed.jaxpr)
  assert len(calls) == 1 and calls[0].params["interpret"] is False
  assert "dimension_semantics" in str(calls[0].params["compiler_params"])  # Mosaic's
  # On this process's own CPU mesh: "auto" is the dense reference, "pallas" is refused.
  mesh = make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
  if impl == "auto":
    assert not _pallas_calls(jax.make_jaxpr(under_mesh(fn, mesh))(q, k, v).jaxpr)
  else:
    with pytest.raises(ValueError, match="estimator.attention_impl.*GPU or TPU"):
      jax.make_jaxpr(under_mesh(fn, mesh))(q, k, v)
