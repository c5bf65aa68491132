"""Builds what every mode needs from a validated config: task, data, model, I/O."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import ml_collections
import numpy as np

from dllm_rl import tasks as tasks_lib
from dllm_rl.config import ConfigError
from dllm_rl.models import transformer
from dllm_rl.parallel.distributed import host_rows
from dllm_rl.parallel.mesh import make_mesh
from dllm_rl.parallel.shard import batch_divisor, init_params_sharded, shard_batch
from dllm_rl.sampling.sampler import SamplerConfig
from dllm_rl.tasks import data as data_lib


@dataclasses.dataclass
class Context:
  config: ml_collections.ConfigDict
  workdir: str
  task: Any
  tokenizer: Any
  model_cfg: transformer.ModelConfig
  sampler_cfg: SamplerConfig
  train_examples: list
  train_arrays: dict
  val_examples: list
  val_arrays: dict
  test_examples: list
  test_arrays: dict
  mesh: Any = None


def model_config(config, vocab_size: int) -> transformer.ModelConfig:
  """``config.model`` with the vocabulary resolved against the tokenizer."""
  model = config.model.to_dict()
  if model["vocab_size"] == 0:
    model["vocab_size"] = vocab_size
  elif model["vocab_size"] < vocab_size:
    raise ConfigError("model.vocab_size",
                      f"{model['vocab_size']} is smaller than the tokenizer's {vocab_size}")
  return transformer.ModelConfig.from_config(model)


def _encode(examples, tokenizer, config, split: str) -> dict:
  try:
    return data_lib.encode_examples(examples, tokenizer, config.data.prompt_len,
                                    config.data.completion_len)
  except ValueError as err:
    raise ValueError(f"{split} split of task {config.task.name!r}: {err}") from err


def check_batch_sizes(config, mesh) -> None:
  """Every global batch must split evenly over the batch axes (data × fsdp)."""
  div = batch_divisor(mesh)
  for key in ("data.batch_size", "rl.batch_prompts", "eval.batch_size"):
    section, name = key.split(".")
    value = config[section][name]
    if value % div:
      raise ConfigError(key, f"{value} is not a multiple of mesh data × fsdp = {div}"
                        f" (mesh {dict(mesh.shape)})")


def build_context(config, workdir: str) -> Context:
  """Generate the task data (host side), build the mesh and resolve static
  configs; no compilation."""
  try:
    mesh = make_mesh(config.mesh)
  except ValueError as err:
    raise ConfigError("mesh", str(err)) from err
  check_batch_sizes(config, mesh)
  os.makedirs(workdir, exist_ok=True)
  task = tasks_lib.make_task(config.task.name, **config.task.options.to_dict())
  tokenizer = tasks_lib.CharTokenizer()
  train = task.generate("train", config.task.train_size + config.task.val_size, config.seed)
  train, val = train[:config.task.train_size], train[config.task.train_size:]
  test = task.generate("test", config.task.test_size, config.seed + 1)
  return Context(
      config=config, workdir=workdir, task=task, tokenizer=tokenizer,
      model_cfg=model_config(config, tokenizer.vocab_size),
      sampler_cfg=SamplerConfig.from_config(config),
      train_examples=train, train_arrays=_encode(train, tokenizer, config, "train"),
      val_examples=val, val_arrays=_encode(val, tokenizer, config, "validation"),
      test_examples=test, test_arrays=_encode(test, tokenizer, config, "test"), mesh=mesh)


def init_params(ctx: Context):
  """Fresh (graphdef, params) from the run seed, initialised into their shardings."""
  key = jax.random.fold_in(jax.random.key(ctx.config.seed), 0)
  return init_params_sharded(ctx.model_cfg, key, ctx.mesh)


def to_device(ctx: Context, global_batch: dict, cls):
  """A global numpy batch (identical on every process) → the batch pytree,
  sharded over the batch axes; each process contributes only its own rows."""
  n = len(next(iter(global_batch.values())))
  rows = host_rows(n)
  return shard_batch(ctx.mesh, cls(**{k: np.asarray(v)[rows] for k, v in global_batch.items()}))
