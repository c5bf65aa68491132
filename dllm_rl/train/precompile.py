"""Compile an RL run's first-step programs without training it.

:func:`precompile_rl` lowers and compiles what the first RL step of ``config`` runs: the
rollout sampler and the rl_step, at the shapes of its first prompt batch. It builds them with
the RL phase's own constructors (dllm_rl.train.rl_loop: ``rollout_sampler``, ``update_step``,
``rl_state``, ``rollout_batch``), so the programs are the ones the run will ask for. With JAX's
persistent compilation cache on, the run then loads them instead of compiling them: the study
compiles the next arms in a background thread while one trains (dllm_rl.study.prefetch).

No checkpoint is needed: the state is a fresh init of the model, which has the SFT start's
shapes, dtypes and shardings (the programs depend on nothing else). Later prompt buckets of
other lengths (``data.prompt_buckets``) still compile when the run meets them.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from dllm_rl.tasks.data import trim_to_bucket
from dllm_rl.train import evaluation
from dllm_rl.train.context import Context, init_params
from dllm_rl.train.rl_loop import (
  rl_optimizer,
  rl_state,
  rollout_batch,
  rollout_prompts,
  rollout_sampler,
  step_hyper,
  update_step,
)


def precompile_rl(ctx: Context) -> dict:
  """Compile the rollout sampler and the rl_step of ``ctx``'s RL run for its first prompt
  batch; returns the seconds each took (``sampler_seconds``, ``step_seconds``: lowering and
  compiling, or loading from the persistent cache). Nothing is trained or written but the
  cache's entries."""
  config, r = ctx.config, ctx.config.rl
  graphdef, params = init_params(ctx)
  optimizer, schedule = rl_optimizer(r, lora_only=ctx.model_cfg.lora_rank > 0)
  state, state_sharding = rl_state(ctx, params, optimizer)
  batch, _ = trim_to_bucket(next(rollout_prompts(ctx)), config.data.prompt_buckets)
  k_roll, k_step = jax.random.split(jax.random.fold_in(state.rng, 0))  # RLPhase.step's keys
  _, sample_fn = rollout_sampler(ctx, graphdef)
  args = (state.params, batch["prompt_BP"], batch["prompt_valid_BP"], k_roll)
  t0 = time.perf_counter()
  traced = sample_fn.trace(*args)  # one trace: its output shapes and its program
  traced.lower().compile()
  t_sample = time.perf_counter() - t0
  out = traced.out_info
  completions = np.zeros(out.completion_BL.shape, out.completion_BL.dtype)
  examples = [ctx.train.examples[i] for i in batch["index"]]
  rewards, correct, _ = evaluation.verify_groups(ctx.task, ctx.tokenizer, examples, completions)
  rollout = rollout_batch(ctx, batch, completions,
                          np.zeros(out.unmask_step_BL.shape, out.unmask_step_BL.dtype),
                          rewards, correct)
  step_fn = update_step(ctx, graphdef, optimizer, schedule, state_sharding)
  t0 = time.perf_counter()
  step_fn.lower(state, rollout, k_step, step_hyper(ctx)).compile()
  return {"sampler_seconds": t_sample, "step_seconds": time.perf_counter() - t0}
