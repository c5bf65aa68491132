"""``model.moe_dispatch = "mosaic_gpu"`` (dllm_rl.kernels.grouped_matmul_mgpu): JAX's Mosaic GPU
grouped-matmul kernels under our VJP, run in JAX's Mosaic GPU interpreter on CPU (JAX >= 0.11)
against XLA's ragged dot — values, x and w gradients, empty groups, rows past Σ sizes, row
counts off the tiles, and the MoE experts under the samplers' vmap — and the clear errors
where it cannot run."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.kernels import grouped_matmul as gmm
from dllm_rl.kernels import grouped_matmul_mgpu as gm
from dllm_rl.models.moe_local import grouped_experts
from tests.kernels.test_grouped_matmul import _problem, _under, _value_and_grads

NO_INTERPRETER = gm.mosaic_gpu_missing(interpret=True)
needs_interpreter = pytest.mark.skipif(
    NO_INTERPRETER is not None,
    reason=f"needs JAX >= 0.11's Mosaic GPU interpreter: {NO_INTERPRETER}")


@pytest.fixture
def sm_count(monkeypatch):
  """A first device with 3 SMs: JAX's weight-gradient kernel sizes its persistent grid from
  ``jax.devices()[0].core_count``, which CPU devices lack (the interpreter then runs 3
  programs that share the tiles, as 132 would on an H100)."""
  monkeypatch.setattr(jax, "devices", lambda *a: [types.SimpleNamespace(core_count=3,
                                                                          platform="gpu")])


def _bf16(x, w):
  return x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)


def _rel(got, want):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  return float(np.abs(got - want).max() / (np.abs(want).max() + 1e-30))


CASES = [  # rows, D, F, group sizes
    (320, 128, 192, (100, 0, 60, 1, 96)),  # rows past Σ sizes; 64- and 128-wide tiles
    (300, 64, 128, (0, 150, 150)),         # rows off the 128-row tiles
    (40, 128, 64, (10, 0, 20, 0)),         # fewer rows than one tile
    (64, 64, 64, (0, 0, 0, 0)),            # no row routed here
]


@needs_interpreter
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"r{c[0]}e{len(c[3])}")
def test_matches_the_ragged_dot_values_and_gradients(case, sm_count):
  """bf16 in, bf16 out: values and both gradients within bf16 rounding of XLA's ragged dot on
  the same bf16 inputs in float32 (max error under 1 % of the largest entry, where bf16's
  rounding is 0.4 %); rows past Σ sizes are exactly 0 and get exactly 0."""
  r, d, f, sizes = case
  x, w, sizes_E, ct = _problem(r, d, f, sizes)
  xb, wb = _bf16(x, w)
  want = _value_and_grads(lambda x, w: gmm.grouped_matmul(x, w, sizes_E, "ragged_dot"),
                          xb.astype(jnp.float32), wb.astype(jnp.float32), ct)
  got = _value_and_grads(lambda x, w: gmm.grouped_matmul(x, w, sizes_E, gm.INTERPRET).astype(
      jnp.float32), xb, wb, ct)
  assert got[0].dtype == jnp.float32 and got[1].dtype == got[2].dtype == jnp.bfloat16
  for a, b in zip(got, want):
    assert _rel(a, b) < 1e-2, (_rel(a, b), a.shape)
  routed = sum(sizes)
  assert not np.any(np.asarray(got[0])[routed:])
  assert not np.any(np.asarray(got[1], np.float32)[routed:])


@needs_interpreter
def test_rows_past_the_groups_may_hold_nan(sm_count):
  """Rows past Σ sizes may hold anything: NaN there in x (the weight-gradient kernel zeroes a
  group's last partial block by multiplying, and NaN · 0 is NaN) reaches neither y nor a
  gradient; the custom VJP on its own (no outer mask) turns a NaN cotangent there into no
  NaN, in dw or dx, whose rows the kernel leaves unwritten."""
  r, d, f, sizes = 200, 64, 64, (70, 0, 57)  # 127 rows grouped: a partial block of 64
  x, w, sizes_E, ct = _problem(r, d, f, sizes)
  xb, wb = _bf16(x, w)
  past_R1 = (jnp.arange(r) >= sum(sizes))[:, None]
  nan_x, nan_ct = jnp.where(past_R1, jnp.nan, xb), jnp.where(past_R1, jnp.nan, ct)
  want = _value_and_grads(lambda x, w: gmm.grouped_matmul(x, w, sizes_E, "ragged_dot"),
                          xb.astype(jnp.float32), wb.astype(jnp.float32), ct)
  got = _value_and_grads(lambda x, w: gmm.grouped_matmul(x, w, sizes_E, gm.INTERPRET).astype(
      jnp.float32), nan_x, wb, ct)
  for a, b in zip(got, want):
    assert np.all(np.isfinite(np.asarray(a, np.float32))) and _rel(a, b) < 1e-2, _rel(a, b)
  zero_x = jnp.where(past_R1, 0, xb)  # as mgpu_matmul hands it on
  y, vjp = jax.jit(lambda x, w: jax.vjp(lambda x, w: gm._matmul(x, w, sizes_E, True), x, w))(
      zero_x, wb)
  dx, dw = jax.jit(vjp)(nan_ct.astype(y.dtype))
  assert dx.dtype == dw.dtype == jnp.bfloat16
  assert not np.any(np.asarray(dx, np.float32)[sum(sizes):])
  for a, b in zip((dx, dw), want[1:]):
    assert np.all(np.isfinite(np.asarray(a, np.float32))) and _rel(a, b) < 1e-2, _rel(a, b)


@needs_interpreter
def test_the_experts_under_the_samplers_vmap_match_the_tiled_dispatch(sm_count):
  """The MoE experts (sort, three grouped matmuls, unsort, combine) vmapped over 2 lanes with
  shared weights, value and gradients: the Mosaic GPU dispatch = the tiled one within bf16
  rounding."""
  t, k, e, d, f = 48, 2, 4, 64, 128
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(size=(2, t, d)), jnp.bfloat16)
  idx = jnp.asarray(rng.integers(0, e, size=(2, t, k)), jnp.int32)
  wt = jnp.asarray(rng.uniform(size=(2, t, k)), jnp.float32)
  g, u = (jnp.asarray(rng.normal(size=(e, d, f)) / 8, jnp.bfloat16) for _ in range(2))
  dn = jnp.asarray(rng.normal(size=(e, f, d)) / 8, jnp.bfloat16)

  def run(dispatch):
    fn = lambda x, g, u, dn: jax.vmap(lambda x, i, w: grouped_experts(
        x, i, w, g, u, dn, dispatch))(x, idx, wt)
    loss = lambda *a: jnp.sum(fn(*a) ** 2)
    return jax.jit(lambda *a: (fn(*a), jax.grad(loss, argnums=(0, 1, 2, 3))(*a)))(x, g, u, dn)

  (y_tiled, grads_tiled), (y_mgpu, grads_mgpu) = run("tiled"), run(gm.INTERPRET)
  assert _rel(y_mgpu, y_tiled) < 1e-2
  for a, b in zip(grads_mgpu, grads_tiled):
    assert _rel(a, b) < 2e-2, (_rel(a, b), a.shape)


@pytest.mark.skipif(gm.mosaic_gpu_missing() is not None, reason="no Mosaic GPU in this JAX")
def test_the_experts_lower_for_cuda_inside_the_expert_parallel_shard_map(monkeypatch):
  """On an 8-GPU (abstract) mesh, data 2 × expert 2 × tensor 2, the routed experts' gradient
  lowers for CUDA: the dispatch resolves to the GPU build inside ``shard_map`` (the target is
  the traced mesh's device), the rows travel by all-to-all and the 12 grouped matmuls (3
  forward, 3 recomputed, 3 dx, 3 dw) are Mosaic GPU calls at the experts' local width (F = 128
  over tensor 2: 64). The interpreter cannot run this: on several simulated devices its
  end-of-kernel check sees another device's barriers (jax 0.11.2)."""
  from jax import export

  from dllm_rl.models import moe
  monkeypatch.setattr(jax, "devices", lambda *a: [types.SimpleNamespace(core_count=132,
                                                                          platform="gpu")])
  gpu = jax.sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=None, platform="gpu")
  mesh = jax.sharding.AbstractMesh((2, 1, 2, 2), ("data", "fsdp", "expert", "tensor"),
                                   abstract_device=gpu,
                                   axis_types=(jax.sharding.AxisType.Auto,) * 4)
  b, n, d, e, f, k = 8, 16, 128, 8, 128, 2
  spec = lambda *s: jax.ShapeDtypeStruct(s[:-1], s[-1])
  args = (spec(b, n, d, jnp.bfloat16), spec(b, n, k, jnp.float32), spec(e, d, f, jnp.bfloat16),
          spec(e, d, f, jnp.bfloat16), spec(e, f, d, jnp.bfloat16), spec(b, n, k, jnp.int32))
  loss = lambda x, w, g, u, dn, idx: jnp.sum(moe.routed_experts(x, idx, w, g, u, dn,
                                                                "mosaic_gpu"))
  grad = jax.grad(loss, argnums=(0, 1, 2, 3, 4))
  with jax.sharding.use_abstract_mesh(mesh):
    assert "shard_map" in {q.primitive.name for q in jax.make_jaxpr(grad)(*args).jaxpr.eqns}
    module = export.export(jax.jit(grad), platforms=["cuda"], disabled_checks=[
        export.DisabledSafetyCheck.custom_call("ragged_all_to_all")])(*args).mlir_module()
  assert module.count("@mosaic_gpu_v2(") == 12 and "ragged_all_to_all" in module


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_needs_a_gpu_target(platform):
  with _under(platform), pytest.raises(ValueError, match="moe_dispatch='mosaic_gpu' needs a GPU"):
    gmm.resolve("mosaic_gpu")


def test_a_jax_without_the_kernels_is_named(monkeypatch):
  """The staircase kernels' Pallas Mosaic GPU APIs present, JAX's grouped-matmul kernel modules
  absent: resolving the dispatch says which module is missing, before anything is traced."""
  real = gm.importlib.import_module

  def without_ops(name, *args):
    if name.startswith("jax.experimental.pallas.ops.gpu."):
      raise ImportError(f"No module named {name!r}")
    return real(name, *args)

  monkeypatch.setattr(gm.importlib, "import_module", without_ops)
  gm._kernels_missing.cache_clear()
  try:
    with _under("gpu"), pytest.raises(ValueError, match=r"has no jax\.experimental\.pallas\.ops"
                                                         r"\.gpu\.ragged_dot_mgpu.*'tiled'"):
      gmm.resolve("mosaic_gpu")
  finally:
    gm._kernels_missing.cache_clear()


def test_auto_never_picks_it():
  with _under("gpu"):
    assert gmm.resolve("auto") == "tiled"


@pytest.mark.parametrize("dtype,d,f,match", [
    (jnp.float32, 64, 64, "bfloat16 or float16"),
    ((jnp.bfloat16, jnp.float32), 64, 64, "x bfloat16 and w float32 \\(promoted: float32\\)"),
    ((jnp.float16, jnp.bfloat16), 64, 64, "x float16 and w bfloat16 \\(promoted: float32\\)"),
    (jnp.bfloat16, 96, 64, "D = 96 to be a multiple of 64"),
    (jnp.bfloat16, 64, 32, "F = 32 to be a multiple of 64"),
], ids=["float32", "bf16_x_f32_w", "f16_x_bf16_w", "d96", "f32"])
def test_unsupported_operands_name_the_config_key(dtype, d, f, match):
  """Mixed operands name both dtypes: bf16 × f16 promote to float32, which no wgmma takes."""
  x_dtype, w_dtype = dtype if isinstance(dtype, tuple) else (dtype, dtype)
  x, w, sizes_E, _ = _problem(16, d, f, (8, 8))
  with pytest.raises(ValueError, match=match) as err:
    gm.mgpu_matmul(x.astype(x_dtype), w.astype(w_dtype), sizes_E)
  assert "model.moe_dispatch='mosaic_gpu'" in str(err.value)


def test_the_weight_gradient_needs_a_gpu_process():
  """JAX's weight-gradient kernel reads the SM count of ``jax.devices()[0]``: in a CPU process
  the error says so (and what to plan with) instead of an AttributeError deep in JAX."""
  with pytest.raises(ValueError, match="core_count.*'tiled'"):
    gm.sm_count()

