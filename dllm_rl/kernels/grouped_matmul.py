"""Grouped matmuls over contiguous row groups (the MoE experts' dispatch).

``grouped_matmul(x_RD, w_EDF, sizes_E, dispatch)`` = ``y[r] = x[r] @ w[e]`` for the rows r of
group e (groups contiguous, in order, ``sizes_E`` rows each) and 0 for the rows past
Σ sizes (rows of experts held elsewhere under expert parallelism). Two implementations:

* ``"ragged_dot"``: ``jax.lax.ragged_dot``. On TPU XLA's ragged-dot instruction multiplies only
  the routed rows. Elsewhere JAX and XLA expand it into a dense dot over every group with
  per-group row masks: E× the FLOPs, and on XLA's GPU compiler (jax 0.11.2, compiled for an
  absent H100) [E, rows, D] masks — 1205 GiB a device for LLaDA2.0-mini's RL step.
* ``"tiled"``: each group is padded to whole tiles of ``tile`` rows (at most E − 1 + ⌈R/tile⌉
  tiles), so every tile belongs to one group; a ``lax.scan`` over chunks of tiles gathers each
  tile's weight matrix and runs one batched matmul [chunk, tile, D] @ [chunk, D, F]. Exact (a
  row meets only its own group's weights; padding rows are zero), FLOPs within one tile a
  group (and one chunk's rounding) of the routed rows' own, memory one chunk of gathered
  weights; its own VJP gathers them again rather than storing them, and sums each expert's
  weight gradient in float32. Plain XLA: the same program on CPU, GPU and TPU.

* ``"mosaic_gpu"``: JAX's Pallas Mosaic GPU grouped-matmul kernels (Hopper; opt-in, not yet
  run on a GPU): :mod:`dllm_rl.kernels.grouped_matmul_mgpu`.

``"auto"``: ragged_dot when the program compiles for TPU, tiled for GPU and CPU (the platform of
the traced mesh's devices: :func:`dllm_rl.kernels.staircase.target_platform`).
"""

from __future__ import annotations


import jax
import jax.numpy as jnp

from dllm_rl.kernels import grouped_matmul_mgpu as mgpu
from dllm_rl.kernels.staircase import target_platform

DISPATCHES = ("auto", "ragged_dot", "tiled", "mosaic_gpu")
TILE = 128                      # rows a tile at most (fewer when groups are small)
CHUNK_BYTES = 256 * 1024 ** 2   # gathered weights a scan step at most


def resolve(dispatch: str) -> str:
  """The implementation ``dispatch`` runs for the target platform (module docstring);
  ``mgpu.INTERPRET`` (tests) runs the Mosaic GPU kernels in JAX's interpreter."""
  if dispatch == mgpu.INTERPRET:
    mgpu.check_build(interpret=True)
    return dispatch
  if dispatch not in DISPATCHES:
    raise ValueError(f"model.moe_dispatch={dispatch!r} not in {DISPATCHES}")
  target = target_platform()
  if dispatch == "auto":
    return "ragged_dot" if target == "tpu" else "tiled"
  if dispatch == "mosaic_gpu":
    if target != "gpu":
      raise ValueError(f"model.moe_dispatch='mosaic_gpu' needs a GPU target (Hopper: H100/H200),"
                       f" not {target}; use 'auto'")
    mgpu.check_build(interpret=False)
  return dispatch


def tile_rows(rows: int, groups: int) -> int:
  """Rows a tile: the power of two ≥ the mean group size (≥ 8), at most :data:`TILE`."""
  mean = max(1, -(-rows // max(groups, 1)))
  return min(TILE, max(8, 1 << (mean - 1).bit_length()))


def grouped_matmul(x_RD: jax.Array, w_EDF: jax.Array, sizes_E: jax.Array,
                   dispatch: str = "auto") -> jax.Array:
  """[R, F] (x and w's promoted dtype): row r of group e times ``w_EDF[e]``; 0 past
  Σ ``sizes_E`` (≤ R)."""
  impl = resolve(dispatch)
  if impl in ("mosaic_gpu", mgpu.INTERPRET):
    return mgpu.mgpu_matmul(x_RD, w_EDF, sizes_E, interpret=impl == mgpu.INTERPRET)
  if impl == "ragged_dot":
    # Rows past Σ sizes are masked in and out (and so is their gradient), whatever a
    # backend's ragged dot leaves there.
    grouped_R1 = (jnp.arange(x_RD.shape[0]) < sizes_E.sum())[:, None]
    y_RF = jax.lax.ragged_dot(jnp.where(grouped_R1, x_RD, 0), w_EDF, sizes_E)
    return jnp.where(grouped_R1, y_RF, 0)
  return tiled_matmul(x_RD, w_EDF, sizes_E)


def tiled_matmul(x_RD: jax.Array, w_EDF: jax.Array, sizes_E: jax.Array,
                 tile: int | None = None, chunk: int | None = None) -> jax.Array:
  """The ``"tiled"`` grouped matmul (module docstring); ``tile`` / ``chunk``: rows a tile,
  tiles a scan step at most (default :func:`tile_rows`, and as many tiles as
  :data:`CHUNK_BYTES` of gathered weights hold). Contract: Σ ``sizes_E`` ≤ R."""
  r, d = x_RD.shape
  e, _, f = w_EDF.shape
  tile = tile or tile_rows(r, e)
  n_tiles = max(1, -(-r // tile) + e - 1)  # Σ_e ⌈s_e / tile⌉ ≤ ⌈R / tile⌉ + E − 1
  per_tile = max(1, d * f * jnp.dtype(w_EDF.dtype).itemsize)
  max_chunk = min(n_tiles, chunk or max(1, CHUNK_BYTES // per_tile))
  steps = -(-n_tiles // max_chunk)
  chunk = -(-n_tiles // steps)  # the fewest steps, then the fewest padding tiles
  n_tiles = steps * chunk
  sizes_E = sizes_E.astype(jnp.int32)
  tiles_E = -(-sizes_E // tile)
  tile_end_E = jnp.cumsum(tiles_E)
  row_end_E = jnp.cumsum(sizes_E)
  row_R = jnp.arange(r, dtype=jnp.int32)
  group_R = jnp.searchsorted(row_end_E, row_R, side="right")      # e: past Σ sizes
  in_group_R = group_R < e
  g_R = jnp.minimum(group_R, e - 1)
  slot_R = (tile_end_E - tiles_E)[g_R] * tile + row_R - (row_end_E - sizes_E)[g_R]
  slot_R = jnp.where(in_group_R, slot_R, n_tiles * tile + row_R)  # out of range: dropped
  x_SD = jnp.zeros((n_tiles * tile, d), x_RD.dtype).at[slot_R].set(
      x_RD, mode="drop", unique_indices=True)
  tile_ids = jnp.arange(n_tiles, dtype=jnp.int32)
  expert_N = jnp.minimum(jnp.searchsorted(tile_end_E, tile_ids, side="right"), e - 1)
  y_CKTF = _tile_matmuls(x_SD.reshape(steps, chunk, tile, d), expert_N.reshape(steps, chunk),
                         w_EDF)
  y_SF = y_CKTF.reshape(n_tiles * tile, f)
  return jnp.take(y_SF, slot_R, axis=0, mode="fill", fill_value=0)


def _gathered_matmuls(x_KTD, expert_K, w_EDF):
  return jnp.einsum("ktd,kdf->ktf", x_KTD, jnp.take(w_EDF, expert_K, axis=0))


@jax.custom_vjp
def _tile_matmuls(x_CKTD, expert_CK, w_EDF):
  """[C, K, T, F]: tile k of step c times the weights of its expert, a ``lax.scan`` over c."""
  return jax.lax.scan(lambda _, xs: (None, _gathered_matmuls(*xs, w_EDF)), None,
                      (x_CKTD, expert_CK))[1]


def _tile_matmuls_fwd(x_CKTD, expert_CK, w_EDF):
  return _tile_matmuls(x_CKTD, expert_CK, w_EDF), (x_CKTD, expert_CK, w_EDF)


def _tile_matmuls_bwd(res, dy_CKTF):
  """dx per tile in x's dtype; dw summed over each expert's tiles in float32 (a scatter-add
  in a bf16 w's own dtype rounded once per tile: 4-7x ragged_dot's error at 16-256 tiles an
  expert), rounded to w's dtype once. Nothing but the inputs is saved: the weights are
  gathered again here."""
  x_CKTD, expert_CK, w_EDF = res

  def step(dw_EDF, xs):
    x_KTD, expert_K, dy_KTF = xs
    dx_KTD = jnp.einsum("ktf,kdf->ktd", dy_KTF, jnp.take(w_EDF, expert_K, axis=0))
    dw_KDF = jnp.einsum("ktd,ktf->kdf", x_KTD, dy_KTF, preferred_element_type=jnp.float32)
    return dw_EDF.at[expert_K].add(dw_KDF), dx_KTD.astype(x_CKTD.dtype)

  dw_EDF, dx_CKTD = jax.lax.scan(step, jnp.zeros(w_EDF.shape, jnp.float32),
                                 (x_CKTD, expert_CK, dy_CKTF))
  return dx_CKTD, None, dw_EDF.astype(w_EDF.dtype)


_tile_matmuls.defvjp(_tile_matmuls_fwd, _tile_matmuls_bwd)
