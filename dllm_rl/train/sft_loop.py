"""SFT phase orchestration: data → jitted step → metrics → eval → checkpoint. No math here."""

from __future__ import annotations

import time

import jax
import numpy as np

from dllm_rl import paths
from dllm_rl.infra.checkpoint import Checkpointer
from dllm_rl.infra.observability import MetricsLogger, phase_summary, progress
from dllm_rl.parallel.distributed import is_primary
from dllm_rl.parallel.shard import init_state_sharded
from dllm_rl.tasks.data import BatchIterator
from dllm_rl.train import evaluation, flops
from dllm_rl.train.context import Context, init_params, to_device
from dllm_rl.train.optim import make_optimizer
from dllm_rl.train.resilience import Preempted, StepGuard, window_to_meta
from dllm_rl.train.sft_step import make_sft_step, step_options
from dllm_rl.train.throughput import StepTimer
from dllm_rl.types import SequenceBatch

PHASE = "sft"


def checkpoint_dir(workdir: str, phase: str) -> str:
  return paths.join(workdir, "checkpoints", phase)


def open_checkpointer(ctx: Context, phase: str) -> Checkpointer:
  c = ctx.config.checkpoint
  return Checkpointer(checkpoint_dir(ctx.workdir, phase), save_every=c.save_every,
                      keep=c.keep, async_save=c.async_save)


def mean_metrics(window: list[dict]) -> dict:
  host = jax.device_get(window)  # float64 means: equal for live and checkpointed windows
  return {k: float(np.mean([float(m[k]) for m in host])) for k in host[0]}


def run_sft(ctx: Context) -> dict:
  """Train with the masked-diffusion SFT loss; resume from ``workdir`` when possible.

  Returns a summary with validation/test greedy accuracy, pass@k, steps and timings.
  """
  config, f = ctx.config, ctx.config.sft
  wall0 = time.time()
  graphdef, params = init_params(ctx)
  optimizer, schedule = make_optimizer(f)
  state, state_sharding = init_state_sharded(
      params, optimizer, jax.random.fold_in(jax.random.key(config.seed), 1), ctx.mesh)
  ckpt = open_checkpointer(ctx, PHASE)
  position, stopped_early, meta = 0, False, {"metric_lines": 0}
  if ckpt.latest_step() is not None:
    state, meta = ckpt.restore(state)
    position, stopped_early = meta["data_position"], meta["stopped_early"]
    print(f"[sft] resumed from step {int(state.step)} (data position {position})", flush=True)

  batches = BatchIterator(ctx.train.arrays, config.data.batch_size, config.seed, position=position)
  step_fn = make_sft_step(graphdef, optimizer, schedule, mask_id=ctx.tokenizer.mask_id,
                          mesh=ctx.mesh, state_sharding=state_sharding, **step_options(config))
  sample_fn, accuracy = evaluation.make_greedy_evaluator(graphdef, ctx.decoding,
                                                         ctx.eval_options)

  step = int(state.step)
  finished = stopped_early or step >= f.steps
  val = meta.get("val", {})  # the latest validation result (summary of a resumed run)
  timed_steps, timed_seconds = 0, 0.0
  window = meta.get("metrics_window", [])  # steps since the last log, saved with the checkpoint
  guard = StepGuard.from_config(PHASE, ckpt, config)
  # Throughput window: from the start of its first step to the sync of the log line (no
  # sync per step); the first step (compilation) is untimed, evaluation and saves paused out.
  timer, first, clock, n_timed = StepTimer.from_config(config, ctx.mesh), True, None, 0
  d = config.data
  step_tokens = d.batch_size * (d.prompt_len + d.completion_len)
  step_flops = flops.sft_step_flops(config, ctx.model_cfg)

  def paused(fn):
    """``fn()`` with the throughput clock stopped (the device work before it counted)."""
    nonlocal clock
    if clock is None:
      return fn()
    jax.block_until_ready(state.step)
    t = time.perf_counter()
    out = fn()
    clock += time.perf_counter() - t
    return out

  with MetricsLogger(ctx.workdir, tensorboard=config.log.tensorboard,
                     enabled=is_primary()) as logger:
    if "metric_lines" in meta:  # drop records of steps about to be redone
      logger.supersede(PHASE, meta["metric_lines"])
    bar = progress(f.steps, desc=PHASE, initial=step,
                   disable=not (config.log.progress and is_primary()))
    while not finished and step < f.steps:
      t0 = time.perf_counter()
      if clock is None and not first:
        clock = t0
      batch = to_device(ctx, next(batches), SequenceBatch)
      state, metrics = step_fn(state, batch, jax.random.fold_in(state.rng, step))
      step += 1
      if first:
        jax.block_until_ready(state.step)  # once: the timed window starts after compilation
      else:
        n_timed += 1
      first = False
      window.append(metrics)
      bar.update(1)
      if step % f.log_every == 0:
        logged = mean_metrics(window)  # blocks on the device: timing below is real
        logged["skipped_steps"] = guard.skipped(state.opt_state, step)
        if n_timed:
          timer.add(time.perf_counter() - clock, steps=n_timed, tokens=n_timed * step_tokens,
                    flops=n_timed * step_flops)
        logged.update(timer.metrics())
        clock, n_timed = None, 0
        window = []
        logger.log(step, logged, phase=PHASE)
        bar.set_postfix(loss=f"{logged['loss']:.3f}", refresh=False)
      if step > 1:  # the first step includes compilation
        timed_steps, timed_seconds = timed_steps + 1, timed_seconds + time.perf_counter() - t0
      if f.eval_every and step % f.eval_every == 0:
        val = paused(lambda: accuracy(state.params, ctx.val.examples, ctx.val.arrays))
        logger.log(step, {f"val_{k}": v for k, v in val.items()}, phase=PHASE)
        stopped_early = 0 < f.target_accuracy <= val["accuracy"]
      finished = stopped_early or step >= f.steps
      save, stop = guard.poll(step)  # step- or time-based save; a stop signal (all hosts agree)
      if finished or save:
        guard.skipped(state.opt_state, step)  # never save after a non-finite run
        paused(lambda: ckpt.save(
            step, state, {"phase": PHASE, "data_position": batches.position,
                          "stopped_early": bool(stopped_early),
                          "config": config.to_json(), "metric_lines": logger.lines(PHASE),
                          "metrics_window": window_to_meta(window),
                          "val": {k: float(v) for k, v in val.items()}}, force=True))
        guard.saved(step)
      if stop and not finished:
        bar.close()
        ckpt.close()  # waits for the write
        logger.flush()
        raise Preempted(PHASE, step)
    bar.close()
    ckpt.wait()
    report = evaluation.evaluate_policy(graphdef, state.params, ctx.decoding, ctx.test,
                                        ctx.eval_options, sample_fn=sample_fn)
    logger.log(step, {"test_accuracy": report["accuracy"], "test_sample_accuracy":
                      report["sample_accuracy"], "test_diversity": report["diversity"]},
               phase=PHASE)
  ckpt.close()

  n_tokens = len(ctx.test.examples) * ctx.sampler_cfg.completion_len
  summary = {
      "sft_steps": step,
      "sft_val_accuracy": val.get("accuracy"),
      "sft_accuracy": report["accuracy"],
      "sft_pass_at_k": report["pass_at_k"],
      "sft_sample_accuracy": report["sample_accuracy"],
      "sft_diversity": report["diversity"],
      "sft_step_seconds": timed_seconds / timed_steps if timed_steps else None,
      "eval_tokens_per_second": n_tokens / report["greedy_seconds"],
      "sft_wall_seconds": time.time() - wall0,
  }
  phase_summary(PHASE, {"step": step, "test_accuracy": report["accuracy"],
                        "step_ms": 1e3 * (summary["sft_step_seconds"] or 0.0)},
                summary["sft_wall_seconds"])
  return summary
