"""The sampler config of a run: the masked (LLaDA) sampler's, Dream's own
(``sampler.kind = "dream"``) or, for a block model, the block sampler's, from the run's config
sections."""

from __future__ import annotations

from dllm_rl.sampling.block_sampler import BlockSamplerConfig
from dllm_rl.sampling.dream_rollout import DreamRolloutConfig
from dllm_rl.sampling.sampler import SamplerConfig

KINDS = ("masked", "dream")  # ``sampler.kind`` of a model without blocks


def sampler_config(config) -> SamplerConfig | BlockSamplerConfig:
  """The run's sampler config (``BlockSamplerConfig`` when ``model.block_size`` > 0,
  ``DreamRolloutConfig`` with ``sampler.kind = "dream"``)."""
  if config.model.block_size:
    return BlockSamplerConfig.from_config(config)
  kind = config.sampler.get("kind", "masked")
  return (DreamRolloutConfig if kind == "dream" else SamplerConfig).from_config(config)
