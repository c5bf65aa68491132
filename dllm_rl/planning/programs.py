"""Every jitted program a run executes, built from abstract shapes and shardings only.

:func:`build_programs` returns, for a validated config and a device list, the
programs of its mode as ``(jitted fn, abstract args)`` pairs, with the same
builders, static configs and shardings the training loops use:

* ``rl_step`` (dllm_rl.rl.step via rl_loop.step_config) on one rollout batch,
* ``rollout_sampler``: B prompts × G completions at the rollout temperature,
* ``greedy_sampler``: the validation/test sampler on ``eval.batch_size`` prompts,
* ``sft_step`` when the mode trains SFT.

No weight and no data is read: an HF folder holding only config.json is enough.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from dllm_rl.config.choices import RL_MODES, SFT_MODES
from dllm_rl.models import lora, transformer
from dllm_rl.parallel.mesh import make_mesh
from dllm_rl.parallel.shard import batch_sharding, replicated, state_shardings
from dllm_rl.sampling.configs import sampler_config
from dllm_rl.train import context as setup, hf_source
from dllm_rl.types import SequenceBatch


@dataclasses.dataclass
class Program:
  name: str
  fn: object          # a jax.jit-wrapped function
  args: tuple         # abstract arguments (ShapeDtypeStruct with shardings)


def model_and_tokens(config):
  """(ModelConfig, mask_id, eos_id): from the HF config.json, or the config's sizes with
  the character tokenizer's ids."""
  if config.model.hf_checkpoint:
    m = config.model
    folder = hf_source.checkpoint_folder(m.hf_checkpoint, config_only=True)
    model_cfg, ids, family = hf_source.hf_model_config(folder, m.dtype, m.param_dtype,
                                                       **hf_source.hf_run_options(m))
    hf_source.check_block_size(folder, family, ids, m.block_size)  # as the run checks it
    return model_cfg, ids.mask_id, ids.eos_id if ids.eos_id is not None else ids.pad_id
  from dllm_rl.tasks import CharTokenizer
  tok = CharTokenizer()
  return setup.model_config(config, tok.vocab_size), tok.mask_id, tok.eos_id


def _abstract(tree, shardings):
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      tree, shardings)


def _train_state(abstract_params, optimizer, mesh, *, ref: bool = False):
  """Abstract TrainState (with shardings) and its shardings, as init_state_sharded places it."""
  from dllm_rl.parallel.shard import init_train_state

  def build(p):
    state = init_train_state(p, optimizer, jax.random.key(0))
    return state.replace(ref_params=p if ref else None)

  state = jax.eval_shape(build, abstract_params)
  shardings = state_shardings(state, optimizer, mesh)
  return _abstract(state, shardings), shardings


def _batch(mesh, shapes: dict, cls):
  return cls(**{k: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(mesh, len(shape)))
                for k, (shape, dtype) in shapes.items()})


def build_programs(config, devices) -> tuple[list[Program], object, transformer.ModelConfig]:
  """(programs of ``config.mode``, mesh, model config) on ``devices``."""
  mesh = make_mesh(config.mesh, devices=list(devices))
  setup.check_batch_sizes(config, mesh)
  model_cfg, mask_id, eos_id = model_and_tokens(config)
  setup.check_expert_axis(config, model_cfg)
  model_cfg = lora.configure(model_cfg, config.lora)  # adapters + the frozen base's dtype
  setup.check_lora_targets(model_cfg)
  graphdef, abstract = transformer.abstract_model(model_cfg)
  from dllm_rl.parallel.shard import param_shardings
  params = _abstract(abstract, param_shardings(abstract, mesh))
  key = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype,
                             sharding=replicated(mesh))
  sampler_cfg = sampler_config(config)
  p, l = config.data.prompt_len, config.data.completion_len
  programs = []

  if config.mode in SFT_MODES:
    from dllm_rl.train.optim import make_optimizer
    from dllm_rl.train.sft_step import make_sft_step, step_options
    optimizer, schedule = make_optimizer(config.sft, lora_only=model_cfg.lora_rank > 0)
    state, sharding = _train_state(params, optimizer, mesh)
    fn = make_sft_step(graphdef, optimizer, schedule, mask_id=mask_id, mesh=mesh,
                       state_sharding=sharding, **step_options(config))
    b = config.data.batch_size
    batch = _batch(mesh, {"prompt_BP": ((b, p), jnp.int32), "prompt_valid_BP": ((b, p), bool),
                          "completion_BL": ((b, l), jnp.int32),
                          "completion_valid_BL": ((b, l), bool)}, SequenceBatch)
    programs.append(Program("sft_step", fn, (state, batch, key)))

  from dllm_rl.train import evaluation
  if config.mode in RL_MODES:
    from dllm_rl.rl.step import RolloutBatch, StepHyper, make_rl_step
    from dllm_rl.train.rl_loop import rl_optimizer, step_config
    r = config.rl
    optimizer, schedule = rl_optimizer(r, lora_only=model_cfg.lora_rank > 0)
    state, sharding = _train_state(params, optimizer, mesh, ref=r.kl_coef > 0)
    step_cfg = step_config(config, sampler_cfg, mask_id, eos_id)
    fn = make_rl_step(graphdef, optimizer, schedule, step_cfg, mesh=mesh,
                      state_sharding=sharding)
    hyper = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated(mesh)),
        StepHyper.of(r.lr, r))  # traced, as in the RL loop
    b, g = r.batch_prompts, r.group_size
    batch = _batch(mesh, {"prompt_BP": ((b, p), jnp.int32), "prompt_valid_BP": ((b, p), bool),
                          "completion_BGL": ((b, g, l), jnp.int32),
                          "unmask_step_BGL": ((b, g, l), jnp.int32),
                          "rewards_BG": ((b, g), jnp.float32), "correct_BG": ((b, g), bool)},
                   RolloutBatch)
    programs.append(Program("rl_step", fn, (state, batch, key, hyper)))
    rollout_cfg = dataclasses.replace(sampler_cfg, temperature=float(r.temperature))
    fn = evaluation.make_sample_fn(graphdef, rollout_cfg, mask_id=mask_id, eos_id=eos_id,
                                   mesh=mesh, group_size=g)
    prompts = _batch(mesh, {"a": ((b, p), jnp.int32), "b": ((b, p), bool)}, dict)
    programs.append(Program("rollout_sampler", fn, (params, prompts["a"], prompts["b"], key)))

  e = config.eval.batch_size
  greedy_cfg = dataclasses.replace(sampler_cfg, temperature=0.0)
  fn = evaluation.make_sample_fn(graphdef, greedy_cfg, mask_id=mask_id, eos_id=eos_id, mesh=mesh)
  prompts = _batch(mesh, {"a": ((e, p), jnp.int32), "b": ((e, p), bool)}, dict)
  programs.append(Program("greedy_sampler", fn, (params, prompts["a"], prompts["b"], key)))
  return programs, mesh, model_cfg
