"""Block-causal attention: the one definition of block ids and of the masks built from them.

A block model (SDAR / BD3-LM) runs on [prompt P | completion L] with completion
position i (0-based over the sequence) in block ``(i − P) // block_size`` ≥ 0.
The prompt is block −1 (one full block), or with ``prompt_block_causal``
(SDAR's official generate) it is cut into blocks aligned to its END, position
i < P in block ``(i − P) // block_size`` < 0. A query may attend a key whose
block is ≤ its own (:func:`block_causal`). Users: the block sampler's dense
reference and prompt prefill, the per-block ELBO reference
(``dllm_rl.diffusion.block``) and the staircase training mask
(``dllm_rl.kernels.staircase``), whose clean copy follows exactly these rules.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def block_ids(prompt_len: int, completion_len: int, block_size: int,
              prompt_block_causal: bool = False) -> np.ndarray:
  """int [P + L]: the block of each position of [prompt | completion] (module docstring)."""
  idx_N = np.arange(prompt_len + completion_len)
  block_N = (idx_N - prompt_len) // block_size
  if not prompt_block_causal:
    block_N = np.where(idx_N < prompt_len, -1, block_N)
  return block_N


def block_causal(query_block, key_block):
  """bool [..., Nq, Nk]: query may attend key iff key block ≤ query block (numpy or jnp)."""
  return key_block[..., None, :] <= query_block[..., :, None]


def prompt_block_mask(prompt_len: int, block_len: int) -> jax.Array:
  """[P, P] block-causal prompt mask, blocks aligned to the prompt's END
  (prompt position i is in block (i − P) // block_len < 0)."""
  blk_P = jnp.asarray(block_ids(prompt_len, 0, block_len, prompt_block_causal=True))
  return block_causal(blk_P, blk_P)


def block_causal_mask(prompt_valid_BP: jax.Array, completion_len: int, block_len: int,
                      prompt_block_causal: bool = False) -> jax.Array:
  """Dense [B, N, N] mask (N = P + L, True = may attend) of the block model.

  Completion block b sees the valid prompt keys and completion blocks <= b.
  Prompt rows see every valid prompt key (the prompt is block −1), or with
  ``prompt_block_causal`` (SDAR's official generate) the prompt blocks up to
  their own, blocks aligned to the prompt's end (block (i − P) // block_len).
  """
  b, p = prompt_valid_BP.shape
  block_N = jnp.asarray(block_ids(p, completion_len, block_len, prompt_block_causal))
  key_valid_BN = jnp.concatenate([prompt_valid_BP, jnp.ones((b, completion_len), bool)], axis=1)
  return block_causal(block_N, block_N)[None] & key_valid_BN[:, None, :]
