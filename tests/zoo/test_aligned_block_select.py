"""The aligned-block generators' per-step choice and nucleus filter on hand-built inputs.

The token-exact fixtures (test_llada2_generate.py) are LLaDA2 runs at temperature 0: SDAR's
options (``sequential``, no clamp to the masked count) and the nucleus filter never run there,
and no fixture confidence sits exactly at the threshold. LLaDA2.1's choice (``select_editing``:
fill and token edits) is checked here on hand-built confidences for the same reason.
"""

import jax
import jax.numpy as jnp
import numpy as np

from dllm_rl.sampling.aligned_block import (AlignedBlockConfig, EditingConfig, _decode_blocks,
                                            filter_logits, select, select_editing)

NEG = -jnp.inf


def _cfg(**kw):
  return AlignedBlockConfig(gen_length=8, block_length=8, steps=4, **kw)


def test_sequential_takes_k_positions_from_the_first_mask():
  masked = jnp.array([[False, False, True, True, True, False, True, True]])
  conf = jnp.where(masked, jnp.array([[0., 0., .1, .2, .3, 0., .9, .8]]), NEG)
  got = select(conf, masked, 2, cfg=_cfg(sequential=True))
  np.testing.assert_array_equal(got[0], [0, 0, 1, 1, 0, 0, 0, 0])


def test_top_k_clamps_to_the_masked_count_only_for_llada2():
  """One masked position, k = 3: LLaDA2 writes it alone; SDAR's top-k also takes the two
  first (−inf, already decoded) positions, as its official code does."""
  masked = jnp.array([[False, False, False, True, False, False, False, False]])
  conf = jnp.where(masked, 0.5, NEG)
  np.testing.assert_array_equal(select(conf, masked, 3, cfg=_cfg())[0], [0, 0, 0, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(select(conf, masked, 3, cfg=_cfg(clamp_to_masked=False))[0],
                                [1, 1, 0, 1, 0, 0, 0, 0])


def test_threshold_is_strict():
  """p > threshold: confidences equal to it count as low (then the top k_t are written)."""
  masked = jnp.ones((1, 4), bool)
  conf = jnp.array([[0.5, 0.5, 0.25, 0.75]])
  np.testing.assert_array_equal(select(conf, masked, 1, cfg=_cfg(threshold=0.5))[0],
                                [0, 0, 0, 1])
  np.testing.assert_array_equal(select(conf, masked, 2, cfg=_cfg(threshold=0.5))[0],
                                [1, 0, 0, 1])


def test_nucleus_keeps_tokens_up_to_the_one_that_crosses_top_p():
  """probs (0.5, 0.3, 0.15, 0.05), top_p 0.7: cumulative 0.5, 0.8 → tokens 0 and 1 stay."""
  logits = jnp.log(jnp.array([[[0.15, 0.5, 0.05, 0.3]]]))
  got = np.asarray(filter_logits(logits, top_p=0.7))[0, 0]
  np.testing.assert_array_equal(np.isfinite(got), [False, True, False, True])
  got = np.asarray(filter_logits(logits, top_k=3))[0, 0]
  np.testing.assert_array_equal(np.isfinite(got), [True, True, False, True])


def _fill(value_of_block):
  """A ``decode_block`` that writes ``value_of_block(block)`` over the whole block."""
  def decode_block(x_BN, done_B, nfe_B, block):
    row_BT = jnp.full((x_BN.shape[0], 4), value_of_block(block), jnp.int32)
    new_BN = jax.lax.dynamic_update_slice_in_dim(x_BN, row_BT, block * 4, axis=1)
    return jnp.where(done_B[:, None], x_BN, new_BN), nfe_B + ~done_B
  return decode_block


def test_a_row_stops_after_a_stop_id_in_its_generated_part_only():
  """Blocks from ``P // block_length`` on; a stop id in the prompt does not end a row, one
  that a block generates does (after that block)."""
  stop, mask = 9, 0
  x = jnp.full((2, 16), mask, jnp.int32).at[:, :6].set(5).at[0, 1].set(stop)
  got, nfe = _decode_blocks(_fill(lambda blk: 7), x, prompt_len=6, block_length=4,
                            num_blocks=4, stop_ids=(stop,))
  np.testing.assert_array_equal(nfe, [3, 3])  # blocks 1, 2, 3: the prompt's stop id is no stop
  np.testing.assert_array_equal(got[:, 4:], 7)
  got, nfe = _decode_blocks(_fill(lambda blk: jnp.where(blk == 2, stop, 7)), x, prompt_len=6,
                            block_length=4, num_blocks=4, stop_ids=(stop,))
  np.testing.assert_array_equal(nfe, [2, 2])
  np.testing.assert_array_equal(got[:, 12:], mask)  # block 3 never decoded


M = 9  # mask id of the editing tests


def _edit(x0, p, x, prompt_len=0, **kw):
  """``select_editing`` on one row (jitted), as numpy (fill, edit)."""
  cfg = EditingConfig(gen_length=8, block_length=len(x), **{
      "threshold": 0.75, "editing_threshold": 0.5, **kw})
  fn = jax.jit(select_editing, static_argnames=("mask_id", "cfg"))
  fill, edit = fn(jnp.array([x0]), jnp.array([p], jnp.float32), jnp.array([x]),
                  jnp.arange(len(x)) < prompt_len, mask_id=M, cfg=cfg)
  return np.asarray(fill[0]).astype(int), np.asarray(edit[0]).astype(int)


def test_editing_fill_threshold_is_strict():
  """Official 2.1 writes masked positions with p > threshold: one equal to it is not taken."""
  fill, _ = _edit(x0=[1, 2, 3, 4], p=[0.75, 0.875, 0.75, 0.25], x=[M, M, M, M])
  np.testing.assert_array_equal(fill, [0, 1, 0, 0])
  # num_to_transfer 2: only one p > 0.75, so the top 2 (0.875, then the first 0.75)
  fill, _ = _edit(x0=[1, 2, 3, 4], p=[0.75, 0.875, 0.75, 0.25], x=[M, M, M, M],
                  num_to_transfer=2)
  np.testing.assert_array_equal(fill, [1, 1, 0, 0])


def test_editing_fill_takes_all_above_else_the_top_masked_ones():
  """#(p > threshold) >= k writes all of them (more than k here); otherwise the top
  min(k, #masked) masked positions, never a decoded one however confident."""
  fill, _ = _edit(x0=[1, 2, 3, 4, 5], p=[0.875, 0.9375, 0.8125, 0.25, 0.5], x=[M] * 5)
  np.testing.assert_array_equal(fill, [1, 1, 1, 0, 0])
  fill, _ = _edit(x0=[1, 2, 3, 4], p=[0.5, 0.25, 0.625, 0.125], x=[M, M, M, M],
                  num_to_transfer=2)
  np.testing.assert_array_equal(fill, [1, 0, 1, 0])
  fill, _ = _edit(x0=[1, 2, 3, 4], p=[0.9375, 0.25, 0.875, 0.5], x=[7, M, 7, 7],
                  num_to_transfer=3)
  np.testing.assert_array_equal(fill, [0, 1, 0, 0])


def test_editing_threshold_is_strict_and_only_where_the_proposal_differs():
  """Decoded positions are edited where x0 != x and p > editing_threshold (0.5, below the
  fill threshold 0.75): p equal to it, or a confident proposal of the same token, is not."""
  _, edit = _edit(x0=[1, 2, 3, 4, 5], p=[0.625, 0.5, 0.9375, 0.25, 0.5625],
                  x=[7, 7, 3, 7, M])
  np.testing.assert_array_equal(edit, [1, 0, 0, 0, 0])


def test_editing_never_touches_prompt_or_masked_positions():
  """The prompt's tail in the block is never edited, however confident; a masked position is
  filled (or not) by the fill rule only, never as an edit."""
  fill, edit = _edit(x0=[1, 2, 3, 4], p=[0.9375, 0.9375, 0.625, 0.6875], x=[7, 7, M, M],
                     prompt_len=1)
  np.testing.assert_array_equal(edit, [0, 1, 0, 0])
  np.testing.assert_array_equal(fill, [0, 0, 0, 1])
