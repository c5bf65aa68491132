"""Compile an RL run's first-step programs without training it.

:func:`precompile_rl` lowers and compiles what the first RL step of ``config`` runs: the
rollout sampler and the rl_step, at the shapes of its first prompt batch. It builds them with
the RL phase's own constructors (dllm_rl.train.rl_loop: ``rollout_sampler``, ``update_step``,
``rl_state``, ``rollout_batch``), so the programs are the ones the run will ask for. With JAX's
persistent compilation cache on, the run then loads them instead of compiling them: the study
compiles the next arms in a background thread while one trains (dllm_rl.study.prefetch).

Nothing is allocated or read: the state is abstract (``jax.ShapeDtypeStruct`` leaves with the
shapes, dtypes and shardings of a fresh init, which are the SFT start's; the programs depend
on nothing else), so it needs no checkpoint and no device memory. Later prompt buckets of
other lengths (``data.prompt_buckets``) still compile when the run meets them. A run from
``model.hf_checkpoint`` (whose stored dtypes may differ, e.g. a LoRA base) is not covered.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from dllm_rl.tasks.data import trim_to_bucket
from dllm_rl.train import evaluation
from dllm_rl.models.transformer import abstract_params_sharded
from dllm_rl.train.context import Context
from dllm_rl.train.rl_loop import (
  rl_optimizer,
  rl_rng,
  rl_state,
  rollout_batch,
  rollout_prompts,
  rollout_sampler,
  step_hyper,
  step_keys,
  update_step,
)


def precompile_rl(ctx: Context) -> dict:
  """Compile the rollout sampler and the rl_step of ``ctx``'s RL run for its first prompt
  batch; returns the seconds each took (``sampler_seconds``, ``step_seconds``: lowering and
  compiling, or loading from the persistent cache). Nothing is trained or written but the
  cache's entries."""
  config, r = ctx.config, ctx.config.rl
  graphdef, params = abstract_params_sharded(ctx.model_cfg, ctx.mesh)
  optimizer, schedule = rl_optimizer(r, lora_only=ctx.model_cfg.lora_rank > 0)
  state, state_sharding = rl_state(ctx, params, optimizer, abstract=True)
  batch, _ = trim_to_bucket(next(rollout_prompts(ctx)), config.data.prompt_buckets)
  # the state's RNG as the run holds it (on its sharding; the abstract state has none)
  k_roll, k_step = step_keys(jax.device_put(rl_rng(ctx), state_sharding.rng), 0)
  _, sample_fn = rollout_sampler(ctx, graphdef)
  args = (state.params, batch["prompt_BP"], batch["prompt_valid_BP"], k_roll)
  t0 = time.perf_counter()
  traced = sample_fn.trace(*args)  # one trace: its program and its output shapes
  traced.lower().compile()
  t_sample = time.perf_counter() - t0
  out = getattr(traced, "out_info", None)  # a jax without it: trace the shapes again
  out = out if out is not None else jax.eval_shape(sample_fn, *args)
  completions = np.zeros(out.completion_BL.shape, out.completion_BL.dtype)
  examples = [ctx.train.examples[i] for i in batch["index"]]
  graded = evaluation.verify_groups(ctx.task, ctx.tokenizer, examples, completions)
  rollout = rollout_batch(ctx, batch, completions,
                          np.zeros(out.unmask_step_BL.shape, out.unmask_step_BL.dtype),
                          graded.rewards_BG, graded.correct_BG)
  step_fn = update_step(ctx, graphdef, optimizer, schedule, state_sharding)
  t0 = time.perf_counter()
  step_fn.lower(state, rollout, k_step, step_hyper(ctx)).compile()
  return {"sampler_seconds": t_sample, "step_seconds": time.perf_counter() - t0}
