"""Index arithmetic of the staircase-attention kernels (``staircase``: Pallas for TPU, Triton
and the interpreter; ``staircase_mgpu``: Pallas Mosaic GPU), shared by both builds: the padded
layout, every row's key set [0, hi1) ∪ [lo2, hi2), the two tile intervals a query tile sees
(and the transpose: the query tiles that see a key tile), a tile's mask from those bounds, and
the custom VJP that ties a build's forward and backward kernels together. The layout rules
themselves are in ``staircase``'s module docstring.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

_NEG = -1e30  # finite "minus infinity": masked scores, never exp'ed unmasked

# ----------------------------------------------------------------------------
# Index arithmetic shared by the kernels and tile_skip_fraction. Works on Python
# ints, jnp arrays and scalars inside kernels (non-negative operands only).

@dataclasses.dataclass(frozen=True)
class _Layout:
  prompt: int  # padded prompt length (front padding are invalid keys)
  completion: int
  block: int
  prompt_block_causal: bool
  block_q: int
  block_k: int
  n: int  # padded total length, a multiple of block_q and block_k
  scale: float = 1.0
  kind: str = "interpret"  # or "gpu" (Triton), "tpu" (Mosaic), "mosaic_gpu": compiled;
  # "mosaic_gpu_interpret": the Mosaic GPU kernels in JAX's Mosaic GPU interpreter (tests)

  @property
  def interpret(self) -> bool:
    return self.kind == "interpret"

  @property
  def n_real(self) -> int:
    return self.prompt + 2 * self.completion


def _make_layout(prompt_len, completion_len, block_size, prompt_block_causal,
                 block_q, block_k, **kw) -> tuple[_Layout, int]:
  tile = math.lcm(block_q, block_k)
  front = -prompt_len % tile
  n_real = prompt_len + front + 2 * completion_len
  lay = _Layout(prompt_len + front, completion_len, block_size, prompt_block_causal,
                block_q, block_k, n_real + (-n_real % tile), **kw)
  return lay, front


def _div(x, d: int):
  return lax.div(x, jnp.asarray(d, jnp.int32))


def _cdiv(x, d: int):
  return _div(x + (d - 1), d)


def _row_bounds(r, lay: _Layout):
  """Row r may attend to keys [0, hi1) ∪ [lo2, hi2) (before padding validity)."""
  p, l, bs = lay.prompt, lay.completion, lay.block
  if lay.prompt_block_causal:
    hi_prompt = p - bs * _div(jnp.maximum(p - 1 - r, 0), bs)
  else:
    hi_prompt = p
  clean = (r >= p) & (r < p + l)
  noisy = (r >= p + l) & (r < p + 2 * l)
  clean_blk = _div(jnp.maximum(r - p, 0), bs)
  noisy_blk = _div(jnp.maximum(r - p - l, 0), bs)
  hi1 = jnp.where(r < p, hi_prompt,
                  jnp.where(clean, p + (clean_blk + 1) * bs,
                            jnp.where(noisy, p + noisy_blk * bs, 0)))
  lo2 = p + l + noisy_blk * bs
  hi2 = jnp.where(noisy, lo2 + bs, 0)
  return hi1, lo2, hi2


def _kv_tiles_for_q_tile(qt, lay: _Layout):
  """Key tiles seen by query tile qt: [0, n1) then [s2, s2 + n2)."""
  p, l, nr, bk = lay.prompt, lay.completion, lay.n_real, lay.block_k
  first = qt * lay.block_q
  last = jnp.minimum(first + lay.block_q, nr) - 1
  has_rows = first < nr
  has_noisy = has_rows & (last >= p + l)
  hi_clean = _row_bounds(jnp.minimum(last, p + l - 1), lay)[0]  # max over non-noisy
  hi1_last, _, hi2_last = _row_bounds(last, lay)
  lo2_first = _row_bounds(jnp.maximum(first, p + l), lay)[1]
  hi = jnp.maximum(jnp.where(has_rows & (first < p + l), hi_clean, 0),
                   jnp.where(has_noisy, hi1_last, 0))
  n1 = _cdiv(hi, bk)
  s2 = jnp.maximum(_div(lo2_first, bk), n1)
  n2 = jnp.where(has_noisy, jnp.maximum(_cdiv(hi2_last, bk) - s2, 0), 0)
  return n1, s2, n2


def _q_tiles_for_kv_tile(kt, lay: _Layout):
  """Query tiles that see key tile kt: [s1, s1 + n1) then [s2, s2 + n2)."""
  p, l, bs, nr, bq = lay.prompt, lay.completion, lay.block, lay.n_real, lay.block_q
  first = kt * lay.block_k
  last = jnp.minimum(first + lay.block_k, nr) - 1
  has_keys = first < nr
  in_prompt = first < p
  in_clean = (first >= p) & (first < p + l)
  if lay.prompt_block_causal:  # rows from the start of the key's prompt block
    lo_prompt = jnp.maximum(p - bs * (_div(jnp.maximum(p - 1 - first, 0), bs) + 1), 0)
  else:
    lo_prompt = 0
  clean_blk = _div(jnp.maximum(first - p, 0), bs)
  noisy_first = _div(jnp.maximum(first - p - l, 0), bs)
  noisy_last = _div(jnp.maximum(last - p - l, 0), bs)
  # Interval a: prompt keys -> [lo, nr); clean keys -> clean rows of blocks ≥ b
  # joined with the noisy rows of the tile's noisy keys; noisy keys -> their block.
  hi_noisy = jnp.where(last >= p + l, p + l + (noisy_last + 1) * bs, p + l)
  lo_a = jnp.where(in_prompt, lo_prompt,
                   jnp.where(in_clean, p + clean_blk * bs, p + l + noisy_first * bs))
  hi_a = jnp.where(in_prompt, nr, hi_noisy)
  # Interval b: noisy rows of blocks > b see clean block b.
  lo_b = jnp.where(in_clean, p + l + (clean_blk + 1) * bs, nr)
  s1, e1 = _div(lo_a, bq), _cdiv(hi_a, bq)
  s2 = jnp.maximum(_div(lo_b, bq), e1)
  n1 = jnp.where(has_keys, jnp.maximum(e1 - s1, 0), 0)
  n2 = jnp.where(has_keys & (lo_b < nr), jnp.maximum(_cdiv(nr, bq) - s2, 0), 0)
  return s1, n1, s2, n2


def _tile_index(t, s1, n1, s2):
  return jnp.where(t < n1, s1 + t, s2 + t - n1)


def _mask(rows, cols, valid):
  """Row bounds (hi1, lo2, hi2) against key indices and validity, broadcast as
  [bq, 1] vs [1, bk] (forward, dQ) or [1, bq] vs [bk, 1] (dK/dV, transposed)."""
  hi1, lo2, hi2 = rows
  return ((cols < hi1) | ((cols >= lo2) & (cols < hi2))) & valid


def _flash_vjp(forward, backward):
  """flash(q, k, v, valid, lay) -> o with a custom VJP from the kernels' ``forward`` (-> o,
  lse) and ``backward`` (q, k, v, valid, o, lse, do, lay -> dq, dk, dv); shared by the
  Pallas (Triton/Mosaic TPU/interpret) and Mosaic GPU (``staircase_mgpu``) builds."""

  @functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
  def flash(q, k, v, valid, lay):
    return forward(q, k, v, valid, lay)[0]

  def flash_fwd(q, k, v, valid, lay):
    o, lse = forward(q, k, v, valid, lay)
    return o, (q, k, v, valid, o, lse)

  def flash_bwd(lay, res, do):
    q, k, v, valid, o, lse = res
    return (*backward(q, k, v, valid, o, lse, do, lay), None)

  flash.defvjp(flash_fwd, flash_bwd)
  return flash
