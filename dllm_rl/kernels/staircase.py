"""Staircase attention for the block-diffusion layout [prompt P | clean L | noisy L].

Row rules (True = may attend), blocks of ``block_size`` over each completion copy:

* prompt rows: every prompt key (or, with ``prompt_block_causal``, prompt blocks
  up to their own, blocks aligned to the END of the prompt);
* clean block b: prompt ∪ clean blocks ≤ b;
* noisy block b: prompt ∪ clean blocks < b (never its own clean tokens) ∪ noisy block b.

``key_valid_BN`` (False on left padding) removes keys for every row; a row left
with no key outputs 0. Query head h reads key/value head h // (H / K); scale
1/sqrt(Q); scores, softmax and accumulation in float32; output in q's dtype.

The Pallas kernel is flash attention (online softmax, FA-2 backward recomputing
from the saved logsumexp); the N×N mask is never built. Every row's key set is
[0, hi1) ∪ [lo2, hi2) (``_row_bounds``; an O(N) int32 table feeds the kernels) and
the mask of a tile is computed from row/column indices against it. A query
tile's union of key sets is again two intervals, so each program loops
(``fori_loop`` with a dynamic trip count, scalar index arithmetic from
``program_id``) only over the key tiles it can see: [0, n1) then [s2, s2 + n2);
the dK/dV kernel does the transpose (query tiles that see a key tile). Fully
masked tiles are never loaded or computed. The prompt is front-padded with
invalid keys to a tile multiple so tiles line up with the clean/noisy regions;
the tail is padded to a tile multiple. Each program holds one head's whole K/V
(forward, dQ) or Q/dO (dK/dV) as its block and slices tiles from it: on GPU that
is only a pointer; on TPU it sits in VMEM, double-buffered: ~8·N·Q bytes for bf16
(16 MiB at N = 16k, Q = 128), which bounds the length under the scoped-VMEM limit.
dK/dV are computed per query head (float32 when K < H) and summed over each
group outside the kernel.
"""

from __future__ import annotations

import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from dllm_rl.kernels import staircase_mgpu as mgpu
from dllm_rl.kernels.block_mask import block_causal, block_ids
from dllm_rl.kernels.staircase_index import (
    _NEG,
    _div,
    _flash_vjp,
    _kv_tiles_for_q_tile,
    _Layout,
    _make_layout,
    _mask,
    _q_tiles_for_kv_tile,
    _row_bounds,
    _tile_index,
)

ATTENTION_IMPLS = ("auto", "pallas", "mosaic_gpu", "interpret", "reference")
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_NN = (((1,), (0,)), ((), ()))  # a @ b
_DEFAULT_TILES = {"tpu": (128, 128), "gpu": (64, 64), "interpret": (32, 32),
                  "mosaic_gpu": (mgpu.TILE, mgpu.TILE), mgpu.INTERPRET: (mgpu.TILE, mgpu.TILE)}


# ----------------------------------------------------------------------------
# Layout, dense mask and the jnp reference.

def _check_layout(prompt_len: int, completion_len: int, block_size: int) -> None:
  if block_size <= 0 or prompt_len < 0 or completion_len < 0:
    raise ValueError(f"bad layout: prompt_len={prompt_len}, completion_len="
                     f"{completion_len}, block_size={block_size}")
  if completion_len % block_size:
    raise ValueError(f"completion_len={completion_len} must be a multiple of "
                     f"block_size={block_size}")


def _completion_len(n: int, prompt_len: int) -> int:
  if n < prompt_len or (n - prompt_len) % 2:
    raise ValueError(f"sequence length {n} is not prompt_len={prompt_len} + 2 * L")
  return (n - prompt_len) // 2


def staircase_mask(prompt_len: int, completion_len: int, block_size: int, *,
                   prompt_block_causal: bool = False) -> np.ndarray:
  """Dense bool [N, N] mask (True = may attend), N = P + 2L; for tests/reference.

  [prompt | clean] is the block model's block-causal mask (``block_mask``); a
  noisy row of block b sees the prompt and clean blocks < b, and noisy block b."""
  _check_layout(prompt_len, completion_len, block_size)
  p, l = prompt_len, completion_len
  block_N = block_ids(p, l, block_size, prompt_block_causal)  # prompt and clean copy
  noisy_L = block_N[p:]
  m = np.zeros((p + 2 * l, p + 2 * l), bool)
  m[:p + l, :p + l] = block_causal(block_N, block_N)
  m[p + l:, :p + l] = block_causal(noisy_L - 1, block_N)  # prompt ∪ clean blocks < b
  m[p + l:, p + l:] = noisy_L[None, :] == noisy_L[:, None]
  return m


def staircase_attention_reference(q_BNHQ, k_BNJQ, v_BNJQ, *, prompt_len: int,
                                  block_size: int, key_valid_BN=None,
                                  prompt_block_causal: bool = False):
  """Dense-mask attention (materialises [N, N]); the kernel's specification."""
  b, n, h, qd = q_BNHQ.shape
  kh = k_BNJQ.shape[2]
  mask_NN = jnp.asarray(staircase_mask(prompt_len, _completion_len(n, prompt_len),
                                       block_size,
                                       prompt_block_causal=prompt_block_causal))
  mask_BNM = mask_NN[None]
  if key_valid_BN is not None:
    mask_BNM = mask_BNM & key_valid_BN.astype(bool)[:, None, :]
  q = q_BNHQ.reshape(b, n, kh, h // kh, qd)
  scores = jnp.einsum("bnkgq,bmkq->bkgnm", q, k_BNJQ,
                      preferred_element_type=jnp.float32) / math.sqrt(qd)
  mask = mask_BNM[:, None, None]
  probs = jax.nn.softmax(jnp.where(mask, scores, _NEG), axis=-1)
  probs = jnp.where(mask, probs, 0.0)  # rows with no valid key -> output 0
  out = jnp.einsum("bkgnm,bmkq->bnkgq", probs, v_BNJQ.astype(jnp.float32))
  return out.reshape(b, n, h, qd).astype(q_BNHQ.dtype)


def tile_skip_fraction(prompt_len: int, completion_len: int, block_size: int,
                       block_q: int, block_k: int, *,
                       prompt_block_causal: bool = False) -> float:
  """Fraction of the kernel's (query tile, key tile) pairs that it skips."""
  _check_layout(prompt_len, completion_len, block_size)
  lay, _ = _make_layout(prompt_len, completion_len, block_size, prompt_block_causal,
                        block_q, block_k)
  nq, nk = lay.n // block_q, lay.n // block_k
  n1, _, n2 = _kv_tiles_for_q_tile(jnp.arange(nq, dtype=jnp.int32), lay)
  return 1.0 - float(np.sum(np.asarray(n1 + n2))) / (nq * nk)


# ----------------------------------------------------------------------------
# Kernels: one (batch, head, tile) per program; refs are [tokens, head_dim].

def _row_table(lay: _Layout):
  """int32 [3, N', 1]: (hi1, lo2, hi2) of every row, O(N), so that the kernels
  need no vector integer division (unsupported on the TPU VPU)."""
  bounds = _row_bounds(jnp.arange(lay.n, dtype=jnp.int32), lay)
  return jnp.stack([jnp.broadcast_to(x, (lay.n,)) for x in bounds]).astype(
      jnp.int32)[:, :, None]


def _dot(a, b, dims):
  precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
  return lax.dot_general(a, b, dims, precision=precision,
                         preferred_element_type=jnp.float32)


def _iota(shape, dim):
  return lax.broadcasted_iota(jnp.int32, shape, dim)


def _fwd_kernel(rows_ref, valid_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, lay):
  bq, bk = lay.block_q, lay.block_k
  qt = pl.program_id(2)
  q = q_ref[...]
  rows = rows_ref[0], rows_ref[1], rows_ref[2]
  n1, s2, n2 = _kv_tiles_for_q_tile(qt, lay)

  def body(t, carry):
    m, l, acc = carry
    j = _tile_index(t, 0, n1, s2)
    start = pl.multiple_of(j * bk, bk)
    k = k_ref[pl.ds(start, bk), :]
    v = v_ref[pl.ds(start, bk), :]
    mask = _mask(rows, start + _iota((1, bk), 1), valid_ref[j] > 0)
    s = jnp.where(mask, _dot(q, k, _NT) * lay.scale, _NEG)
    m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
    p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
    corr = jnp.exp(m - m_new)
    l = corr * l + jnp.sum(p, axis=1, keepdims=True)
    acc = corr * acc + _dot(p.astype(v.dtype), v, _NN)
    return m_new, l, acc

  init = (jnp.full((bq, 1), _NEG, jnp.float32), jnp.zeros((bq, 1), jnp.float32),
          jnp.zeros(o_ref.shape, jnp.float32))
  m, l, acc = lax.fori_loop(0, n1 + n2, body, init)
  seen = l > 0.0
  l_safe = jnp.where(seen, l, 1.0)
  o_ref[...] = jnp.where(seen, acc / l_safe, 0.0).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(seen, m + jnp.log(l_safe), 0.0)


def _dq_kernel(rows_ref, valid_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
               dq_ref, *, lay):
  bk = lay.block_k
  qt = pl.program_id(2)
  q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
  rows = rows_ref[0], rows_ref[1], rows_ref[2]
  n1, s2, n2 = _kv_tiles_for_q_tile(qt, lay)

  def body(t, dq):
    j = _tile_index(t, 0, n1, s2)
    start = pl.multiple_of(j * bk, bk)
    k = k_ref[pl.ds(start, bk), :]
    v = v_ref[pl.ds(start, bk), :]
    mask = _mask(rows, start + _iota((1, bk), 1), valid_ref[j] > 0)
    p = jnp.where(mask, jnp.exp(_dot(q, k, _NT) * lay.scale - lse), 0.0)
    ds = p * (_dot(do, v, _NT) - delta)
    return dq + _dot(ds.astype(k.dtype), k, _NN)

  dq = lax.fori_loop(0, n1 + n2, body, jnp.zeros(dq_ref.shape, jnp.float32))
  dq_ref[...] = (dq * lay.scale).astype(dq_ref.dtype)


def _dkdv_kernel(rows_ref, valid_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
                 dk_ref, dv_ref, *, lay):
  """One key tile; scores transposed ([bk, bq]) so per-row data is lane-dense."""
  bq, bk = lay.block_q, lay.block_k
  kt = pl.program_id(2)
  k, v = k_ref[...], v_ref[...]
  cols = kt * bk + _iota((bk, 1), 0)
  valid = valid_ref[...] > 0
  s1, n1, s2, n2 = _q_tiles_for_kv_tile(kt, lay)

  def body(t, carry):
    dk, dv = carry
    i = _tile_index(t, s1, n1, s2)
    start = pl.multiple_of(i * bq, bq)
    q = q_ref[pl.ds(start, bq), :]
    do = do_ref[pl.ds(start, bq), :]
    mask_t = _mask((rows_ref[0, i], rows_ref[1, i], rows_ref[2, i]), cols, valid)
    p_t = jnp.where(mask_t, jnp.exp(_dot(k, q, _NT) * lay.scale - lse_ref[i]), 0.0)
    dv = dv + _dot(p_t.astype(do.dtype), do, _NN)
    ds_t = p_t * (_dot(v, do, _NT) - delta_ref[i])
    return dk + _dot(ds_t.astype(q.dtype), q, _NN), dv

  zeros = jnp.zeros(dk_ref.shape, jnp.float32)
  dk, dv = lax.fori_loop(0, n1 + n2, body, (zeros, zeros))
  dk_ref[...] = (dk * lay.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


# ----------------------------------------------------------------------------
# pallas_calls ([B, H|K, N, Q] layout) and the custom VJP.

def _compiler_params(lay: _Layout):
  if lay.interpret:
    return None
  if lay.kind == "tpu":
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.CompilerParams(dimension_semantics=("parallel",) * 3)
  from jax.experimental.pallas import triton as pltriton
  return pltriton.CompilerParams(num_warps=4, num_stages=2)


def _specs(lay: _Layout, group: int, qd: int):
  """BlockSpecs over grid (b, h, tile): a q tile, a kv tile, whole sequences."""
  n, bq, bk = lay.n, lay.block_q, lay.block_k
  kv_head = lambda h: _div(h, group)
  return dict(
      rows_tile=pl.BlockSpec((3, bq, 1), lambda b, h, i: (0, i, 0)),
      # Per-row data as lane-dense [N/bq, 1, bq] (a free reshape of [N, 1]).
      rows_all=pl.BlockSpec((3, n // bq, 1, bq), lambda b, h, i: (0, 0, 0, 0)),
      valid_all=pl.BlockSpec((None, n // bk, 1, bk), lambda b, h, i: (b, 0, 0, 0)),
      valid_col=pl.BlockSpec((None, bk, 1), lambda b, h, i: (b, i, 0)),
      q_tile=pl.BlockSpec((None, None, bq, qd), lambda b, h, i: (b, h, i, 0)),
      row_tile=pl.BlockSpec((None, None, bq, 1), lambda b, h, i: (b, h, i, 0)),
      q_all=pl.BlockSpec((None, None, n, qd), lambda b, h, i: (b, h, 0, 0)),
      row_all=pl.BlockSpec((None, None, n // bq, 1, bq), lambda b, h, i: (b, h, 0, 0, 0)),
      kv_tile=pl.BlockSpec((None, None, bk, qd), lambda b, h, i: (b, kv_head(h), i, 0)),
      kv_all=pl.BlockSpec((None, None, n, qd), lambda b, h, i: (b, kv_head(h), 0, 0)),
      # dK/dV per query head (summed over the group outside the kernel).
      kh_tile=pl.BlockSpec((None, None, bk, qd), lambda b, h, i: (b, h, i, 0)),
  )


def _forward(q, k, v, valid, lay):
  b, h, n, qd = q.shape
  sp = _specs(lay, h // k.shape[1], qd)
  return pl.pallas_call(
      functools.partial(_fwd_kernel, lay=lay),
      grid=(b, h, n // lay.block_q),
      in_specs=[sp["rows_tile"], sp["valid_all"], sp["q_tile"], sp["kv_all"],
                sp["kv_all"]],
      out_specs=[sp["q_tile"], sp["row_tile"]],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, n, 1), jnp.float32)],
      compiler_params=_compiler_params(lay), interpret=lay.interpret,
      name="staircase_fwd")(_row_table(lay), valid, q, k, v)


def _backward(q, k, v, valid, o, lse, do, lay):
  b, h, n, qd = q.shape
  kh = k.shape[1]
  sp = _specs(lay, h // kh, qd)
  delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), -1, keepdims=True)
  rows = _row_table(lay)
  common = dict(compiler_params=_compiler_params(lay), interpret=lay.interpret)
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, lay=lay),
      grid=(b, h, n // lay.block_q),
      in_specs=[sp["rows_tile"], sp["valid_all"], sp["q_tile"], sp["kv_all"],
                sp["kv_all"], sp["q_tile"], sp["row_tile"], sp["row_tile"]],
      out_specs=sp["q_tile"],
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      name="staircase_dq", **common)(rows, valid, q, k, v, do, lse, delta)
  bq, bk = lay.block_q, lay.block_k
  lane_dense = lambda x: x.reshape(*x.shape[:-2], n // bq, 1, bq)
  dkdv_dtype = k.dtype if h == kh else jnp.float32  # f32 when summing a group
  dk, dv = pl.pallas_call(
      functools.partial(_dkdv_kernel, lay=lay),
      grid=(b, h, n // bk),
      in_specs=[sp["rows_all"], sp["valid_col"], sp["q_all"], sp["kv_tile"],
                sp["kv_tile"], sp["q_all"], sp["row_all"], sp["row_all"]],
      out_specs=[sp["kh_tile"], sp["kh_tile"]],
      out_shape=[jax.ShapeDtypeStruct(q.shape, dkdv_dtype)] * 2,
      name="staircase_dkdv", **common)(
          lane_dense(rows), valid.reshape(b, n, 1), q, k, v, do, lane_dense(lse),
          lane_dense(delta))
  group_sum = lambda x: x.reshape(b, kh, h // kh, n, qd).sum(2).astype(k.dtype)
  return dq, group_sum(dk), group_sum(dv)


_flash = _flash_vjp(_forward, _backward)


# ----------------------------------------------------------------------------
# Dispatch.

@functools.cache
def _warn_once(message: str) -> None:
  warnings.warn(message, stacklevel=3)


def target_platform() -> str:
  """The platform the program being traced is compiled for ("cpu", "gpu" or "tpu"): the
  device platform of the abstract mesh it traces under (dllm_rl.parallel.constraints.
  under_mesh), else this process's default backend. The planner traces programs for
  compile-only TPU devices in a CPU process: the kernel must be built for the mesh's
  devices, not for the process."""
  mesh = jax.sharding.get_abstract_mesh()
  device = getattr(mesh, "abstract_device", None)
  platform = getattr(device, "platform", None) or jax.default_backend()
  return "gpu" if platform in ("cuda", "rocm") else platform


def _kernel_kind(impl: str) -> str:
  """Which kernel build ``impl`` runs for the target platform ("auto" on CPU is only
  asked for tile sizes)."""
  target = target_platform()
  if impl == "interpret" or (impl == "auto" and target == "cpu"):
    return "interpret"
  if impl == "mosaic_gpu":
    return _mosaic_gpu_kind(target)
  if target == "cpu":
    raise ValueError("impl='pallas' (estimator.attention_impl) needs a GPU or TPU target;"
                     " on CPU use 'auto' (the dense reference) or 'interpret'")
  return "tpu" if target == "tpu" else "gpu"


def _mosaic_gpu_kind(target: str) -> str:
  """"mosaic_gpu" where the target is a GPU and this JAX has Pallas Mosaic GPU, else a
  ValueError naming the config key."""
  if target != "gpu":
    raise ValueError(f"impl='mosaic_gpu' (estimator.attention_impl) needs a GPU target"
                     f" (Mosaic GPU, sm_90: H100/H200), not {target}; on CPU use 'auto' (the"
                     " dense reference) or 'interpret'")
  missing = mgpu.mosaic_gpu_missing()
  if missing:
    raise ValueError(f"impl='mosaic_gpu' (estimator.attention_impl): {missing}; use 'auto'"
                     " or 'pallas' (Triton) there")
  return "mosaic_gpu"


@functools.cache
def triton_missing() -> str | None:
  """Why Pallas' Triton backend (the GPU kernel's) cannot be used, or None. JAX 0.11
  deprecates it ("will be removed in a future version of JAX"): it is unusable where its
  module no longer imports, and where JAX has turned the deprecation into an error
  (``jax-pallas-triton`` accelerated: the module imports, but lowering raises ValueError)."""
  try:
    from jax.experimental.pallas import triton  # noqa: F401
  except ImportError as err:
    return f"{type(err).__name__}: {err}"
  if _TRITON_DEPRECATION in _enforced_deprecations():
    return (f"this JAX makes its deprecation ({_TRITON_DEPRECATION!r}) an error: lowering a"
            " Triton kernel raises")
  return None


_TRITON_DEPRECATION = "jax-pallas-triton"


def _enforced_deprecations() -> frozenset[str]:
  """The JAX deprecation ids (of those this module checks) that JAX now raises on instead of
  warning. JAX keeps them in a private module; where it or the id is absent (JAX 0.10, which
  does not deprecate the Triton backend) none is."""
  try:
    from jax._src import deprecations
    return frozenset(d for d in (_TRITON_DEPRECATION,) if deprecations.is_accelerated(d))
  except (ImportError, AttributeError, ValueError):  # ValueError: the id is not registered
    return frozenset()


def default_block_sizes(impl: str = "auto") -> tuple[int, int]:
  """(block_q, block_k) the kernel uses for ``impl`` on the target platform."""
  return _DEFAULT_TILES[_kernel_kind(impl)]


def _check_tiles(block_q: int, block_k: int, backend: str) -> None:
  for name, t in (("block_q", block_q), ("block_k", block_k)):
    if t <= 0:
      raise ValueError(f"{name}={t} must be positive")
    if backend == "tpu" and t % 8:
      raise ValueError(f"{name}={t} must be a multiple of 8 on TPU")
    if backend == "gpu" and (t < 16 or t & (t - 1)):
      raise ValueError(f"{name}={t} must be a power of two ≥ 16 on GPU (Triton)")
    if backend.startswith("mosaic_gpu") and t % mgpu.TILE:
      raise ValueError(f"{name}={t} must be a multiple of 64 for impl='mosaic_gpu' (one"
                       " warpgroup's wgmma rows)")


def staircase_attention(q_BNHQ, k_BNJQ, v_BNJQ, *, prompt_len: int, block_size: int,
                        key_valid_BN=None, prompt_block_causal: bool = False,
                        impl: str = "auto", block_q: int | None = None,
                        block_k: int | None = None):
  """Staircase attention, q [B, N, H, Q], k/v [B, N, K, Q] -> [B, N, H, Q].

  ``impl``: "auto" (compiled Pallas for GPU/TPU; the dense reference on CPU,
  where the Pallas interpreter is far too slow to train with), "pallas"
  (compiled: Mosaic for TPU, Triton for GPU), "mosaic_gpu" (Pallas Mosaic GPU
  for sm_90, ``staircase_mgpu``: opt-in, not yet run on a GPU), "interpret" (the Pallas
  interpreter: tests on CPU) or "reference" (dense jnp). The platform is the
  one the program compiles for (:func:`target_platform`: the traced mesh's
  devices, so a CPU process planning for TPU builds the Mosaic kernel).
  ``block_q``/``block_k``: kernel tile sizes (default per platform); the
  sequence is padded internally to tile multiples.
  """
  if impl not in ATTENTION_IMPLS:
    raise ValueError(f"impl={impl!r} not in {ATTENTION_IMPLS}")
  b, n, h, qd = q_BNHQ.shape
  if k_BNJQ.shape != v_BNJQ.shape or k_BNJQ.shape[:2] != (b, n) or \
      k_BNJQ.shape[3] != qd or h % k_BNJQ.shape[2]:
    raise ValueError(f"need q [B, N, H, Q], k/v [B, N, K, Q] with K | H; got "
                     f"{q_BNHQ.shape}, {k_BNJQ.shape}, {v_BNJQ.shape}")
  completion_len = _completion_len(n, prompt_len)
  _check_layout(prompt_len, completion_len, block_size)
  if key_valid_BN is not None and key_valid_BN.shape != (b, n):
    raise ValueError(f"key_valid_BN shape {key_valid_BN.shape} != {(b, n)}")
  target = target_platform()
  missing = triton_missing() if target == "gpu" and impl in ("auto", "pallas") else None
  if missing and impl == "pallas":
    raise ValueError(f"impl='pallas' (estimator.attention_impl) on GPU needs Pallas' Triton"
                     f" backend, which this JAX lacks ({missing}); use 'auto' (the dense"
                     " reference there) or 'reference'")
  if missing:
    _warn_once(f"staircase attention: Pallas' Triton backend is unusable ({missing}); the dense"
               " reference runs instead (the same values, O(N²) memory)")
  if impl == "reference" or (impl == "auto" and (target == "cpu" or missing)):
    return staircase_attention_reference(
        q_BNHQ, k_BNJQ, v_BNJQ, prompt_len=prompt_len, block_size=block_size,
        key_valid_BN=key_valid_BN, prompt_block_causal=prompt_block_causal)

  kind = _kernel_kind(impl)
  return _kernel_attention(q_BNHQ, k_BNJQ, v_BNJQ, key_valid_BN, prompt_len,
                           block_size, prompt_block_causal, kind,
                           block_q or _DEFAULT_TILES[kind][0],
                           block_k or _DEFAULT_TILES[kind][1])


def _kernel_attention(q_BNHQ, k_BNJQ, v_BNJQ, key_valid_BN, prompt_len, block_size,
                      prompt_block_causal, kind, block_q, block_k):
  """Pads to the kernel layout [B, H|K, N', Q'], runs ``_flash``, unpads."""
  b, n, _, qd = q_BNHQ.shape
  _check_tiles(block_q, block_k, kind)
  lay, front = _make_layout(prompt_len, (n - prompt_len) // 2, block_size,
                            prompt_block_causal, block_q, block_k,
                            scale=1.0 / math.sqrt(qd), kind=kind)
  mosaic_gpu = kind.startswith("mosaic_gpu")
  if kind == "gpu":
    qd_pad = max(16, pl.next_power_of_2(qd))
  else:
    qd_pad = qd + (-qd % mgpu.TILE if mosaic_gpu else 0)
  pad = ((0, 0), (front, lay.n - front - n), (0, 0), (0, qd_pad - qd))
  to_kernel = lambda x: jnp.pad(x, pad).transpose(0, 2, 1, 3)  # [B, H|K, N', Q']
  valid = jnp.ones((b, n), bool) if key_valid_BN is None else key_valid_BN.astype(bool)
  valid = jnp.pad(valid, pad[:2]).astype(jnp.int32)  # [B, N']
  if mosaic_gpu:
    missing = mgpu.mosaic_gpu_missing(kind == mgpu.INTERPRET)
    if missing:
      raise ValueError(f"impl='mosaic_gpu' (estimator.attention_impl): {missing}")
    mgpu.check_dtype(q_BNHQ.dtype)
    flash = mgpu.flash
  else:
    flash, valid = _flash, valid.reshape(b, lay.n // block_k, 1, block_k)
  o = flash(to_kernel(q_BNHQ), to_kernel(k_BNJQ), to_kernel(v_BNJQ), valid, lay)
  return o.transpose(0, 2, 1, 3)[:, front:front + n, :, :qd]
