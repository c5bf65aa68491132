"""The grouped matmul on Hopper GPUs (``model.moe_dispatch = "mosaic_gpu"``): JAX's own Pallas
Mosaic GPU grouped-matmul kernels (``jax.experimental.pallas.ops.gpu``), opt-in and not yet
run on a GPU.

``mgpu_matmul(x_RD, w_EDF, sizes_E)`` = ``dllm_rl.kernels.grouped_matmul.grouped_matmul``'s
contract (row r of group e times ``w_EDF[e]``; 0 past Σ ``sizes_E``) with a custom VJP:

* forward ``y = ragged_dot_mgpu(x, w)`` and input gradient ``dx = ragged_dot_mgpu(dy, wᵀ)``
  (``transpose_rhs``): a persistent kernel over the SMs, each program a (row tile, column
  tile) of one group, weights read by TMA straight from the stacked ``[E, D, F]`` (no
  gathered copy, unlike the tiled dispatch), wgmma with a float32 accumulator;
* weight gradient ``dw[e] = x[rows of e]ᵀ dy[rows of e]`` by ``transposed_ragged_dot_mgpu``
  (float32 accumulation over each group's rows, rounded once).

Rows past Σ sizes hold whatever the kernels leave there (uninitialised memory: NaN in the
interpreter), so they are masked to zero on the way in and out, as the other dispatches do.

Limits (each a ValueError naming ``model.moe_dispatch``): bfloat16 or float16 operands (wgmma),
D and F multiples of 64 (tiles of 64 or 128), a GPU target with Pallas Mosaic GPU. JAX's
weight-gradient kernel takes its grid from ``jax.devices()[0].core_count`` (the SM count), so
the backward traces only in a process whose first device is a GPU: a compile-only plan on a
CPU host (``dllm_rl.plan --topology=h100-N``) can plan the samplers, not the RL step — plan
that with ``tiled``. The interpreter build (dispatch ``"mosaic_gpu_interpret"``, JAX ≥ 0.11)
runs the same kernels on CPU for the tests.
"""

from __future__ import annotations

import contextlib
import functools
import importlib

import jax
import jax.numpy as jnp

from dllm_rl.kernels.staircase_mgpu import mosaic_gpu_missing

INTERPRET = "mosaic_gpu_interpret"  # the kernels in JAX's Mosaic GPU interpreter (tests)
BLOCK_ROWS = 128          # rows of a group a program multiplies (the kernels' block_m)
BLOCK_K = 64              # contraction depth a pipeline stage loads
CONCURRENT_STEPS = 4      # pipeline stages in flight (SMEM: 4 × 32 KiB + the output tile)
_KEY = "model.moe_dispatch='mosaic_gpu'"


def check_build(interpret: bool) -> None:
  """ValueError unless this JAX can build (or, ``interpret``, interpret) the kernels: Pallas
  Mosaic GPU, and JAX's grouped-matmul kernels in it."""
  missing = mosaic_gpu_missing(interpret) or _kernels_missing()
  if missing:
    raise ValueError(f"{_KEY}: {missing}; use 'tiled' there")


@functools.cache
def _kernels_missing() -> str | None:
  for name in ("ragged_dot_mgpu", "transposed_ragged_dot_mgpu"):
    module = f"jax.experimental.pallas.ops.gpu.{name}"
    try:
      importlib.import_module(module)
    except ImportError as err:
      return f"jax {jax.__version__} has no {module} ({type(err).__name__}: {err})"
  return None


def _block(dim: int, name: str) -> int:
  """Tile of a weight dimension: 128 where it divides it, else 64."""
  if dim % 64:
    raise ValueError(f"{_KEY} needs {name} = {dim} to be a multiple of 64 (the kernels'"
                     " tiles); use 'tiled' for this model")
  return 128 if dim % 128 == 0 else 64


def _operand_dtype(x_dtype, w_dtype) -> jnp.dtype:
  """The dtype x and w promote to; a ValueError unless a 16-bit float (bf16 with f16 promotes
  to f32)."""
  dtype = jnp.promote_types(x_dtype, w_dtype)
  if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    raise ValueError(f"{_KEY} needs bfloat16 or float16 activations and expert weights"
                     f" (wgmma operands), got x {jnp.dtype(x_dtype).name} and w"
                     f" {jnp.dtype(w_dtype).name} (promoted: {dtype.name}): set model.dtype,"
                     " or use 'tiled'")
  return dtype


def sm_count() -> int:
  """The SM count JAX's weight-gradient kernel reads (``jax.devices()[0].core_count``); a
  ValueError naming the config key where this process's first device has none."""
  device = jax.devices()[0]
  count = getattr(device, "core_count", None)
  if not count:
    raise ValueError(f"{_KEY}: the weight gradient (JAX's transposed_ragged_dot_mgpu) takes"
                     f" its grid from jax.devices()[0].core_count, and this process's first"
                     f" device ({device.platform}) has none: train in a GPU process; plan an"
                     " RL step without a GPU with 'tiled'")
  return count


def mgpu_matmul(x_RD: jax.Array, w_EDF: jax.Array, sizes_E: jax.Array, *,
                interpret: bool = False) -> jax.Array:
  """[R, F] in the promoted dtype of x and w: the grouped matmul by JAX's Mosaic GPU kernels
  (module docstring); 0 past Σ ``sizes_E`` (≤ R)."""
  dtype = _operand_dtype(x_RD.dtype, w_EDF.dtype)
  _block(w_EDF.shape[1], "the experts' input width D")
  _block(w_EDF.shape[2], "the experts' output width F")
  check_build(interpret)
  grouped_R1 = (jnp.arange(x_RD.shape[0]) < sizes_E.sum())[:, None]
  x_RD = jnp.where(grouped_R1, x_RD, 0).astype(dtype)
  y_RF = _matmul(x_RD, w_EDF.astype(dtype), sizes_E.astype(jnp.int32), interpret)
  return jnp.where(grouped_R1, y_RF, 0)


def _mode(interpret: bool):
  """The context the kernels are traced in: JAX's Mosaic GPU interpreter, or as they are."""
  if not interpret:
    return contextlib.nullcontext()
  from jax.experimental.pallas import mosaic_gpu as plgpu
  return plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams())


def _ragged_dot(lhs_RK, rhs_EKN, sizes_E, interpret, *, transpose_rhs=False):
  from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu
  n, name = (rhs_EKN.shape[1], "D") if transpose_rhs else (rhs_EKN.shape[2], "F")
  with _mode(interpret):
    return ragged_dot_mgpu.ragged_dot(
        lhs_RK, rhs_EKN, group_sizes=sizes_E, block_m=BLOCK_ROWS, block_n=_block(n, name),
        block_k=BLOCK_K, max_concurrent_steps=CONCURRENT_STEPS, grid_block_n=1,
        transpose_rhs=transpose_rhs)


def _weight_grad(x_RD, dy_RF, sizes_E, interpret):
  """[E, D, F] in x's dtype: each group's xᵀ dy (float32 accumulation in the kernel)."""
  from jax.experimental.pallas.ops.gpu import transposed_ragged_dot_mgpu
  sm_count()
  d, f = x_RD.shape[1], dy_RF.shape[1]
  with _mode(interpret):
    return transposed_ragged_dot_mgpu.transposed_ragged_dot(
        x_RD, dy_RF, group_sizes=sizes_E, block_m=_block(d, "D"), block_n=_block(f, "F"),
        block_k=BLOCK_K, max_concurrent_steps=CONCURRENT_STEPS, grid_block_n=1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _matmul(x_RD, w_EDF, sizes_E, interpret):
  return _ragged_dot(x_RD, w_EDF, sizes_E, interpret)


def _matmul_fwd(x_RD, w_EDF, sizes_E, interpret):
  return _ragged_dot(x_RD, w_EDF, sizes_E, interpret), (x_RD, w_EDF, sizes_E)


def _matmul_bwd(interpret, res, dy_RF):
  """dx = dy wᵀ per group, dw per group; rows past Σ sizes carry no cotangent (the caller's
  mask zeroed them) and get none back."""
  x_RD, w_EDF, sizes_E = res
  grouped_R1 = (jnp.arange(x_RD.shape[0]) < sizes_E.sum())[:, None]
  dy_RF = jnp.where(grouped_R1, dy_RF, 0).astype(x_RD.dtype)
  dx_RD = _ragged_dot(dy_RF, w_EDF, sizes_E, interpret, transpose_rhs=True)
  dw_EDF = _weight_grad(x_RD, dy_RF, sizes_E, interpret)
  return jnp.where(grouped_R1, dx_RD, 0), dw_EDF.astype(w_EDF.dtype), None


_matmul.defvjp(_matmul_fwd, _matmul_bwd)
