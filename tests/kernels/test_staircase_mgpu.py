"""Staircase attention in Pallas Mosaic GPU (impl="mosaic_gpu"): lowered for CUDA (sm_90) on
this CPU host, the JAX Mosaic GPU interpreter against the dense reference (forward and
gradients; JAX ≥ 0.11, where the interpreter exists), and the dispatch errors."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.kernels import staircase as sc
from dllm_rl.kernels import staircase_mgpu as mg
from tests.helpers import left_pad_valid as _left_pad_valid
from tests.helpers import staircase_inputs as _inputs

NO_MGPU = mg.mosaic_gpu_missing()
NO_INTERPRETER = mg.mosaic_gpu_missing(interpret=True)


def _fwd_and_grads(attn, q, k, v, cot):
  def loss(q, k, v):
    o = attn(q, k, v)
    return jnp.sum(o.astype(jnp.float32) * cot), o
  (_, o), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return [o, *grads]


def _kernel(kind, valid, p, bs, pbc, bq=64, bk=64):
  return lambda q, k, v: sc._kernel_attention(q, k, v, valid, p, bs, pbc, kind, bq, bk)


@pytest.mark.skipif(NO_MGPU is not None, reason=f"no Mosaic GPU: {NO_MGPU}")
def test_forward_and_grad_lower_for_cuda():
  """jax.export for CUDA on CPU (sm_90: Mosaic GPU needs no device): forward alone is one
  Mosaic GPU call, its gradient three (forward, dQ, dK/dV), no Triton; GQA, key padding,
  front padding (prompt 16 → 64) and a head dim padded 40 → 64."""
  from jax import export
  p, l, bs = 16, 64, 16
  q, k, v, _ = _inputs(1, p, l, 4, 2, 40, dtype=jnp.bfloat16)
  attn = _kernel("mosaic_gpu", _left_pad_valid(p + 2 * l, (3,)), p, bs, True)
  loss = lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32))
  for fn, calls in ((attn, 1), (jax.grad(loss, argnums=(0, 1, 2)), 3)):
    module = export.export(jax.jit(fn), platforms=["cuda"])(q, k, v).mlir_module()
    assert module.count("@mosaic_gpu_v2(") == calls
    assert "triton" not in module


@pytest.mark.skipif(NO_MGPU is not None, reason=f"no Mosaic GPU: {NO_MGPU}")
def test_sharded_wrapper_lowers_it_inside_shard_map():
  """On a 4-GPU (abstract) mesh the sharded wrapper runs the Mosaic GPU kernels per batch
  shard: the gradient lowers for CUDA with its three calls inside the shard_map."""
  from jax import export

  from dllm_rl.kernels import sharded
  p, l, bs = 16, 64, 16
  q, k, v, _ = _inputs(4, p, l, 4, 2, 64, dtype=jnp.bfloat16)
  valid = _left_pad_valid(p + 2 * l, (0, 3, 0, 1))
  gpu = jax.sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=None, platform="gpu")
  auto = (jax.sharding.AxisType.Auto,) * 3  # jax 0.11's default is Explicit
  mesh = jax.sharding.AbstractMesh((2, 2, 1), ("data", "fsdp", "tensor"), abstract_device=gpu,
                                   axis_types=auto)
  batch = jax.sharding.PartitionSpec(("data", "fsdp"))

  def loss(q, k, v):  # the step's inputs arrive sharded over the batch axes
    q, k, v, valid_BN = (jax.lax.with_sharding_constraint(x, batch) for x in (q, k, v, valid))
    return jnp.sum(sharded.staircase_attention(
        q, k, v, prompt_len=p, block_size=bs, key_valid_BN=valid_BN, impl="mosaic_gpu").astype(
            jnp.float32))

  grad = jax.grad(loss, argnums=(0, 1, 2))
  with jax.sharding.use_abstract_mesh(mesh):
    assert "shard_map" in {e.primitive.name for e in jax.make_jaxpr(grad)(q, k, v).jaxpr.eqns}
    module = export.export(jax.jit(grad), platforms=["cuda"])(q, k, v).mlir_module()
  assert module.count("@mosaic_gpu_v2(") == 3


# b, p, l, block, h, kh, head dim, prompt_block_causal, left pads: front padding (prompt 16
# → 64), tail padding (2L = 96), GQA, a head dim padded 40 → 64, a fully padded prompt.
CASES = [
    (1, 16, 48, 16, 4, 2, 64, True, (3,)),
    (2, 64, 32, 32, 2, 2, 40, False, (0, 64)),
    (1, 8, 32, 8, 2, 1, 64, False, (0,)),
]


@pytest.mark.skipif(NO_INTERPRETER is not None, reason=f"needs JAX >= 0.11's Mosaic GPU "
                    f"interpreter: {NO_INTERPRETER}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"P{c[1]}L{c[2]}bs{c[3]}H{c[4]}K{c[5]}"
                         f"Q{c[6]}pbc{int(c[7])}")
def test_interpreter_matches_reference(case):
  """Output and q/k/v gradients of the kernels (Mosaic GPU interpreter) against the dense
  reference in float32 on the same bfloat16 inputs. Tolerance 2e-2·max|ref|: the kernel
  rounds P (and dS) to bfloat16 before their matmuls and its output to bfloat16 (relative
  2^-9 each, summed over up to N keys), measured ≤ 6e-3·max|ref|; a wrong mask or tile range
  errs by O(max|ref|)."""
  b, p, l, bs, h, kh, qd, pbc, pads = case
  q, k, v, cot = _inputs(b, p, l, h, kh, qd, dtype=jnp.bfloat16)
  valid = _left_pad_valid(p + 2 * l, pads)
  got = _fwd_and_grads(_kernel(mg.INTERPRET, valid, p, bs, pbc), q, k, v, cot)
  ref = lambda q, k, v: sc.staircase_attention_reference(
      q, k, v, prompt_len=p, block_size=bs, key_valid_BN=valid, prompt_block_causal=pbc)
  want = _fwd_and_grads(ref, *(x.astype(jnp.float32) for x in (q, k, v)), cot)
  for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
    assert g.dtype == jnp.bfloat16 and g.shape == w.shape, name
    g, w = np.asarray(g, np.float32), np.asarray(w)
    np.testing.assert_allclose(g, w, atol=2e-2 * np.abs(w).max(), rtol=0, err_msg=name)
  if max(pads) >= p:  # prompt rows of a fully padded prompt see no key: output 0
    assert not np.asarray(got[0], np.float32)[np.argmax(pads), :p].any()


# ---------------------------------------------------------------------------
# Dispatch.

def test_mosaic_gpu_on_a_cpu_target_is_an_error_naming_the_key():
  q, k, v, _ = _inputs(1, 4, 8, 2, 1, 64, dtype=jnp.bfloat16)
  for call in (lambda: sc.default_block_sizes("mosaic_gpu"),
               lambda: sc.staircase_attention(q, k, v, prompt_len=4, block_size=4,
                                              impl="mosaic_gpu")):
    with pytest.raises(ValueError, match=r"impl='mosaic_gpu' \(estimator\.attention_impl\) "
                       "needs a GPU target"):
      call()
  assert "mosaic_gpu" in sc.ATTENTION_IMPLS


@pytest.fixture
def gpu_target(monkeypatch):
  monkeypatch.setattr(sc, "target_platform", lambda: "gpu")
  mg.mosaic_gpu_missing.cache_clear()
  yield
  mg.mosaic_gpu_missing.cache_clear()


def test_mosaic_gpu_without_the_backend_is_an_error(monkeypatch, gpu_target):
  from jax.experimental import pallas
  monkeypatch.setitem(sys.modules, "jax.experimental.pallas.mosaic_gpu", None)
  monkeypatch.delattr(pallas, "mosaic_gpu", raising=False)
  q, k, v, _ = _inputs(1, 4, 8, 2, 1, 64, dtype=jnp.bfloat16)
  with pytest.raises(ValueError, match=r"impl='mosaic_gpu' \(estimator\.attention_impl\): "
                     "jax.experimental.pallas.mosaic_gpu does not import"):
    sc.staircase_attention(q, k, v, prompt_len=4, block_size=4, impl="mosaic_gpu")


def test_mosaic_gpu_without_a_needed_api_is_an_error(monkeypatch, gpu_target):
  from jax.experimental.pallas import mosaic_gpu as plgpu
  monkeypatch.delattr(plgpu, "wgmma")
  with pytest.raises(ValueError, match=r"mosaic_gpu lacks \['wgmma'\]"):
    sc.default_block_sizes("mosaic_gpu")


@pytest.mark.skipif(NO_MGPU is not None, reason=f"no Mosaic GPU: {NO_MGPU}")
@pytest.mark.parametrize("dtype,tiles,match", [
    (jnp.bfloat16, (32, 64), "block_q=32 must be a multiple of 64"),
    (jnp.bfloat16, (64, 96), "block_k=96 must be a multiple of 64"),
    (jnp.float32, (64, 64), "needs bfloat16 or float16 q/k/v"),
])
def test_mosaic_gpu_rejects_tiles_and_dtypes_it_cannot_run(gpu_target, dtype, tiles, match):
  q, k, v, _ = _inputs(1, 4, 8, 2, 1, 64, dtype=dtype)
  with pytest.raises(ValueError, match=match):
    sc.staircase_attention(q, k, v, prompt_len=4, block_size=4, impl="mosaic_gpu",
                           block_q=tiles[0], block_k=tiles[1])
