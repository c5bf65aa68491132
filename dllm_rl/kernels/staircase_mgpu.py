"""Staircase attention kernels in Pallas Mosaic GPU (``impl="mosaic_gpu"``), the port off
Pallas Triton, which JAX 0.11 deprecates. Step 1 of the port: correct and untuned.

The same flash algorithm, layout and index arithmetic as ``staircase.py`` (whose
``_row_bounds``, tile ranges and ``_mask`` these kernels call): forward (online softmax, f32
logsumexp), dQ and dK/dV (FA-2 backward from the saved logsumexp), a ``custom_vjp``; GQA
(query head h reads key/value head h // (H / K); dK/dV per query head, summed over each
group outside the kernel), ``key_valid_BN``, front/tail padding to tile multiples and
``prompt_block_causal``. Built with ``plgpu.kernel``: one warpgroup per (batch, head, tile)
program, tiles of a multiple of 64 rows (the rows of one warpgroup's ``wgmma``), head dims
padded to a multiple of 64 (by the caller, ``staircase._kernel_attention``).

Per key (or query) tile, each program copies the tile GMEM→SMEM by TMA and waits for it
(no double buffering), computes scores with ``wgmma`` (bf16/f16 operands from SMEM, f32
accumulator), masks them from row/column indices, writes the probabilities (or dS) to SMEM
and multiplies them by V (or K, Q, dO) with a second ``wgmma``. Per-row vectors (logsumexp,
delta) and the key-validity tile also come through SMEM: Mosaic GPU loads no vector from
GMEM into registers. Registers read from an SMEM buffer are consumed before the
``commit_smem`` (a warpgroup barrier) that precedes the next TMA into that buffer.

Compiled only for sm_90 (H100/H200): a CPU process lowers it (``jax.export`` for
``cuda``), and JAX ≥ 0.11's Mosaic GPU interpreter runs it on CPU (kind
``mosaic_gpu_interpret``, tests only).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from dllm_rl.kernels.staircase_index import (
    _NEG,
    _Layout,
    _div,
    _flash_vjp,
    _kv_tiles_for_q_tile,
    _mask,
    _q_tiles_for_kv_tile,
    _row_bounds,
    _tile_index,
)

TILE = 64  # rows of one warpgroup's wgmma: tiles and head dims are multiples of it
INTERPRET = "mosaic_gpu_interpret"  # _Layout.kind of the CPU interpreter build (tests)
_APIS = ("kernel", "wgmma", "ACC", "SMEM", "Barrier", "copy_gmem_to_smem", "barrier_wait",
         "commit_smem", "copy_smem_to_gmem", "wait_smem_to_gmem", "CompilerParams",
         "LoweringSemantics")


@functools.cache
def mosaic_gpu_missing(interpret: bool = False) -> str | None:
  """Why this JAX cannot build the kernels (``interpret``: run them in the Mosaic GPU
  interpreter on CPU), or None."""
  try:
    from jax.experimental.pallas import mosaic_gpu as plgpu
  except ImportError as err:
    return f"jax.experimental.pallas.mosaic_gpu does not import ({type(err).__name__}: {err})"
  needed = _APIS + (("InterpretGPUParams",) if interpret else ())
  absent = [name for name in needed if not hasattr(plgpu, name)]
  if absent:
    return f"jax {jax.__version__}'s jax.experimental.pallas.mosaic_gpu lacks {absent}"
  return None


def check_dtype(dtype) -> None:
  """ValueError unless q/k/v are 16-bit floats (wgmma's bf16/f16 operands). Tiles (multiples
  of 64) are checked by ``staircase._check_tiles``; the caller pads head dims to 64."""
  if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    raise ValueError(f"impl='mosaic_gpu' (estimator.attention_impl) needs bfloat16 or float16"
                     f" q/k/v (wgmma operands), got {jnp.dtype(dtype).name}")


def _plgpu():
  from jax.experimental.pallas import mosaic_gpu as plgpu
  return plgpu


def _kernel(body, lay: _Layout, *, name, out_type, grid, scratch):
  """``plgpu.kernel`` ``name`` (the Triton kernel's: it names the kernel's compiler dumps,
  benchmarks/gpu_compile.py) over grid (b, h, t) with Warpgroup lowering (explicit: jax 0.10's
  default Lane semantics cannot lower these kernels)."""
  plgpu = _plgpu()
  interpret = plgpu.InterpretGPUParams() if lay.kind == INTERPRET else None
  params = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
  return plgpu.kernel(body, out_type=out_type, grid=grid, grid_names=("b", "h", "t"),
                      kernel_name=name, scratch_types=scratch, compiler_params=params,
                      interpret=interpret)


def _program():
  return tuple(lax.axis_index(name) for name in ("b", "h", "t"))


def _fetch(copies, bars):
  """Issue the TMA copies (src GMEM view, dst SMEM ref, barrier index); returns a function
  waiting for those whose barrier index it is given."""
  plgpu = _plgpu()
  for src, dst, i in copies:
    plgpu.copy_gmem_to_smem(src, dst, bars.at[i])
  return lambda *idx: [plgpu.barrier_wait(bars.at[i]) for i in idx]


def _store(pairs):
  """Registers → SMEM → GMEM for (value, SMEM ref, GMEM view) pairs, then wait for it."""
  plgpu = _plgpu()
  for value, smem, _ in pairs:
    smem[...] = value.astype(smem.dtype)
  plgpu.commit_smem()
  for _, smem, gmem in pairs:
    plgpu.copy_smem_to_gmem(smem, gmem)
  plgpu.wait_smem_to_gmem(0)


def _mm(a_ref, b_ref, shape):
  """float32 a @ b by wgmma (SMEM operands; b may be a transposed view)."""
  plgpu = _plgpu()

  def run(acc_ref):
    plgpu.wgmma(acc_ref, a_ref, b_ref)
    return acc_ref[...]  # waits for the wgmma

  return pl.run_scoped(run, plgpu.ACC(shape, jnp.float32))


def _bcast(x, shape, dim):
  """A vector along dimension ``dim`` of ``shape``."""
  return lax.broadcast_in_dim(x, shape, (dim,))


def _row_mask(rows, cols, valid, shape, dim):
  """``staircase._mask`` with per-row bounds and key validity as vectors: rows along
  dimension ``dim`` of ``shape``, keys (``cols``, already [*shape]) along the other."""
  bounds = tuple(_bcast(x, shape, dim) for x in rows)
  return _mask(bounds, cols, _bcast(valid, shape, 1 - dim) > 0)


def _smem(plgpu, shape, dtype, count=1):
  return [plgpu.SMEM(shape, dtype) for _ in range(count)]


# ----------------------------------------------------------------------------
# Forward: one query tile per program, over the key tiles it sees.

def _forward(q, k, v, valid, lay: _Layout):
  """(o [B, H, N, D], lse [B, H, N] f32) for q [B, H, N, D], k/v [B, K, N, D], valid
  [B, N] int32 (N, D padded)."""
  plgpu = _plgpu()
  b, h, n, d = q.shape
  bq, bk, group = lay.block_q, lay.block_k, h // k.shape[1]
  scratch = [*_smem(plgpu, (bq, d), q.dtype), *_smem(plgpu, (bk, d), q.dtype, 2),
             plgpu.SMEM((bq, bk), q.dtype), plgpu.SMEM((bk,), jnp.int32),
             plgpu.SMEM((bq,), jnp.float32), plgpu.Barrier(num_barriers=4)]

  def body(q_ref, k_ref, v_ref, valid_ref, o_ref, lse_ref,
           q_s, k_s, v_s, p_s, valid_s, lse_s, bars):
    bi, hi, qt = _program()
    kv, q0 = _div(hi, group), qt * bq
    _fetch([(q_ref.at[bi, hi, pl.ds(q0, bq)], q_s, 0)], bars)(0)
    rows = _row_bounds(q0 + lax.broadcasted_iota(jnp.int32, (bq,), 0), lay)
    n1, s2, n2 = _kv_tiles_for_q_tile(qt, lay)

    def step(t, carry):
      m, l, acc = carry
      k0 = _tile_index(t, 0, n1, s2) * bk
      wait = _fetch([(k_ref.at[bi, kv, pl.ds(k0, bk)], k_s, 1),
                     (valid_ref.at[bi, pl.ds(k0, bk)], valid_s, 2),
                     (v_ref.at[bi, kv, pl.ds(k0, bk)], v_s, 3)], bars)
      wait(1, 2)
      cols = k0 + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
      mask = _row_mask(rows, cols, valid_s[...], (bq, bk), 0)
      s = jnp.where(mask, _mm(q_s, k_s.transpose((1, 0)), (bq, bk)) * lay.scale, _NEG)
      m_new = jnp.maximum(m, s.max(axis=1))
      p = jnp.where(mask, jnp.exp(s - _bcast(m_new, (bq, bk), 0)), 0.0)
      corr = jnp.exp(m - m_new)
      p_s[...] = p.astype(p_s.dtype)
      plgpu.commit_smem()
      wait(3)
      pv = _mm(p_s, v_s, (bq, d))
      return m_new, corr * l + p.sum(axis=1), _bcast(corr, (bq, d), 0) * acc + pv

    init = (jnp.full((bq,), _NEG, jnp.float32), jnp.zeros((bq,), jnp.float32),
            jnp.zeros((bq, d), jnp.float32))
    m, l, acc = lax.fori_loop(0, n1 + n2, step, init)
    seen = l > 0.0  # rows with no valid key: output 0, lse 0
    l_safe = jnp.where(seen, l, 1.0)
    o = jnp.where(_bcast(seen, (bq, d), 0), acc / _bcast(l_safe, (bq, d), 0), 0.0)
    _store([(o, q_s, o_ref.at[bi, hi, pl.ds(q0, bq)]),
            (jnp.where(seen, m + jnp.log(l_safe), 0.0), lse_s,
             lse_ref.at[bi, hi, pl.ds(q0, bq)])])

  out = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, n), jnp.float32)]
  return _kernel(body, lay, name="staircase_fwd", out_type=out, grid=(b, h, n // bq),
                 scratch=scratch)(q, k, v, valid)


# ----------------------------------------------------------------------------
# Backward: dQ per query tile; dK/dV per key tile (scores transposed, [bk, bq]).

def _dq(q, k, v, valid, do, lse, delta, lay: _Layout):
  plgpu = _plgpu()
  b, h, n, d = q.shape
  bq, bk, group = lay.block_q, lay.block_k, h // k.shape[1]
  scratch = [*_smem(plgpu, (bq, d), q.dtype, 2), *_smem(plgpu, (bk, d), q.dtype, 2),
             plgpu.SMEM((bq, bk), q.dtype), plgpu.SMEM((bk,), jnp.int32),
             *_smem(plgpu, (bq,), jnp.float32, 2), plgpu.Barrier(num_barriers=7)]

  def body(q_ref, k_ref, v_ref, valid_ref, do_ref, lse_ref, delta_ref, dq_ref,
           q_s, do_s, k_s, v_s, ds_s, valid_s, lse_s, delta_s, bars):
    bi, hi, qt = _program()
    kv, q0 = _div(hi, group), qt * bq
    tile = pl.ds(q0, bq)
    _fetch([(q_ref.at[bi, hi, tile], q_s, 0), (do_ref.at[bi, hi, tile], do_s, 1),
            (lse_ref.at[bi, hi, tile], lse_s, 2),
            (delta_ref.at[bi, hi, tile], delta_s, 3)], bars)(0, 1, 2, 3)
    lse, delta = lse_s[...], delta_s[...]
    rows = _row_bounds(q0 + lax.broadcasted_iota(jnp.int32, (bq,), 0), lay)
    n1, s2, n2 = _kv_tiles_for_q_tile(qt, lay)

    def step(t, dq):
      k0 = _tile_index(t, 0, n1, s2) * bk
      _fetch([(k_ref.at[bi, kv, pl.ds(k0, bk)], k_s, 4),
              (v_ref.at[bi, kv, pl.ds(k0, bk)], v_s, 5),
              (valid_ref.at[bi, pl.ds(k0, bk)], valid_s, 6)], bars)(4, 5, 6)
      cols = k0 + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
      mask = _row_mask(rows, cols, valid_s[...], (bq, bk), 0)
      s = _mm(q_s, k_s.transpose((1, 0)), (bq, bk)) * lay.scale
      p = jnp.where(mask, jnp.exp(s - _bcast(lse, (bq, bk), 0)), 0.0)
      ds = p * (_mm(do_s, v_s.transpose((1, 0)), (bq, bk)) - _bcast(delta, (bq, bk), 0))
      ds_s[...] = ds.astype(ds_s.dtype)
      plgpu.commit_smem()
      return dq + _mm(ds_s, k_s, (bq, d))

    dq = lax.fori_loop(0, n1 + n2, step, jnp.zeros((bq, d), jnp.float32))
    _store([(dq * lay.scale, q_s, dq_ref.at[bi, hi, tile])])

  return _kernel(body, lay, name="staircase_dq",
                 out_type=jax.ShapeDtypeStruct(q.shape, q.dtype), grid=(b, h, n // bq),
                 scratch=scratch)(q, k, v, valid, do, lse, delta)


def _dkdv(q, k, v, valid, do, lse, delta, lay: _Layout, out_dtype):
  """dK, dV per query head ([B, H, N, D] in ``out_dtype``)."""
  plgpu = _plgpu()
  b, h, n, d = q.shape
  bq, bk, group = lay.block_q, lay.block_k, h // k.shape[1]
  scratch = [*_smem(plgpu, (bk, d), q.dtype, 2), *_smem(plgpu, (bq, d), q.dtype, 2),
             plgpu.SMEM((bk, bq), q.dtype), plgpu.SMEM((bk,), jnp.int32),
             *_smem(plgpu, (bq,), jnp.float32, 2), plgpu.SMEM((bk, d), out_dtype),
             plgpu.Barrier(num_barriers=7)]

  def body(q_ref, k_ref, v_ref, valid_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref,
           k_s, v_s, q_s, do_s, t_s, valid_s, lse_s, delta_s, out_s, bars):
    bi, hi, kt = _program()
    kv, k0 = _div(hi, group), kt * bk
    tile = pl.ds(k0, bk)
    _fetch([(k_ref.at[bi, kv, tile], k_s, 0), (v_ref.at[bi, kv, tile], v_s, 1),
            (valid_ref.at[bi, tile], valid_s, 2)], bars)(0, 1, 2)
    valid = valid_s[...]  # never overwritten: read once
    cols = k0 + lax.broadcasted_iota(jnp.int32, (bk, bq), 0)  # keys along rows
    s1, n1, s2, n2 = _q_tiles_for_kv_tile(kt, lay)

    def step(t, carry):
      dk, dv = carry
      q0 = _tile_index(t, s1, n1, s2) * bq
      rows = pl.ds(q0, bq)
      _fetch([(q_ref.at[bi, hi, rows], q_s, 3), (do_ref.at[bi, hi, rows], do_s, 4),
              (lse_ref.at[bi, hi, rows], lse_s, 5),
              (delta_ref.at[bi, hi, rows], delta_s, 6)], bars)(3, 4, 5, 6)
      bounds = _row_bounds(q0 + lax.broadcasted_iota(jnp.int32, (bq,), 0), lay)
      mask_t = _row_mask(bounds, cols, valid, (bk, bq), 1)
      s_t = _mm(k_s, q_s.transpose((1, 0)), (bk, bq)) * lay.scale
      p_t = jnp.where(mask_t, jnp.exp(s_t - _bcast(lse_s[...], (bk, bq), 1)), 0.0)
      dp_t = _mm(v_s, do_s.transpose((1, 0)), (bk, bq))
      ds_t = p_t * (dp_t - _bcast(delta_s[...], (bk, bq), 1))
      t_s[...] = p_t.astype(t_s.dtype)
      plgpu.commit_smem()
      dv = dv + _mm(t_s, do_s, (bk, d))  # waited: t_s may be overwritten
      t_s[...] = ds_t.astype(t_s.dtype)
      plgpu.commit_smem()
      return dk + _mm(t_s, q_s, (bk, d)), dv

    zeros = jnp.zeros((bk, d), jnp.float32)
    dk, dv = lax.fori_loop(0, n1 + n2, step, (zeros, zeros))
    _store([(dk * lay.scale, out_s, dk_ref.at[bi, hi, tile])])  # one buffer, in turn
    _store([(dv, out_s, dv_ref.at[bi, hi, tile])])

  out = jax.ShapeDtypeStruct(q.shape, out_dtype)
  return _kernel(body, lay, name="staircase_dkdv", out_type=[out, out],
                 grid=(b, h, n // bk), scratch=scratch)(q, k, v, valid, do, lse, delta)


def _backward(q, k, v, valid, o, lse, do, lay: _Layout):
  b, h, n, d = q.shape
  kh = k.shape[1]
  delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), -1)
  dq = _dq(q, k, v, valid, do, lse, delta, lay)
  dk, dv = _dkdv(q, k, v, valid, do, lse, delta, lay,
                 k.dtype if h == kh else jnp.float32)  # f32 when summing a group
  group_sum = lambda x: x.reshape(b, kh, h // kh, n, d).sum(2).astype(k.dtype)
  return dq, group_sum(dk), group_sum(dv)


# flash(q [B, H, N, D], k/v [B, K, N, D], valid [B, N] int32, lay) -> o [B, H, N, D], in the
# padded layout ``lay`` (``staircase._kernel_attention`` pads), with the custom VJP.
flash = _flash_vjp(_forward, _backward)
