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
  group of the routed rows' own, memory one chunk of gathered weights (the scan body is
  rematerialised, so the backward regathers instead of storing them). Plain XLA: the same
  program on CPU, GPU and TPU, differentiable by JAX.

``"auto"``: ragged_dot when the program compiles for TPU, tiled for GPU and CPU (the platform of
the traced mesh's devices: :func:`dllm_rl.kernels.staircase.target_platform`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dllm_rl.kernels.staircase import target_platform

DISPATCHES = ("auto", "ragged_dot", "tiled")
TILE = 128                      # rows a tile at most (fewer when groups are small)
CHUNK_BYTES = 256 * 1024 ** 2   # gathered weights a scan step at most


def resolve(dispatch: str) -> str:
  """The implementation ``dispatch`` runs for the target platform (module docstring)."""
  if dispatch not in DISPATCHES:
    raise ValueError(f"model.moe_dispatch={dispatch!r} not in {DISPATCHES}")
  if dispatch == "auto":
    return "ragged_dot" if target_platform() == "tpu" else "tiled"
  return dispatch


def tile_rows(rows: int, groups: int) -> int:
  """Rows a tile: the power of two ≥ the mean group size (≥ 8), at most :data:`TILE`."""
  mean = max(1, -(-rows // max(groups, 1)))
  return min(TILE, max(8, 1 << (mean - 1).bit_length()))


def grouped_matmul(x_RD: jax.Array, w_EDF: jax.Array, sizes_E: jax.Array,
                   dispatch: str = "auto") -> jax.Array:
  """[R, F] in ``x``'s dtype: row r of group e times ``w_EDF[e]``; 0 past Σ ``sizes_E``."""
  if resolve(dispatch) == "ragged_dot":  # rows past Σ sizes: masked in and out (and so their
    grouped_R1 = (jnp.arange(x_RD.shape[0]) < sizes_E.sum())[:, None]  # gradient), whatever
    y_RF = jax.lax.ragged_dot(jnp.where(grouped_R1, x_RD, 0), w_EDF, sizes_E)  # ragged_dot
    return jnp.where(grouped_R1, y_RF, 0)  # leaves there
  return tiled_matmul(x_RD, w_EDF, sizes_E)


def tiled_matmul(x_RD: jax.Array, w_EDF: jax.Array, sizes_E: jax.Array,
                 tile: int | None = None, chunk: int | None = None) -> jax.Array:
  """The ``"tiled"`` grouped matmul (module docstring); ``tile`` / ``chunk``: rows a tile,
  tiles a scan step (default :func:`tile_rows`, and as many tiles as :data:`CHUNK_BYTES`
  of gathered weights hold)."""
  r, d = x_RD.shape
  e, _, f = w_EDF.shape
  tile = tile or tile_rows(r, e)
  n_tiles = max(1, -(-r // tile) + e - 1)  # Σ_e ⌈s_e / tile⌉ ≤ ⌈R / tile⌉ + E − 1
  per_tile = d * f * jnp.dtype(w_EDF.dtype).itemsize
  chunk = min(n_tiles, chunk or max(1, CHUNK_BYTES // per_tile))
  n_tiles = -(-n_tiles // chunk) * chunk
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

  @functools.partial(jax.checkpoint, prevent_cse=False)
  def step(carry, xs):
    x_KTD, expert_K = xs
    return carry, jnp.einsum("ktd,kdf->ktf", x_KTD, jnp.take(w_EDF, expert_K, axis=0))

  _, y_CKTF = jax.lax.scan(step, None, (x_SD.reshape(-1, chunk, tile, d),
                                        expert_N.reshape(-1, chunk)))
  y_SF = y_CKTF.reshape(n_tiles * tile, f)
  return jnp.take(y_SF, slot_R, axis=0, mode="fill", fill_value=0)
