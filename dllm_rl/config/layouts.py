"""Device layouts shared by the production config files (nothing about the algorithm)."""

from __future__ import annotations

import ml_collections

from dllm_rl.config.schema import load_config_file, locked


def gpu_node(config: ml_collections.ConfigDict) -> None:
  """One node of 8 GPUs (or more, launch/slurm_gpu.sh): 8 prompts × ``rl.group_size``
  completions a step, one prompt per GPU on a node; held-out batches of 32; FSDP over every
  GPU of the job. In place, on an unlocked config; the experiment is unchanged."""
  config.rl.batch_prompts = 8
  config.eval.batch_size = 32
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, -1, 1


def gpu_node_config(tpu_config_file: str) -> ml_collections.ConfigDict:
  """The experiment of a TPU config file in the :func:`gpu_node` layout, locked."""
  config = load_config_file(tpu_config_file)
  config.unlock()
  gpu_node(config)
  return locked(config)
