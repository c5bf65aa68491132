"""LLaDA-style masked-diffusion sampler (semi-autoregressive blocks), jitted.

The completion starts fully masked. Blocks of ``block_len`` tokens are denoised
left to right, ``steps / num_blocks`` steps per block. Each step predicts every
masked token (Gumbel-max with temperature, greedy at 0) and scores confidences
with a registered remasking policy and commits either the k most confident
masked tokens of the current block (k from an even schedule, LLaDA
``get_num_transfer_tokens``) or, in dynamic mode (Fast-dLLM), every token above
``threshold`` (at least one per step, until the block is complete); that step is
:func:`dllm_rl.sampling.step.commit_step`, shared with the block sampler.
Only the open block's logits are computed (the head, Gumbel noise and softmax
run on its ``block_len`` positions; ``sampler.cache`` picks how, see
:mod:`dllm_rl.sampling.open_block`: ``none`` = the exact full forward, or
Fast-dLLM's ``prefix`` / ``dual`` KV caches refreshed at each block start).
Committed tokens are never re-masked; the step at which each token was
committed is recorded in ``unmask_step_BL``; with ``record_trajectory`` the
tokens after every step are returned too (``trajectory_SBL``, steps that did
not run stay masked).

Proposals and confidences range over the whole vocabulary, the mask token
included, with confidences in float32: this is what the official LLaDA
``generate`` does (greedy, its softmax runs on the model's float32 logits), and
the default reproduces it token for token (tests/sampling/test_official_parity.py).
A position whose proposal is the mask token stays masked, as in the official
code: it uses up one slot of the step's schedule, stays open for the block's
next steps and is not recorded in ``unmask_step_BL`` (-1 if never filled). A
block may end with such positions left; they stay in the completion as mask
ids (decoders print them, verifiers reject them, the RL step scores them like
any other token). The official code would let them compete again in later
blocks' steps; here only the open block is decided, so they stay masked. In
threshold mode a block runs at most ``block_len`` steps, so repeated mask
proposals cannot loop forever. With ``exclude_mask`` the mask token's logit is
set to -inf first (MDLM "SUBS"), which renormalises the confidences and
changes which tokens commit.

With ``stop_at_eos``, a sequence whose committed blocks contain EOS is finished:
its remaining positions after the first EOS are filled with EOS, and the loop over
blocks ends as soon as every sequence is finished (the tokens up to the first EOS are
those of ``stop_at_eos=False``). Positions after the first EOS are returned
as EOS either way.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from dllm_rl.sampling.open_block import CACHES
from dllm_rl.sampling.remasking import REMASKING
from dllm_rl.sampling.step import block_has_mask, commit_step
from dllm_rl.types import SampleOutput


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  completion_len: int
  steps: int
  block_len: int
  temperature: float = 0.0
  remasking: str = "low_confidence"
  threshold: float = 0.0
  stop_at_eos: bool = True
  record_trajectory: bool = False
  exclude_mask: bool = False
  cache: str = "none"  # a name in dllm_rl.sampling.open_block.CACHES (masked sampler only)
  cache_refresh: int = 0  # prefix/dual: also refresh every this many steps of a block (0 = off)

  @property
  def max_steps(self) -> int:
    """Upper bound on denoising steps (dynamic mode commits >= 1 token per step)."""
    return self.completion_len if self.threshold > 0 else self.steps

  @property
  def num_blocks(self) -> int:
    return self.completion_len // self.block_len

  @property
  def steps_per_block(self) -> int:
    return self.steps // self.num_blocks

  @classmethod
  def from_config(cls, config) -> "SamplerConfig":
    s = config.sampler
    return cls(completion_len=config.data.completion_len, steps=s.steps,
               block_len=s.block_len, temperature=float(s.temperature),
               remasking=s.remasking, threshold=float(s.threshold),
               stop_at_eos=s.stop_at_eos, exclude_mask=s.exclude_mask,
               cache=s.cache, cache_refresh=s.cache_refresh)


def transfer_schedule(block_len: int, steps_per_block: int) -> np.ndarray:
  """Tokens to commit at each step of a block: as even as possible, remainder first."""
  base, rem = divmod(block_len, steps_per_block)
  return np.array([base + (s < rem) for s in range(steps_per_block)], np.int32)


def block_schedule(cfg: SamplerConfig) -> jax.Array:
  """Validate the sampler's shape and policy name; tokens to commit at each step of a block."""
  l, bl = cfg.completion_len, cfg.block_len
  if l % bl or cfg.steps % cfg.num_blocks:
    raise ValueError(f"bad sampler shape: completion_len={l}, block_len={bl}, steps={cfg.steps}")
  REMASKING.get(cfg.remasking)  # fail fast on unknown names
  CACHES.get(cfg.cache)
  return jnp.asarray(transfer_schedule(bl, cfg.steps_per_block))


def run_block(denoise_step, carry, block, *, cfg: SamplerConfig, schedule_S, block_open,
              first: int = 0):
  """Denoise one block from its step ``first``: the fixed schedule, or (threshold mode) until
  ``block_open(carry)`` says no masked token is left in it, up to step ``block_len`` (a step
  may commit nothing when the mask token is proposed).
  ``denoise_step(s, carry, block, k_commit) -> carry``, s = the step within the block."""
  if cfg.threshold > 0:
    _, carry = jax.lax.while_loop(
        lambda c: (c[0] < cfg.block_len) & block_open(c[1]),
        lambda c: (c[0] + 1, denoise_step(c[0], c[1], block, 0)), (jnp.int32(first), carry))
    return carry
  return jax.lax.fori_loop(
      first, cfg.steps_per_block, lambda s, c: denoise_step(s, c, block, schedule_S[s]), carry)


def _finished(x_BL, eos_id: int):
  return jnp.any(x_BL == eos_id, axis=-1)


def _from_first_eos(x_BL, eos_id: int):
  """Each row's first EOS and every position after it."""
  return jnp.cumsum(x_BL == eos_id, axis=-1) > 0


def more_blocks(x_BL, block, *, cfg: SamplerConfig, eos_id: int):
  """Blocks remain, and (with ``stop_at_eos``) some row has not committed EOS yet."""
  more = block < cfg.num_blocks
  if cfg.stop_at_eos:
    more &= ~jnp.all(_finished(x_BL, eos_id))
  return more


def fill_finished(x_BL, unmask_BL, step, *, cfg: SamplerConfig, mask_id: int, eos_id: int):
  """After a block: rows that committed EOS get EOS in every still-masked position after
  their first EOS, recorded as unmasked at the last step that ran. A mask left before it (a
  mask-id proposal in a finished block) stays, as without ``stop_at_eos``: the tokens up to
  the first EOS do not depend on it."""
  if not cfg.stop_at_eos:
    return x_BL, unmask_BL
  fill_BL = _from_first_eos(x_BL, eos_id) & (x_BL == mask_id)
  return jnp.where(fill_BL, eos_id, x_BL), jnp.where(fill_BL, step - 1, unmask_BL)


def initial_buffers(batch: int, *, cfg: SamplerConfig, mask_id: int):
  """All-masked completion, unmask steps -1, and the (optional) trajectory buffer."""
  l = cfg.completion_len
  traj = jnp.full((cfg.max_steps if cfg.record_trajectory else 0, batch, l), mask_id, jnp.int32)
  return (jnp.full((batch, l), mask_id, jnp.int32), jnp.full((batch, l), -1, jnp.int32), traj)


def finalize(x_BL, unmask_BL, steps, blocks, traj_SBL, *, cfg: SamplerConfig,
             eos_id: int) -> SampleOutput:
  """EOS from the first EOS on, packed into a SampleOutput."""
  return SampleOutput(completion_BL=jnp.where(_from_first_eos(x_BL, eos_id), eos_id, x_BL),
                      unmask_step_BL=unmask_BL, num_steps=steps, num_blocks=blocks,
                      trajectory_SBL=traj_SBL if cfg.record_trajectory else None)


def sample(graphdef, params, prompt_BP, prompt_valid_BP, key, *,
           cfg: SamplerConfig, mask_id: int, eos_id: int) -> SampleOutput:
  """Denoise a completion for each prompt. Pure; jit with ``cfg`` etc. static.

  ``cfg.cache`` picks how the open block's logits are computed
  (:mod:`dllm_rl.sampling.open_block`); the decisions, random keys and step
  numbering are the same in every mode."""
  b, _ = prompt_BP.shape
  bl = cfg.block_len
  schedule_S = block_schedule(cfg)
  model = CACHES.get(cfg.cache)(graphdef, params, prompt_BP, prompt_valid_BP,
                                completion_len=cfg.completion_len, block_len=bl)

  def decide(carry, logits_BTV, block, k_commit):
    return commit_step(carry, logits_BTV, block, k_commit, key, cfg=cfg, mask_id=mask_id)

  def run_open_block(carry, block):
    """The block's first step on the refresh forward, later ones on ``model.step``;
    then EOS fill."""
    logits_BTV, state = model.refresh(carry[0], block)
    carry = decide(carry, logits_BTV, block, schedule_S[0])
    every = cfg.cache_refresh if cfg.cache != "none" else 0

    def later(s, c_state, block, k):  # step s (>= 1) of the block
      c, st = c_state
      if not every:
        return decide(c, model.step(st, c[0], block), block, k), st

      def refreshed():
        logits, new_st = model.refresh(c[0], block)
        return decide(c, logits, block, k), new_st

      return jax.lax.cond(s % every == 0, refreshed,
                          lambda: (decide(c, model.step(st, c[0], block), block, k), st))

    carry, _ = run_block(
        later, (carry, state), block, cfg=cfg, schedule_S=schedule_S, first=1,
        block_open=lambda cs: block_has_mask(cs[0][0], block, block_len=bl, mask_id=mask_id))
    x_BL, unmask_BL, step, traj_SBL = carry
    x_BL, unmask_BL = fill_finished(x_BL, unmask_BL, step, cfg=cfg, mask_id=mask_id,
                                    eos_id=eos_id)
    return x_BL, unmask_BL, step, traj_SBL

  x0, u0, traj0 = initial_buffers(b, cfg=cfg, mask_id=mask_id)
  carry = (x0, u0, jnp.int32(0), traj0)
  if model.static_blocks:  # block shapes differ (prefix cache): one traced copy per block
    blocks = jnp.int32(0)
    for block in range(cfg.num_blocks):
      more = jnp.asarray(more_blocks(carry[0], block, cfg=cfg, eos_id=eos_id))
      carry = jax.lax.cond(more, lambda c, blk=block: run_open_block(c, blk), lambda c: c, carry)
      blocks += more.astype(jnp.int32)
  else:
    carry, blocks = jax.lax.while_loop(
        lambda c: more_blocks(c[0][0], c[1], cfg=cfg, eos_id=eos_id),
        lambda c: (run_open_block(c[0], c[1]), c[1] + 1), (carry, jnp.int32(0)))
  x_BL, unmask_BL, steps, traj_SBL = carry
  return finalize(x_BL, unmask_BL, steps, blocks, traj_SBL, cfg=cfg, eos_id=eos_id)


def sample_groups(graphdef, params, prompt_BP, prompt_valid_BP, key, *, group_size: int,
                  cfg: SamplerConfig, mask_id: int, eos_id: int) -> SampleOutput:
  """G completions per prompt (vmap over G independent keys).

  Returns completion/unmask_step as [B, G, L], trajectory as [S, B, G, L] and
  num_steps/num_blocks as [G].
  """
  return vmap_groups(lambda k: sample(graphdef, params, prompt_BP, prompt_valid_BP, k,
                                      cfg=cfg, mask_id=mask_id, eos_id=eos_id), key, group_size)


def vmap_groups(sample_fn, key, group_size: int) -> SampleOutput:
  """Run ``sample_fn(key) -> SampleOutput`` for G split keys (vmap) and lay the
  result out as completion/unmask_step [B, G, L], trajectory [S, B, G, L],
  num_steps/num_blocks [G]."""
  out = jax.vmap(sample_fn)(jax.random.split(key, group_size))
  traj = out.trajectory_SBL  # [G, S, B, L] → [S, B, G, L]
  return out.replace(
      completion_BL=jnp.swapaxes(out.completion_BL, 0, 1),
      unmask_step_BL=jnp.swapaxes(out.unmask_step_BL, 0, 1),
      trajectory_SBL=None if traj is None else jnp.transpose(traj, (1, 2, 0, 3)))
