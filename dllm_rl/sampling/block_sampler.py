"""Block-diffusion sampler (SDAR / Fast-dLLM v2) with a KV cache, jitted.

The model runs under a block-causal mask
(:func:`dllm_rl.kernels.block_mask.block_causal_mask`): the
(left-padded) prompt attends to itself — block-causally over blocks aligned to
its end with ``prompt_block_causal`` (SDAR's official generate), else as one
full block — and completion block b attends to the prompt and to blocks <= b
(bidirectionally inside its block). Blocks of
``block_len`` tokens are denoised left to right; inside a block each step
makes the same step as the masked sampler (:func:`step.commit_step`:
the ``transfer_schedule`` k most confident tokens, or every token above
``threshold`` and at least one until the block is complete), on the current
block's logits only, with randomness ``fold_in(key, step)``. ``step`` is the
global state index (blocks in order, steps within each block) recorded in
``unmask_step_BL``, so StepRS numbers states in the order they happen.

With ``use_cache`` the prompt is encoded once into a fixed-size KV cache whose
slots mirror the sequence [prompt P | completion L]; each step runs the model
on the current block only (T = block_len tokens) against the cache, the
block's noisy keys/values overwriting its own (not yet valid) slots; once a
block is finished one more forward of its clean tokens writes their
keys/values and marks the slots valid (as SDAR / Fast-dLLM v2 do). Committed
blocks are never recomputed. Without the cache every step runs the full
sequence under the dense block-causal mask (the reference). Both paths attend
over the same keys in the same order and consume the same random keys for the
same decisions, so they return the same tokens and steps; their logits differ
only by float rounding (~1e-6 in float32, from differently shaped matmuls),
which could flip a decision only at an exact near-tie.

With ``stop_at_eos`` a row whose finished blocks contain EOS is done: its
remaining positions after the first EOS are filled with EOS (recorded at the last
step taken) and the loop over blocks ends when every row is done. Positions after
the first EOS are returned as EOS either way.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from dllm_rl.kernels.block_mask import block_causal_mask, prompt_block_mask
from dllm_rl.models import transformer
from dllm_rl.sampling.sampler import (SamplerConfig, block_schedule, fill_finished, finalize,
                                      initial_buffers, more_blocks, run_block, vmap_groups)
from dllm_rl.sampling.step import block_has_mask, block_of, commit_step
from dllm_rl.types import SampleOutput


@dataclasses.dataclass(frozen=True)
class BlockSamplerConfig(SamplerConfig):
  """``SamplerConfig`` plus ``use_cache`` (False = dense reference path) and
  ``prompt_block_causal`` (the prompt attends block-causally, blocks aligned to
  its end, as SDAR's official generate; False = the prompt is one full block)."""

  use_cache: bool = True
  prompt_block_causal: bool = False

  @classmethod
  def from_config(cls, config) -> "BlockSamplerConfig":
    base = SamplerConfig.from_config(config)
    return cls(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
               prompt_block_causal=config.model.prompt_block_causal)


class _Model(NamedTuple):
  """How the sampler runs the network; ``state`` is what it carries (the cache)."""

  init: Callable[[], Any]
  block_logits: Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]  # → [B, T, V]
  commit: Callable[[Any, jax.Array, jax.Array], Any]  # the finished block's clean tokens


def _dense_model(graphdef, params, prompt_BP, prompt_valid_BP, positions_BN, cfg) -> _Model:
  """Reference: the full sequence under the block-causal mask at every step."""
  p, bl = prompt_BP.shape[1], cfg.block_len
  mask_BNN = block_causal_mask(prompt_valid_BP, cfg.completion_len, bl, cfg.prompt_block_causal)

  def block_logits(state, x_BL, block):
    tokens_BN = jnp.concatenate([prompt_BP, x_BL], axis=1)
    logits_BNV = transformer.apply(graphdef, params, tokens_BN, positions_BN, mask_BNN)
    return jax.lax.dynamic_slice_in_dim(logits_BNV, p + block * bl, bl, axis=1), state

  return _Model(init=lambda: (), block_logits=block_logits, commit=lambda state, x_BL, block: state)


def _cached_model(graphdef, params, prompt_BP, prompt_valid_BP, positions_BN, cfg) -> _Model:
  """KV cache with slots = sequence positions; state = (cache, cache_valid_BM)."""
  (b, p), bl, l = prompt_BP.shape, cfg.block_len, cfg.completion_len

  def run(state, x_BL, block):  # the current block against the cache, written into its slots
    cache, valid_BM = state
    tokens_BT = block_of(x_BL, block, bl)
    positions_BT = jax.lax.dynamic_slice_in_dim(positions_BN, p + block * bl, bl, axis=1)
    logits_BTV, cache = transformer.apply_cached(graphdef, params, tokens_BT, positions_BT, cache,
                                                 valid_BM, p + block * bl, write=True)
    return logits_BTV, (cache, valid_BM)

  def init():
    model_cfg = nnx.merge(graphdef, params).cfg
    cache = transformer.init_kv_cache(model_cfg, b, p + l)
    prompt_mask_PP = prompt_block_mask(p, bl) if cfg.prompt_block_causal else None
    _, cache = transformer.apply_cached(
        graphdef, params, prompt_BP, positions_BN[:, :p], cache, jnp.zeros((b, p + l), bool), 0,
        new_valid_BT=prompt_valid_BP, new_mask_TT=prompt_mask_PP, write=True)
    return cache, jnp.concatenate([prompt_valid_BP, jnp.zeros((b, l), bool)], axis=1)

  def commit(state, x_BL, block):
    _, (cache, valid_BM) = run(state, x_BL, block)
    valid_BM = jax.lax.dynamic_update_slice_in_dim(valid_BM, jnp.ones((b, bl), bool),
                                                   p + block * bl, axis=1)
    return cache, valid_BM

  return _Model(init=init, block_logits=run, commit=commit)


def sample_blocks(graphdef, params, prompt_BP, prompt_valid_BP, key, *,
                  cfg: BlockSamplerConfig, mask_id: int, eos_id: int) -> SampleOutput:
  """Denoise a completion per prompt block by block. Pure; jit with ``cfg`` etc. static."""
  b, p = prompt_BP.shape
  l, bl = cfg.completion_len, cfg.block_len
  schedule_S = block_schedule(cfg)
  valid_BN = jnp.concatenate([prompt_valid_BP, jnp.ones((b, l), bool)], axis=1)
  positions_BN = transformer.positions_from_valid(valid_BN)
  make = _cached_model if cfg.use_cache else _dense_model
  model = make(graphdef, params, prompt_BP, prompt_valid_BP, positions_BN, cfg)

  def denoise_step(s, carry, block, k_commit):
    del s
    buffers, state = carry
    logits_BTV, state = model.block_logits(state, buffers[0], block)
    return commit_step(buffers, logits_BTV, block, k_commit, key, cfg=cfg, mask_id=mask_id), state

  def outer_body(c):
    carry, block = c
    (x_BL, unmask_BL, step, traj_SBL), state = run_block(
        denoise_step, carry, block, cfg=cfg, schedule_S=schedule_S,
        block_open=lambda cs: block_has_mask(cs[0][0], block, block_len=bl, mask_id=mask_id))
    x_BL, unmask_BL = fill_finished(x_BL, unmask_BL, step, cfg=cfg, mask_id=mask_id,
                                    eos_id=eos_id)
    # Write the finished block's clean keys/values (after the last block too: no
    # ``lax.cond`` on "a block follows", whose predicate is batched under the group vmap, so
    # that JAX would broadcast every weight the commit closes over to [G, ...]; for the MoE
    # experts that materialised G copies, 8 GiB each at LLaDA2.0-mini size).
    state = model.commit(state, x_BL, block)
    return ((x_BL, unmask_BL, step, traj_SBL), state), block + 1

  x0, u0, traj0 = initial_buffers(b, cfg=cfg, mask_id=mask_id)
  ((x_BL, unmask_BL, steps, traj_SBL), _), blocks = jax.lax.while_loop(
      lambda c: more_blocks(c[0][0][0], c[1], cfg=cfg, eos_id=eos_id), outer_body,
      (((x0, u0, jnp.int32(0), traj0), model.init()), jnp.int32(0)))
  return finalize(x_BL, unmask_BL, steps, blocks, traj_SBL, cfg=cfg, eos_id=eos_id)


def sample_block_groups(graphdef, params, prompt_BP, prompt_valid_BP, key, *, group_size: int,
                        cfg: BlockSamplerConfig, mask_id: int, eos_id: int) -> SampleOutput:
  """G completions per prompt (vmap over G independent keys); fields as
  ``sampler.sample_groups``: [B, G, L], trajectory [S, B, G, L], counts [G]."""
  return vmap_groups(lambda k: sample_blocks(graphdef, params, prompt_BP, prompt_valid_BP, k,
                                             cfg=cfg, mask_id=mask_id, eos_id=eos_id),
                     key, group_size)
