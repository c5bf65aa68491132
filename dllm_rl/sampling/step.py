"""One denoising step of the open block, shared by every sampler.

The masked LLaDA sampler (:mod:`dllm_rl.sampling.sampler`, every ``sampler.cache``
mode) and the block-diffusion sampler (:mod:`dllm_rl.sampling.block_sampler`,
with or without its KV cache) differ only in how they get the open block's
logits; given them, each step is :func:`commit_step`: propose tokens, score
them with the remasking policy, commit the chosen masked positions of the open
block, record the step in ``unmask_step_BL`` (and the trajectory), advance the
step counter. ``cfg`` is a ``SamplerConfig`` (or a subclass); the fields read
are ``block_len``, ``temperature``, ``remasking``, ``threshold``,
``exclude_mask`` and ``record_trajectory``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dllm_rl.sampling.remasking import confidence

_NEG = -jnp.inf


def _propose(logits_BLV, key, temperature):
  """Gumbel-max sampling from softmax(logits / T); argmax when T == 0."""
  if temperature == 0.0:
    return jnp.argmax(logits_BLV, axis=-1).astype(jnp.int32)
  g = jax.random.gumbel(key, logits_BLV.shape, jnp.float32)
  return jnp.argmax(logits_BLV / temperature + g, axis=-1).astype(jnp.int32)


def descending_rank(conf_BL):
  """Rank of each position by descending confidence (0 = most confident; ties: lower index
  first)."""
  order = jnp.argsort(-conf_BL, axis=-1, stable=True)
  return jnp.argsort(order, axis=-1, stable=True)


def select_commits(logits_BLV, open_BL, key, k_commit, *, cfg, mask_id: int):
  """One denoising decision over the ``open_BL`` (masked, current-block) positions.

  Proposes x0 for every position over the whole vocabulary (the mask token
  too, as the official LLaDA code; never the mask token with
  ``cfg.exclude_mask``), scores it with the registered remasking policy and
  picks the ``k_commit`` most confident open positions (LLaDA
  ``get_num_transfer_tokens`` schedule), or in dynamic mode
  (``cfg.threshold > 0``, Fast-dLLM) every open position at or above the threshold
  and at least the most confident one. A picked position whose proposal is the
  mask token is not committed (it stays masked). ``key`` is split into
  (proposal, confidence) keys. Returns (x0_BL, commit_BL).
  """
  logits_BLV = logits_BLV.astype(jnp.float32)
  if cfg.exclude_mask:
    logits_BLV = logits_BLV.at[..., mask_id].set(_NEG)
  k_prop, k_conf = jax.random.split(key)
  x0_BL = _propose(logits_BLV, k_prop, cfg.temperature)
  conf_BL = jnp.where(open_BL, confidence(cfg.remasking, logits_BLV, x0_BL, k_conf), _NEG)
  rank_BL = descending_rank(conf_BL)
  if cfg.threshold > 0:
    picked_BL = (conf_BL >= cfg.threshold) | (rank_BL == 0)  # Fast-dLLM: drops only < threshold
  else:
    picked_BL = rank_BL < k_commit
  return x0_BL, open_BL & picked_BL & (x0_BL != mask_id)


def block_of(x_BL, block, block_len: int):
  """[B, T]: the ``block``-th block of ``block_len`` tokens of x_BL (``block`` may be traced)."""
  return jax.lax.dynamic_slice_in_dim(x_BL, block * block_len, block_len, axis=1)


def block_has_mask(x_BL, block, *, block_len: int, mask_id: int):
  """Whether any row still has a masked token in the ``block``-th block."""
  return jnp.any(block_of(x_BL, block, block_len) == mask_id)


def commit_step(buffers, logits_BTV, block, k_commit, key, *, cfg, mask_id: int):
  """One step on the open block's logits ``logits_BTV`` (T = ``cfg.block_len``).

  ``buffers`` = (x_BL, unmask_BL, step, traj_SBL): the completion, the step at
  which each position was committed (-1 = not yet), the global step index and
  the trajectory buffer. The decision is :func:`select_commits` on the block's
  masked positions with randomness ``fold_in(key, step)``; committed positions
  get their proposal and ``step``; with ``cfg.record_trajectory`` the tokens
  after the step are written at ``traj_SBL[step]``. Returns the buffers after
  the step, ``step + 1``.
  """
  x_BL, unmask_BL, step, traj_SBL = buffers
  bl = cfg.block_len
  x_BT, u_BT = block_of(x_BL, block, bl), block_of(unmask_BL, block, bl)
  x0_BT, commit_BT = select_commits(logits_BTV, x_BT == mask_id, jax.random.fold_in(key, step),
                                    k_commit, cfg=cfg, mask_id=mask_id)
  x_BL = jax.lax.dynamic_update_slice_in_dim(x_BL, jnp.where(commit_BT, x0_BT, x_BT),
                                             block * bl, axis=1)
  unmask_BL = jax.lax.dynamic_update_slice_in_dim(unmask_BL, jnp.where(commit_BT, step, u_BT),
                                                  block * bl, axis=1)
  if cfg.record_trajectory:
    traj_SBL = jax.lax.dynamic_update_index_in_dim(traj_SBL, x_BL, step, 0)
  return x_BL, unmask_BL, step + 1, traj_SBL
