"""Dream's block / KV-cache sampler (Fast-dLLM-style ``generation_utils_block.py``), jitted.

The ``max_new_tokens`` mask ids are cut into blocks of ``block_length``, denoised left to right
with ``spb = steps / num_blocks`` forwards each (semantics: shared/fixtures/dream_tiny/README.md,
"Block sampler"):

1. Block start: the full forward of the whole sequence writes every position's keys/values into a
   cache laid out like the sequence (``Transformer.forward_cached``), and the block's first
   position takes ``sample_tokens``' proposal unconditionally (argmax at temperature 0).
2. ``spb − 1`` cached steps i = 1 … spb − 1 with ``ts = linspace(1, eps, spb + 1)``: the block's
   masked positions are scored by **entropy** whatever ``alg`` is (as officially), and the
   k = int(batch-mean block mask count × (1 − ts[i+1]/ts[i])) most confident (all at the last
   step) are unmasked (:func:`dllm_rl.sampling.dream_ops.unmask_step`). The logits come from
   * ``dual_cache=False`` (prefix cache): queries ``x[:, block_start:]`` (this block and every
     later one) against the cached prefix before the block, frozen at the block start;
   * ``dual_cache=True``: queries the block only, against the keys/values of the whole sequence
     from the block start, with the block's own replaced by the fresh ones.
   In both, the logit shift happens among the query rows (the query window's first row keeps its
   own raw row, as in the official cached forward).

With ``alg="confidence_threshold"`` (batch 1) step 2 is instead: cached steps until the block has
no mask left, each taking the block's most probable masked position (max probability) and every
other one whose probability is ≥ ``threshold`` (Fast-dLLM's parallel decoding); ``steps`` only
has to divide into the blocks. The official loop has no bound; here a block stops after
``block_length`` cached steps (more happen only when a proposal is the mask id itself, on which
the official loop would spin forever). No official run of this mode is in the fixture.

The official loop also stops a block once it has no mask left, and after its last scheduled step
spends one more forward on a leftover mask without changing anything; here a step with no mask in
the block (any row) skips its forward, and the extra forward is not run (the tokens are the
same). Not supported (as officially): padding, and ``dual_cache`` with batch > 1 (the front,
:func:`dllm_rl.sampling.dream.dream_generate`, refuses them).

History: the tokens after every block start and every cached step (``num_blocks · spb`` entries,
or ``num_blocks · (block_length + 1)`` with ``confidence_threshold``, mask-filled beyond the steps
that ran; the official block sampler records none).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from dllm_rl.models import transformer
from dllm_rl.sampling.dream_ops import (DreamOutput, DreamSamplerConfig, maskgit_plus, propose,
                                        threshold_pick, transfer_fractions, unmask_step)


def sample_blocks(graphdef, params, prompt_BP, key, *, cfg: DreamSamplerConfig) -> DreamOutput:
  """The block sampler (prefix or dual cache, ``cfg.dual_cache``). Pure; jit with ``graphdef``
  and ``cfg`` static. Randomness: ``fold_in(key, s)`` with s the forward count over all blocks
  (skipped steps counted)."""
  b, p = prompt_BP.shape
  l, bl = cfg.max_new_tokens, cfg.block_length
  n, num_blocks = p + l, l // bl
  spb = cfg.steps // num_blocks
  frac_S = jnp.asarray(transfer_fractions(spb, cfg.eps))
  x_BN = jnp.concatenate([prompt_BP.astype(jnp.int32),
                          jnp.full((b, l), cfg.mask_id, jnp.int32)], axis=1)
  positions_BN = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
  empty = transformer.init_kv_cache(nnx.merge(graphdef, params).cfg, b, n)
  all_valid_BM = jnp.ones((b, n), bool)

  def start_block(x_BN, start, step_key):
    """The full forward (cache written); the block's first position takes its proposal."""
    logits_B1V, cache = transformer.apply_cached_window(
        graphdef, params, x_BN, positions_BN, empty, jnp.zeros((b, n), bool), 0,
        new_valid_BT=all_valid_BM, write=True, start=start, length=1)
    x0_B1, _ = propose(logits_B1V, step_key, temperature=cfg.temperature, top_p=cfg.top_p,
                       top_k=cfg.top_k)
    return jax.lax.dynamic_update_slice_in_dim(x_BN, x0_B1, start, axis=1), cache

  def block_logits(cache, x_BN, start):
    """[B, bl, V] shifted among the query rows, against the block-start cache."""
    if cfg.dual_cache:
      logits_BTV, _ = transformer.apply_cached(
          graphdef, params, jax.lax.dynamic_slice_in_dim(x_BN, start, bl, axis=1),
          jax.lax.dynamic_slice_in_dim(positions_BN, start, bl, axis=1), cache, all_valid_BM,
          start, write=False)
      return logits_BTV
    prefix_BM = jnp.broadcast_to(jnp.arange(n) < start, (b, n))  # start is static here
    logits_BTV, _ = transformer.apply_cached_window(
        graphdef, params, x_BN[:, start:], positions_BN[:, start:], cache, prefix_BM, start,
        write=False, start=0, length=bl)
    return logits_BTV

  def scheduled_steps(carry, cache, start):
    """The block's ``spb − 1`` cached steps (entropy, k from the schedule)."""

    def step(i, carry):
      x_BN, history_SBN, s = carry
      x_BT = jax.lax.dynamic_slice_in_dim(x_BN, start, bl, axis=1)
      open_BT = x_BT == cfg.mask_id
      x_BT = jax.lax.cond(
          jnp.any(open_BT),
          lambda: unmask_step(x_BT, block_logits(cache, x_BN, start), open_BT, frac_S[i],
                              jax.random.fold_in(key, s), cfg=cfg, alg="entropy"),
          lambda: x_BT)
      x_BN = jax.lax.dynamic_update_slice_in_dim(x_BN, x_BT, start, axis=1)
      return x_BN, _record(history_SBN, s, x_BN), s + 1

    return jax.lax.fori_loop(1, spb, step, carry)

  def threshold_steps(carry, cache, start):
    """``confidence_threshold`` (batch 1): cached steps until the block has no mask, each taking
    the most probable masked position and every other one above ``threshold``; at most
    ``block_length`` steps (the official loop has no bound: it would spin forever on a position
    whose proposal stays the mask id)."""

    def step(carry):
      x_BN, history_SBN, s, j = carry
      x_BT = jax.lax.dynamic_slice_in_dim(x_BN, start, bl, axis=1)
      open_BT = x_BT == cfg.mask_id
      x0_BT, probs_BTV = propose(block_logits(cache, x_BN, start), jax.random.fold_in(key, s),
                                 temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)
      take_BT, _ = threshold_pick(maskgit_plus(probs_BTV, x0_BT), open_BT, jnp.sum(open_BT),
                                  cfg.threshold)
      x_BN = jax.lax.dynamic_update_slice_in_dim(x_BN, jnp.where(take_BT, x0_BT, x_BT), start,
                                                 axis=1)
      return x_BN, _record(history_SBN, s, x_BN), s + 1, j + 1

    def more(carry):
      x_BT = jax.lax.dynamic_slice_in_dim(carry[0], start, bl, axis=1)
      return (carry[3] < bl) & jnp.any(x_BT == cfg.mask_id)

    return jax.lax.while_loop(more, step, (*carry, jnp.int32(0)))[:3]

  def run_block(carry, block):
    """Block start, then its cached steps; ``block`` is static for the prefix cache."""
    x_BN, history_SBN, s = carry
    start = p + block * bl
    x_BN, cache = start_block(x_BN, start, jax.random.fold_in(key, s))
    carry = (x_BN, _record(history_SBN, s, x_BN), s + 1)
    if cfg.alg == "confidence_threshold":
      return threshold_steps(carry, cache, start)
    return scheduled_steps(carry, cache, start)

  per_block = bl + 1 if cfg.alg == "confidence_threshold" else spb
  history_SBN = jnp.full((num_blocks * per_block if cfg.output_history else 0, b, n),
                         cfg.mask_id, jnp.int32)
  carry = (x_BN, history_SBN, jnp.int32(0))
  if cfg.dual_cache:
    carry = jax.lax.fori_loop(0, num_blocks, lambda blk, c: run_block(c, blk), carry)
  else:  # the query window x[:, start:] shrinks block by block: one traced copy per block
    for block in range(num_blocks):
      carry = run_block(carry, block)
  x_BN, history_SBN, _ = carry
  return DreamOutput(x_BN, history_SBN if cfg.output_history else None)


def _record(history_SBN, s, x_BN):
  """``history[s] = x`` (nothing when no history is asked for: the buffer is empty)."""
  if history_SBN.shape[0] == 0:
    return history_SBN
  return history_SBN.at[s].set(x_BN, mode="drop")
