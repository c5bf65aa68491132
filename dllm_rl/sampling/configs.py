"""The sampler config of a run: the masked (LLaDA) sampler's or, for a block model, the block
sampler's, from the run's config sections."""

from __future__ import annotations

from dllm_rl.sampling.block_sampler import BlockSamplerConfig
from dllm_rl.sampling.sampler import SamplerConfig


def sampler_config(config) -> SamplerConfig | BlockSamplerConfig:
  """The run's sampler config (``BlockSamplerConfig`` when ``model.block_size`` > 0)."""
  return (BlockSamplerConfig if config.model.block_size else SamplerConfig).from_config(config)
