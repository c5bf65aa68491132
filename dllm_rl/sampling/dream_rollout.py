"""Dream's own sampler as the run's sampler (``sampler.kind = "dream"``): rollouts, greedy
evaluation and pass@k drawn as Dream's official ``diffusion_generate`` draws them.

The masked (LLaDA) sampler of :mod:`dllm_rl.sampling.sampler` decodes a Dream checkpoint with
LLaDA's rules: an even commit schedule, confidences from the untempered logits. Dream's plain
sampler (``generation_utils.py``, transcribed in :mod:`dllm_rl.sampling.dream` with its
fixture parity) differs in three ways that change which tokens a rollout commits:

* the schedule: k = int(mean masks × (1 − s/t)) over ``linspace(1, eps, steps + 1)`` (256
  tokens in 128 steps commit 1, 2, ..., 2, 3, not 2 every step);
* the confidences (``entropy``, ``maskgit_plus``, ``topk_margin``) are read from the
  *tempered*, top-p / top-k filtered probabilities, from which the proposal is also drawn;
* ``top_p`` / ``top_k`` (DiffuCoder's rollouts use top-p 0.95 and, left unset, top-k 50).

This module runs that sampler (:func:`dllm_rl.sampling.dream.sample`, completion rows only:
the prompt holds no mask id) and returns what the RL step reads: the completion (EOS from the
first EOS on, as every sampler here), ``unmask_step_BL`` (the step that first put a token
there, from the per-step history; -1 where the mask id was proposed at the last step and the
position stayed masked, as the masked sampler records it) and, with ``record_trajectory``,
the tokens after every step. One block, ``steps`` full forwards: the official sampler does not
stop at EOS, so neither does this one (``sampler.stop_at_eos`` is not read).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from dllm_rl.sampling import dream
from dllm_rl.sampling.dream_ops import DreamSamplerConfig
from dllm_rl.sampling.sampler import SamplerConfig, finalize, vmap_groups
from dllm_rl.types import SampleOutput

# ``sampler.remasking`` under ``sampler.kind = "dream"``: Dream's ``alg`` names (its
# ``confidence_threshold`` is batch 1 only, officially, so not a rollout sampler).
DREAM_ALGS = ("entropy", "maskgit_plus", "topk_margin", "origin")
# The masked sampler's policy names and their Dream equivalents, for error messages.
DREAM_NAME_OF = {"low_confidence": "maskgit_plus", "margin": "topk_margin",
                 "entropy": "entropy", "random": "origin"}


@dataclasses.dataclass(frozen=True)
class DreamRolloutConfig(SamplerConfig):
  """:class:`SamplerConfig` (``completion_len``, ``steps``, ``temperature``, ``remasking`` =
  Dream's ``alg``, ``record_trajectory``) plus Dream's ``eps``, ``top_p`` (1.0 = off) and
  ``top_k`` (0 = off). ``block_len`` is ``completion_len`` (one block). ``top_p`` applies
  when sampling (temperature > 0), as DiffuCoder calls ``diffusion_generate`` (``top_p=0.95
  if temperature > 0 else 1.0``); ``top_k`` at every temperature, as the official sampler
  applies the top_k it is given, and DiffuCoder's and DARE's calls leave theirs at the 50 that
  config.json carries under transformers 4.x (``dllm_rl.zoo.generators._DREAM_SAMPLING``): at
  temperature 0 it leaves the argmax alone but renormalises the probabilities the
  confidences (``entropy``, ``maskgit_plus``, ``topk_margin``) are read from."""

  eps: float = 1e-3
  top_p: float = 1.0
  top_k: int = 0

  @classmethod
  def from_config(cls, config) -> "DreamRolloutConfig":
    s = config.sampler
    return cls(completion_len=config.data.completion_len, steps=s.steps,
               block_len=config.data.completion_len, temperature=float(s.temperature),
               remasking=s.remasking, eps=float(s.eps),
               top_p=float(s.top_p), top_k=int(s.top_k))

  def dream(self, mask_id: int) -> DreamSamplerConfig:
    """The official sampler's settings (``output_history``: the unmask steps come from it)."""
    sampling = self.temperature > 0
    return DreamSamplerConfig(
        max_new_tokens=self.completion_len, mask_id=mask_id, steps=self.steps, eps=self.eps,
        alg=self.remasking, temperature=self.temperature,
        top_p=self.top_p if sampling and self.top_p < 1.0 else None,
        top_k=self.top_k or None, output_history=True)


def unmask_steps(history_SBL, mask_id: int):
  """int32 [B, L]: the first step after which each position holds a token (Dream never
  re-masks one), -1 where none did."""
  filled_SBL = history_SBL != mask_id
  first_BL = jnp.argmax(filled_SBL, axis=0).astype(jnp.int32)
  return jnp.where(jnp.any(filled_SBL, axis=0), first_BL, -1)


def sample(graphdef, params, prompt_BP, prompt_valid_BP, key, *, cfg: DreamRolloutConfig,
           mask_id: int, eos_id: int) -> SampleOutput:
  """One completion per prompt by Dream's plain sampler (prompts left-padded, as the data
  pipeline pads them). Pure; jit with ``graphdef`` and ``cfg`` static."""
  p = prompt_BP.shape[1]
  out = dream.sample(graphdef, params, prompt_BP, prompt_valid_BP, key, cfg=cfg.dream(mask_id),
                     prompt_has_masks=False)
  history_SBL = out.history_SBN[:, :, p:]
  steps = jnp.int32(cfg.steps)
  return finalize(out.sequences_BN[:, p:], unmask_steps(history_SBL, mask_id), steps,
                  jnp.int32(1), history_SBL, cfg=cfg, eos_id=eos_id)


def sample_groups(graphdef, params, prompt_BP, prompt_valid_BP, key, *, group_size: int,
                  cfg: DreamRolloutConfig, mask_id: int, eos_id: int) -> SampleOutput:
  """G completions per prompt (vmap over G keys), laid out as
  :func:`dllm_rl.sampling.sampler.sample_groups` lays them out."""
  return vmap_groups(lambda k: sample(graphdef, params, prompt_BP, prompt_valid_BP, k, cfg=cfg,
                                      mask_id=mask_id, eos_id=eos_id), key, group_size)
