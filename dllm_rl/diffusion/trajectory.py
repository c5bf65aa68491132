"""The ``trajectory`` estimator: each token scored in the denoising state it was committed from.

TraceRL (Wang et al. 2025, arXiv 2509.06949, "Revolutionizing Reinforcement Learning
Framework for Diffusion Large Language Models") treats decoding as a Markov decision
process: the state before step t is s_t = (q, τ_{<t}), the prompt and every token
committed at steps < t; the action τ(t) is the set of tokens committed at step t, each
with log-probability log π_θ(o | q, τ_{<t}) read off one forward pass of the state
(the positions not yet committed are masks). Its trajectory-aware objective replaces
the random-mask estimates of log π by these exact per-state terms:

    ℓ̂_θ(o | q) = Σ_t Σ_{j ∈ τ(t)} log π_θ(o_j | q, τ_{<t})       (reduction="sum")

(``"mean"`` divides by the number of valid tokens). There is no Monte-Carlo noise:
ℓ̂ is a deterministic function of θ and the recorded trajectory, so log ρ̂ = 0
exactly before the first update, whatever the keys.

Shrinkage (``trajectory_shrink`` = s, TraceRL's ``training.shrink``): the distinct
steps a row recorded are taken in order and grouped s at a time; every token of a
group is scored in the state before the group's *first* step (its later steps'
commitments stay masked), so one forward pass serves s states. This is the official
``collapse_k_unique`` + ``prepare_inputs_and_labels_for_text`` of Gen-Verse/dLLM-RL
``train/rl_llada.py`` (method "TraceRL"): each step is mapped to the last step of its
group of s distinct steps, and the input masks every position whose mapped step is
≥ the group's, i.e. the group and everything after it. Groups are formed over the
row's *distinct* recorded steps (all completion positions, after the action too, as
the official step map covers the whole generated length), so a step at which the
sampler committed nothing creates no pass.

Batched and static: K = ceil(S / s) draws, S = ``num_states`` (the sampler's step
budget, ``SamplerConfig.max_steps``); draw k reveals the tokens of groups < k,
masks the rest and scores the valid tokens of group k. Rows with fewer distinct
steps leave their last draws empty. Positions after the action are fed as EOS
(dllm_rl.rl.step) when revealed and are never scored; positions never committed
(unmask step −1) are masks in every state and never scored. The prompt is clean.

Block-diffusion models (SDAR / TraDo, ``block_size`` = bs > 0; TraceRL's
``train/rl_sdar.py`` and ``rl_trado.py``): the block sampler decodes blocks left to
right, so the state a token of block b was committed from is [prompt | blocks < b
clean | block b with the tokens committed at earlier steps of this block revealed and
the rest masked], later blocks absent (causal over blocks). Groups are formed per
block (``collapse_k_unique`` on each block's slice of the step map), and draw k
scores group k of *every* block at once: one staircase pass
(:func:`dllm_rl.diffusion.block.staircase_forward`) on [prompt | clean completion |
noisy completion] whose noisy block b holds block b's state before its group k, and
attends to the prompt, the clean blocks < b and itself. This is the official
``one_round_vectorized`` (each round takes the smallest remaining collapsed step of
every block, masks the positions of that block at or after it, and scores it) with
its ``make_basic_block_attention`` layout, one sequence of length P + 2L per round.
K = ceil(S_b / s) draws, S_b = min(bs, S / (L / bs)) the sampler's step budget of
one block (``SamplerConfig.max_steps`` is L in threshold mode, ``steps`` spread
evenly over the blocks otherwise); a row whose blocks take fewer groups leaves its
last draws empty (the official code drops them).
"""

from __future__ import annotations

import jax.numpy as jnp

from dllm_rl.diffusion.block import staircase_forward
from dllm_rl.diffusion.estimators import (
  ESTIMATORS,
  Estimator,
  EstimatorConfig,
  Likelihood,
)
from dllm_rl.diffusion.sft import sequence_inputs
from dllm_rl.types import SequenceBatch


def states_per_block(num_states: int, completion_len: int, block_size: int) -> int:
  """S_b: the block sampler's step budget of one block, at most ``block_size`` distinct
  steps (each commits a token); ``num_states`` spreads evenly over the L / bs blocks."""
  if block_size <= 0 or completion_len % block_size:
    raise ValueError(f"completion length {completion_len} is not a multiple of"
                     f" block_size={block_size}")
  nb = completion_len // block_size
  if num_states <= 0 or num_states % nb:
    raise ValueError(f"trajectory on a block model needs the sampler's step budget"
                     f" num_states={num_states} to be a positive multiple of the {nb} blocks")
  return min(block_size, num_states // nb)


def num_passes(num_states: int, shrink: int, *, completion_len: int = 0,
               block_size: int = 0) -> int:
  """K = ceil(S / shrink) forward passes (draws) of one ``trajectory`` estimate, or for a
  block model (``block_size`` > 0) K = ceil(S_b / shrink), S_b = :func:`states_per_block`."""
  if num_states <= 0 or shrink <= 0:
    raise ValueError(f"trajectory needs num_states > 0 and shrink > 0, got {num_states},"
                     f" {shrink}")
  if block_size > 0:
    num_states = states_per_block(num_states, completion_len, block_size)
  return -(-num_states // shrink)


def state_groups(unmask_step_BL, num_states: int, shrink: int):
  """Group of each position (−1 where never committed): the rank of its step among the
  row's distinct recorded steps, integer-divided by ``shrink`` (TraceRL's
  ``collapse_k_unique``)."""
  b, _ = unmask_step_BL.shape
  committed_BL = unmask_step_BL >= 0
  step_BL = jnp.clip(unmask_step_BL, 0, num_states - 1)
  present_BS = jnp.zeros((b, num_states), jnp.int32).at[
      jnp.arange(b)[:, None], step_BL].max(committed_BL.astype(jnp.int32))
  rank_BL = jnp.take_along_axis(jnp.cumsum(present_BS, -1), step_BL, -1) - 1
  return jnp.where(committed_BL, rank_BL // shrink, -1)


def block_state_groups(unmask_step_BL, block_size: int, shrink: int):
  """Group of each position within its block (−1 where never committed): the rank of its
  step among the distinct steps recorded in its block, integer-divided by ``shrink``
  (``collapse_k_unique`` per block, as TraceRL's ``rl_sdar.py``). O(bs²) per block."""
  b, l = unmask_step_BL.shape
  step_BnT = unmask_step_BL.reshape(b, l // block_size, block_size)
  committed_BnT = step_BnT >= 0
  same_BnTT = step_BnT[..., :, None] == step_BnT[..., None, :]
  repeat_BnT = (same_BnTT & jnp.tri(block_size, k=-1, dtype=bool)).any(-1)  # seen at an i < j
  first_BnT = committed_BnT & ~repeat_BnT  # one position per distinct step of the block
  below_BnTT = step_BnT[..., None, :] < step_BnT[..., :, None]  # [j, i]: step_i < step_j
  rank_BnT = (below_BnTT & first_BnT[..., None, :]).sum(-1)
  return jnp.where(committed_BnT, rank_BnT // shrink, -1).reshape(b, l)


def _draw(key, seqs: SequenceBatch, cfg: EstimatorConfig, mask_id: int) -> dict:
  """The K state inputs; ``key`` is unused (the estimate is exact)."""
  del key
  if seqs.unmask_step_BL is None:
    raise ValueError("the trajectory estimator needs the rollout's unmask steps"
                     " (SequenceBatch.unmask_step_BL, filled by dllm_rl.rl.step)")
  l = seqs.completion_BL.shape[1]
  k = num_passes(cfg.num_states, cfg.trajectory_shrink, completion_len=l,
                 block_size=cfg.block_size)
  if cfg.block_size > 0:
    group_BL = block_state_groups(seqs.unmask_step_BL, cfg.block_size, cfg.trajectory_shrink)
  else:
    group_BL = state_groups(seqs.unmask_step_BL, cfg.num_states, cfg.trajectory_shrink)
  k_K11 = jnp.arange(k)[:, None, None]
  revealed_KBL = (group_BL >= 0) & (group_BL < k_K11)
  noisy_KBL = jnp.where(revealed_KBL, seqs.completion_BL, mask_id)
  scored_KBL = (group_BL == k_K11) & seqs.completion_valid_BL
  draws = {"noisy_BL": noisy_KBL, "scored_BL": scored_KBL}
  if cfg.block_size > 0:  # the staircase pass reads the (clean) prompt from the draw
    draws["prompt_BP"] = jnp.broadcast_to(seqs.prompt_BP, (k,) + seqs.prompt_BP.shape)
  return draws


def _forward(scorer, seqs: SequenceBatch, draw: dict, cfg: EstimatorConfig):
  """One state: [clean prompt | partially revealed completion], scored at the completion;
  for a block model one staircase pass [prompt | clean completion | per-block states]."""
  if cfg.block_size > 0:  # every completion key, as the sampler saw them (EOS after the action)
    return staircase_forward(scorer, seqs, draw, cfg,
                             completion_keys_BL=jnp.ones_like(seqs.completion_valid_BL))
  tokens_BN, positions_BN, mask_B1N = sequence_inputs(seqs.prompt_BP, seqs.prompt_valid_BP,
                                                      draw["noisy_BL"])
  return scorer(tokens_BN, positions_BN, mask_B1N, seqs.prompt_BP.shape[1], seqs.completion_BL)


def _reduce(logp_KBL, ent_KBL, seqs: SequenceBatch, draws: dict,
            cfg: EstimatorConfig) -> Likelihood:
  """Each valid token's log-prob from the one draw that scores it (0 for tokens never
  committed); ``"mean"`` divides by the number of valid tokens."""
  token_BL = jnp.where(draws["scored_BL"], logp_KBL, 0.0).sum(0)
  if cfg.reduction == "mean":
    token_BL = token_BL / jnp.maximum(seqs.completion_valid_BL.sum(-1, keepdims=True), 1)
  scored_KBL = draws["scored_BL"]
  n_B = scored_KBL.sum((0, 2))  # over every scored token, once; NaN with none (Likelihood)
  entropy_B = jnp.where(n_B > 0, jnp.where(scored_KBL, ent_KBL, 0.0).sum((0, 2))
                        / jnp.maximum(n_B, 1), jnp.nan)
  return Likelihood(token_BL=token_BL, seq_B=token_BL.sum(-1), entropy_B=entropy_B)


trajectory = ESTIMATORS.register("trajectory")(Estimator(
    draw=_draw, forward=_forward, reduce=_reduce,
    doc="""TraceRL (arXiv 2509.06949) trajectory-aware estimate: token o_j committed at
step t is scored as log π_θ(o_j | q, τ_{<t}) in the state it was committed from, one
forward per group of ``trajectory_shrink`` distinct steps (the group's first state; block
models: per block, every block's group k in one staircase pass); ℓ̂ = Σ_j of these
(``reduction="sum"``) or their mean. Exact: no key, log ρ̂ = 0 at θ = θ_old."""))
