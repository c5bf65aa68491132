"""RL phase orchestration: rollout → reward → rl_step (advantages, updates) → metrics →
eval → checkpoint. No math here: advantages, ratios and losses live in dllm_rl.rl."""

from __future__ import annotations

import dataclasses
import time
import types

import jax
import numpy as np

from dllm_rl import paths
from dllm_rl.diffusion.estimators import EstimatorConfig
from dllm_rl.infra import faults
from dllm_rl.infra.observability import MetricsLogger, phase_summary, progress
from dllm_rl.parallel.distributed import is_primary
from dllm_rl.parallel.shard import init_state_sharded, put_global
from dllm_rl.rl.advantages import AdvantageConfig, calibrated_beta
from dllm_rl.rl.losses import LossConfig
from dllm_rl.rl.step import RLStepConfig, RolloutBatch, make_rl_step
from dllm_rl.tasks.data import BatchIterator, trim_to_bucket
from dllm_rl.train import evaluation, flops
from dllm_rl.train.context import Context, init_params
from dllm_rl.train.optim import make_optimizer
from dllm_rl.train.resilience import Preempted, StepGuard, window_to_meta
from dllm_rl.train.sft_loop import PHASE as SFT
from dllm_rl.train.sft_loop import checkpoint_dir, mean_metrics, open_checkpointer
from dllm_rl.train.throughput import ProfileWindow, StepTimer

PHASE = "rl"


def rl_optimizer(r):
  """AdamW for RL; the schedule runs over steps × inner_steps optimizer updates."""
  section = types.SimpleNamespace(lr=r.lr, steps=r.steps * r.inner_steps,
                                  warmup_steps=r.warmup_steps, schedule=r.schedule, b1=r.b1,
                                  b2=r.b2, weight_decay=r.weight_decay, grad_clip=r.grad_clip)
  return make_optimizer(section)


def step_config(config, sampler_cfg, mask_id: int, eos_id: int) -> RLStepConfig:
  """The static RL-step options of a run: its config, its sampler (StepRS states) and the
  tokenizer's mask / EOS ids."""
  r, x = config.rl, config.estimator
  return RLStepConfig(
      loss=r.loss, advantage=r.advantage, estimator=x.name,
      estimator_cfg=EstimatorConfig.from_config(
          x, block_size=config.model.block_size,
          prompt_block_causal=config.model.prompt_block_causal,
          logits_chunk=config.model.logits_chunk),
      loss_cfg=LossConfig(clip=r.clip, clip_C=r.clip_C, eps=r.eps, spg_omega=x.spg_omega,
                          self_normalize=r.self_normalize),
      advantage_cfg=AdvantageConfig(beta=r.beta, beta_start=r.beta_start, beta_end=r.beta_end,
                                    beta_schedule=r.beta_schedule,
                                    control_per_state=r.control_per_state,
                                    num_states=sampler_cfg.max_steps),
      inner_steps=r.inner_steps, num_states=sampler_cfg.max_steps,
      dynamic_states=sampler_cfg.threshold > 0, kl_coef=r.kl_coef,
      kl_estimator=r.kl_estimator, mask_id=mask_id, eos_id=eos_id, micro_batch=r.micro_batch)


def _step_flops(config, ctx: Context, rollout_cfg, out, prompt_len: int) -> float:
  """Model FLOPs of one RL iteration (dllm_rl.train.flops): the rollout, at the blocks and
  steps the sampler ran (max over the groups), and the rl_step."""
  blocks, steps = int(np.max(np.asarray(out.num_blocks))), float(np.max(np.asarray(out.num_steps)))
  r = config.rl
  return (flops.sampler_flops(ctx.model_cfg, rollout_cfg, r.batch_prompts * r.group_size,
                              prompt_len, blocks=blocks, steps=steps)
          + flops.rl_step_flops(config, ctx.model_cfg, prompt_len=prompt_len))


def load_sft_params(ctx: Context):
  """The RL starting policy: the latest SFT checkpoint in the workdir, else the
  HF checkpoint of ``model.hf_checkpoint``."""
  graphdef, params = init_params(ctx)
  if not paths.resolve(checkpoint_dir(ctx.workdir, SFT)).is_dir():
    if ctx.hf_checkpoint:
      return graphdef, params
    raise FileNotFoundError(
        f"RL starts from an SFT checkpoint: none under {checkpoint_dir(ctx.workdir, SFT)}"
        " (use mode 'pipeline', run mode 'sft' with this --workdir first, or set"
        " model.hf_checkpoint)")
  template, _ = init_state_sharded(params, make_optimizer(ctx.config.sft)[0], jax.random.key(0),
                                   ctx.mesh)
  with open_checkpointer(ctx, SFT) as ckpt:
    state, _ = ckpt.restore(template)
  return graphdef, state.params


def run_rl(ctx: Context) -> dict:
  """RL from the SFT policy; resumes from ``workdir/checkpoints/rl`` when present."""
  config, r = ctx.config, ctx.config.rl
  wall0 = time.time()
  graphdef, params = load_sft_params(ctx)
  optimizer, schedule = rl_optimizer(r)
  state, state_sharding = init_state_sharded(
      params, optimizer, jax.random.fold_in(jax.random.key(config.seed), 2), ctx.mesh,
      ref_params=params if r.kl_coef > 0 else None)
  ckpt = open_checkpointer(ctx, PHASE)
  position, base_accuracy, meta = 0, None, {"metric_lines": 0}
  if ckpt.latest_step() is not None:
    state, meta = ckpt.restore(state)
    position, base_accuracy = meta["data_position"], meta["base_accuracy"]
    print(f"[rl] resumed at rollout batch {position}", flush=True)

  prompts = {"prompt_BP": ctx.train.arrays["prompt_BP"],
             "prompt_valid_BP": ctx.train.arrays["prompt_valid_BP"],
             "index": np.arange(len(ctx.train.examples))}
  batches = BatchIterator(prompts, r.batch_prompts, config.seed + 1, position=position)
  rollout_cfg = dataclasses.replace(ctx.sampler_cfg, temperature=float(r.temperature))
  rollout_fn = evaluation.make_sample_fn(graphdef, rollout_cfg, mask_id=ctx.tokenizer.mask_id,
                                         eos_id=ctx.tokenizer.eos_id, mesh=ctx.mesh,
                                         group_size=r.group_size)
  cfg = step_config(config, ctx.sampler_cfg, ctx.tokenizer.mask_id, ctx.tokenizer.eos_id)
  step_fn = make_rl_step(graphdef, optimizer, schedule, cfg, mesh=ctx.mesh,
                         state_sharding=state_sharding)
  greedy_fn, accuracy = evaluation.make_greedy_evaluator(graphdef, ctx.decoding,
                                                         ctx.eval_options)

  it = batches.position
  window = meta.get("metrics_window", [])  # steps since the last log, saved with the checkpoint
  guard = StepGuard.from_config(PHASE, ckpt, config)
  timer, first = StepTimer.from_config(config, ctx.mesh), True
  run_timer = StepTimer(num_devices=1, peak_flops=None)  # every timed step (the summary)
  rollout_tokens = r.batch_prompts * r.group_size * ctx.sampler_cfg.completion_len
  with MetricsLogger(ctx.workdir, tensorboard=config.log.tensorboard,
                     enabled=is_primary()) as logger, \
       ProfileWindow(config.profile.steps, ctx.workdir, enabled=is_primary()) as profile:
    if "metric_lines" in meta:  # drop records of steps about to be redone
      logger.supersede(PHASE, meta["metric_lines"])
    if it == 0:
      val = accuracy(state.params, ctx.val.examples, ctx.val.arrays)
      logger.log(0, {f"val_{k}": v for k, v in val.items()}, phase=PHASE)
    bar = progress(r.steps, desc=PHASE, initial=it,
                   disable=not (config.log.progress and is_primary()))
    while it < r.steps:
      profile.before(it + 1)
      t0 = time.perf_counter()
      batch, padding = trim_to_bucket(next(batches), config.data.prompt_buckets)
      k_roll, k_step = jax.random.split(jax.random.fold_in(state.rng, it))
      out = rollout_fn(state.params, batch["prompt_BP"], batch["prompt_valid_BP"], k_roll)
      faults.at("rollout", it)  # test-only hook (DLLM_FAULT), a no-op otherwise
      completions = np.asarray(out.completion_BL)
      t_roll = time.perf_counter() - t0
      examples = [ctx.train.examples[i] for i in batch["index"]]
      rewards, correct, _ = evaluation.verify_groups(ctx.task, ctx.tokenizer, examples, completions)
      rewards = faults.at("reward", it, rewards)
      rollout = put_global(ctx.mesh, RolloutBatch(
          prompt_BP=batch["prompt_BP"], prompt_valid_BP=batch["prompt_valid_BP"],
          completion_BGL=completions, unmask_step_BGL=np.asarray(out.unmask_step_BL),
          rewards_BG=rewards, correct_BG=correct))
      if base_accuracy is None:  # the starting policy's training accuracy: its first rollouts
        base_accuracy = float(np.mean(correct))
      state, metrics = step_fn(state, rollout, k_step)
      metrics = dict(metrics, prompt_padding_fraction=padding)
      faults.at("update", it)
      it += 1
      skipped = guard.skipped(state.opt_state, it)  # raises after too many in a row
      jax.block_until_ready(state.step)  # (guard.skipped has read this step's state already)
      step_seconds = time.perf_counter() - t0
      if not first:  # the first step compiles
        timer.add(step_seconds, rollout_seconds=t_roll, tokens=rollout_tokens,
                  flops=_step_flops(config, ctx, rollout_cfg, out, batch["prompt_BP"].shape[1]))
        run_timer.add(step_seconds, rollout_seconds=t_roll, tokens=rollout_tokens, flops=0.0)
      first = False
      profile.after(it, state)
      window.append(metrics)
      bar.update(1)
      if it % r.log_every == 0:
        logged = dict(mean_metrics(window), skipped_steps=skipped, **timer.metrics(rollout=True))
        window = []
        logger.log(it, logged, phase=PHASE)
        bar.set_postfix(reward=f"{logged['reward_mean']:.3f}", refresh=False)
      if r.eval_every and it % r.eval_every == 0:
        val = accuracy(state.params, ctx.val.examples, ctx.val.arrays)
        logger.log(it, {f"val_{k}": v for k, v in val.items()}, phase=PHASE)
      save, stop = guard.poll(it)  # step- or time-based save; a stop signal (all hosts agree)
      if it >= r.steps or save:
        ckpt.save(it, state, {"phase": PHASE, "data_position": batches.position,
                              "base_accuracy": base_accuracy, "config": config.to_json(),
                              "metric_lines": logger.lines(PHASE),
                              "metrics_window": window_to_meta(window)}, force=True)
        guard.saved(it)
        faults.at("checkpoint", it)
      if stop and it < r.steps:
        bar.close()
        ckpt.close()  # waits for the write
        logger.flush()
        raise Preempted(PHASE, it)
    bar.close()
    ckpt.wait()
    test = evaluation.evaluate_policy(graphdef, state.params, ctx.decoding, ctx.test,
                                      ctx.eval_options, sample_fn=greedy_fn)
    logger.log(it, {"test_accuracy": test["accuracy"], "test_sample_accuracy":
                    test["sample_accuracy"], "test_diversity": test["diversity"]}, phase=PHASE)
  ckpt.close()

  summary = {
      "rl_steps": it,
      "rl_accuracy": test["accuracy"],
      "rl_step_seconds": run_timer.seconds / run_timer.steps if run_timer.steps else None,
      "rollout_tokens_per_second": (run_timer.tokens / run_timer.rollout_seconds
                                    if run_timer.steps else None),
      "rl_pass_at_k": test["pass_at_k"],
      "rl_sample_accuracy": test["sample_accuracy"],
      "rl_diversity": test["diversity"],
      "rl_wall_seconds": time.time() - wall0,
      # StepRS calibration: the β with w_β(p̄) = 1 at the starting policy's training accuracy.
      "base_train_accuracy": base_accuracy,
      "calibrated_beta": (calibrated_beta(base_accuracy)
                          if base_accuracy is not None and 0 < base_accuracy < 1 else None),
  }
  phase_summary(PHASE, {"steps": it, "test_accuracy": test["accuracy"],
                        "step_ms": 1e3 * (summary["rl_step_seconds"] or 0.0)},
                summary["rl_wall_seconds"])
  return summary
