"""RL phase: rollout → reward → rl_step (advantages, updates); the StepRS calibrated β of
the starting policy. The loop (checkpoints, metrics, evaluation, preemption) is
dllm_rl.train.phases. No math here: advantages, ratios and losses live in dllm_rl.rl."""

from __future__ import annotations

import dataclasses
import sys
import time
import types

import jax
import numpy as np

from dllm_rl.diffusion.estimators import EstimatorConfig
from dllm_rl.errors import ConfigError
from dllm_rl.infra import faults
from dllm_rl.infra.plots import Panel
from dllm_rl.models import transformer
from dllm_rl.parallel.shard import (
  abstract_state_sharded,
  init_state_sharded,
  put_global,
  put_replicated,
)
from dllm_rl.rl.advantages import AdvantageConfig, calibrated_beta
from dllm_rl.rl.losses import LossConfig
from dllm_rl.rl.step import RLStepConfig, RolloutBatch, StepHyper, make_rl_step
from dllm_rl.tasks.data import BatchIterator, trim_to_bucket
from dllm_rl.train import evaluation, flops, layout_errors, run_checkpoints
from dllm_rl.train.context import Context, frozen_base, init_params
from dllm_rl.train.optim import make_optimizer
from dllm_rl.train.phases import (
  Phase,
  PhaseRun,
  StepCost,
  checkpoint_dir,
  run_phase,
)
from dllm_rl.train.router_stats import router_metrics
from dllm_rl.train.sft_loop import PHASE as SFT

PHASE = "rl"


def rl_optimizer(r, *, lora_only: bool = False):
  """AdamW for RL; the schedule runs over steps × inner_steps optimizer updates
  (``lora_only``: the LoRA adapters alone, ``optim.adapters_only``)."""
  section = types.SimpleNamespace(lr=r.lr, steps=r.steps * r.inner_steps,
                                  warmup_steps=r.warmup_steps, schedule=r.schedule,
                                  min_lr_ratio=r.min_lr_ratio, b1=r.b1,
                                  b2=r.b2, weight_decay=r.weight_decay, grad_clip=r.grad_clip)
  return make_optimizer(section, lora_only=lora_only)


def step_config(config, sampler_cfg, mask_id: int, eos_id: int) -> RLStepConfig:
  """The static RL-step options of a run: its config, its sampler (StepRS states) and the
  tokenizer's mask / EOS ids."""
  r, x = config.rl, config.estimator
  return RLStepConfig(
      loss=r.loss, advantage=r.advantage, estimator=x.name,
      estimator_cfg=EstimatorConfig.from_config(
          x, block_size=config.model.block_size,
          prompt_block_causal=config.model.prompt_block_causal,
          logits_chunk=config.model.logits_chunk, num_states=sampler_cfg.max_steps),
      loss_cfg=LossConfig(clip=r.clip, clip_C=r.clip_C, eps=r.eps, spg_omega=x.spg_omega,
                          self_normalize=r.self_normalize),
      advantage_cfg=AdvantageConfig(beta=r.beta, beta_start=r.beta_start, beta_end=r.beta_end,
                                    beta_schedule=r.beta_schedule,
                                    control_per_state=r.control_per_state,
                                    num_states=sampler_cfg.max_steps),
      inner_steps=r.inner_steps, num_states=sampler_cfg.max_steps,
      dynamic_states=sampler_cfg.threshold > 0, kl_coef=r.kl_coef,
      kl_estimator=r.kl_estimator, kl_level=r.kl_level, ref_sync_every=r.ref_sync_every,
      ref_sync_alpha=r.ref_sync_alpha, mask_id=mask_id, eos_id=eos_id,
      micro_batch=r.micro_batch)


def rl_rng(ctx: Context) -> jax.Array:
  """The fresh RL state's RNG key (from ``seed``)."""
  return jax.random.fold_in(jax.random.key(ctx.config.seed), 2)


def step_keys(rng: jax.Array, step: int) -> tuple[jax.Array, jax.Array]:
  """(rollout key, rl_step key) of RL step ``step`` from the state's RNG ``rng``."""
  return tuple(jax.random.split(jax.random.fold_in(rng, step)))


def rl_state(ctx: Context, params, optimizer, *, abstract: bool = False):
  """(the fresh RL train state from ``params``, its shardings): the optimizer's initial
  state, the run's RNG (:func:`rl_rng`) and, with ``rl.kl_coef`` > 0, ``params`` as the
  reference policy. ``abstract``: shapes, dtypes and shardings only (``jax.ShapeDtypeStruct``
  leaves)."""
  init = abstract_state_sharded if abstract else init_state_sharded
  return init(params, optimizer, rl_rng(ctx), ctx.mesh,
              ref_params=params if ctx.config.rl.kl_coef > 0 else None)


def rollout_prompts(ctx: Context, position: int = 0) -> BatchIterator:
  """The RL phase's prompt batches (``rl.batch_prompts`` training prompts, shuffled with
  ``seed + 1``) from batch ``position`` on."""
  prompts = {"prompt_BP": ctx.train.arrays["prompt_BP"],
             "prompt_valid_BP": ctx.train.arrays["prompt_valid_BP"],
             "index": np.arange(len(ctx.train.examples))}
  return BatchIterator(prompts, ctx.config.rl.batch_prompts, ctx.config.seed + 1,
                       position=position)


def rollout_sampler(ctx: Context, graphdef):
  """(sampler config, jitted group sampler) of the rollouts: the run's sampler at
  ``rl.temperature``, ``rl.group_size`` completions per prompt."""
  r = ctx.config.rl
  cfg = dataclasses.replace(ctx.sampler_cfg, temperature=float(r.temperature))
  return cfg, evaluation.make_sample_fn(graphdef, cfg, mask_id=ctx.tokenizer.mask_id,
                                        eos_id=ctx.tokenizer.eos_id, mesh=ctx.mesh,
                                        group_size=r.group_size)


def update_step(ctx: Context, graphdef, optimizer, schedule, state_sharding):
  """The jitted rl_step of the run (dllm_rl.rl.step.make_rl_step)."""
  cfg = step_config(ctx.config, ctx.sampler_cfg, ctx.tokenizer.mask_id, ctx.tokenizer.eos_id)
  return make_rl_step(graphdef, optimizer, schedule, cfg, mesh=ctx.mesh,
                      state_sharding=state_sharding)


def step_hyper(ctx: Context) -> StepHyper:
  """The rl_step's traced hyperparameters, replicated on the mesh: ``rl.lr`` and the
  advantages' ``rl.beta``, ``rl.beta_start`` and ``rl.beta_end``, so runs that differ only in
  them (the study's lr grid, StepRS's β schedules) share the compiled step."""
  r = ctx.config.rl
  return put_replicated(ctx.mesh, StepHyper.of(r.lr, r))


def rollout_batch(ctx: Context, batch: dict, completions, unmask_steps, rewards,
                  correct) -> RolloutBatch:
  """The rl_step's input: a prompt batch, its rollouts and their rewards (host arrays) as
  global arrays sharded over the batch axes."""
  return put_global(ctx.mesh, RolloutBatch(
      prompt_BP=batch["prompt_BP"], prompt_valid_BP=batch["prompt_valid_BP"],
      completion_BGL=completions, unmask_step_BGL=unmask_steps, rewards_BG=rewards,
      correct_BG=correct))


def _step_flops(config, ctx: Context, rollout_cfg, out, prompt_len: int) -> float:
  """Model FLOPs of one RL iteration (dllm_rl.train.flops): the rollout, at the blocks and
  steps the sampler ran (max over the groups), and the rl_step."""
  blocks, steps = int(np.max(np.asarray(out.num_blocks))), float(np.max(np.asarray(out.num_steps)))
  r = config.rl
  return (flops.sampler_flops(ctx.model_cfg, rollout_cfg, r.batch_prompts * r.group_size,
                              prompt_len, blocks=blocks, steps=steps)
          + flops.rl_step_flops(config, ctx.model_cfg, prompt_len=prompt_len))


def sft_steps(ctx: Context) -> list[int]:
  """The SFT checkpoint steps RL can start from (no array read); none and no
  ``model.hf_checkpoint``: a ConfigError naming that key (``sft.steps`` in a pipeline, whose
  SFT phase trained none: it calls this before its SFT phase when ``sft.steps`` is 0)."""
  steps = run_checkpoints.available_steps(ctx.workdir, SFT)
  if not (steps or ctx.hf_checkpoint) and ctx.config.mode == "pipeline":  # sft.steps = 0
    raise ConfigError(
        "sft.steps", f"{ctx.config.sft.steps} in mode=pipeline trains no SFT checkpoint, and"
        f" RL starts from one or from an HF model: there is no SFT checkpoint under"
        f" {checkpoint_dir(ctx.workdir, SFT)} and no model.hf_checkpoint (set sft.steps > 0,"
        " or model.hf_checkpoint to start RL from its weights)")
  if not (steps or ctx.hf_checkpoint):
    raise ConfigError(
        "model.hf_checkpoint", f"RL starts from an SFT checkpoint or an HF model: no SFT"
        f" checkpoint under {checkpoint_dir(ctx.workdir, SFT)} and no model.hf_checkpoint"
        " (set it, run mode 'sft' with this --workdir first, or use mode 'pipeline')")
  return steps


def load_sft_params(ctx: Context):
  """The RL starting policy: the newest SFT checkpoint in the workdir (its parameters alone,
  read straight onto their shardings: not the optimizer state, which RL starts afresh; a
  damaged newest step falls back to the one before, as a restore does), else the HF
  checkpoint of ``model.hf_checkpoint``; neither: a ConfigError naming that key (before the
  model is built)."""
  steps = sft_steps(ctx)
  if not steps:
    return (*init_params(ctx), None)
  ref = run_checkpoints.CheckpointRef(ctx.workdir, SFT, steps[-1])
  ref, params = run_checkpoints.restore_params(ref, ctx.model_cfg, ctx.mesh,
                                               base=lambda: frozen_base(ctx), fall_back=True,
                                               config=ctx.config)
  meta = run_checkpoints.meta_for_notes(ref)
  where = f"{ref.directory}/{ref.step}"
  for line in attention_changes(meta, ctx.config, where) + adapter_changes(meta, ctx.config,
                                                                           where):
    print(f"[rl] warning: {line}", file=sys.stderr, flush=True)
  return transformer.abstract_model(ctx.model_cfg)[0], params, ref.step


# How the model attends: the same weights under another mask are another policy (an SFT
# model trained bidirectionally, then RL as a block-diffusion model).
ATTENTION_KEYS = ("model.block_size", "model.prompt_block_causal")


def attention_changes(meta: dict, config, where: str) -> list[str]:
  """One line when the SFT checkpoint ``where`` (its ``meta``) was trained with other
  :data:`ATTENTION_KEYS` than ``config``'s RL: RL starts from weights trained under another
  attention mask. [] when they agree or the meta holds no config."""
  return layout_errors.trained_with_other(
      meta, config, ATTENTION_KEYS, f"RL starts from {where}, trained with another attention",
      "SFT run's", "train the policy it learned")


# A LoRA RL phase continues its SFT's adapters: another scale, another set of targets (the
# adapters of a target left out are dropped) or another stored base is another policy.
ADAPTER_KEYS = ("lora.alpha", "lora.targets", "lora.base_dtype")


def adapter_changes(meta: dict, config, where: str) -> list[str]:
  """One line when the LoRA SFT checkpoint ``where`` (its ``meta``) was trained with other
  :data:`ADAPTER_KEYS` than ``config``'s LoRA RL: RL would not start from the policy SFT
  learned (and evaluated). [] without LoRA, when they agree or the meta holds no config."""
  if not config.lora.rank:
    return []
  return layout_errors.trained_with_other(
      meta, config, ADAPTER_KEYS, f"RL starts from {where}, whose LoRA adapters were trained"
      " with other settings", "SFT run's", "start from the policy it learned")


def fresh_sft_start(ctx: Context, sft: list[int]) -> int | None:
  """The SFT step a fresh RL start would read now (:func:`load_sft_params`): the newest of
  ``sft`` whose parameters can be read, the damaged ones passed with a warning; None when
  none can. Reads the parameters, so only asked when a resume's start differs from
  ``sft[-1]``."""
  ref = run_checkpoints.CheckpointRef(ctx.workdir, SFT, sft[-1])
  try:
    ref, _ = run_checkpoints.read_params(ref, ctx.model_cfg, ctx.mesh, fall_back=True)
  except Exception:  # noqa: BLE001 (nothing readable, another layout: not this start)
    return None
  return ref.step


def check_rl_start_before_sft(ctx: Context) -> None:
  """A pipeline's :func:`check_rl_start` before its SFT phase runs, where RL checkpoints exist
  and SFT would train past its newest checkpoint (to ``sft.steps`` > 0: the newest step, or the
  one before a damaged newest, is below it and did not stop early): RL would refuse to resume
  once SFT had trained, so the ConfigError comes now, before SFT's minutes. A pipeline whose
  SFT has nothing left to train is checked later, by RL itself, as before."""
  if not run_checkpoints.available_steps(ctx.workdir, PHASE):
    return
  sft, target = run_checkpoints.available_steps(ctx.workdir, SFT), ctx.config.sft.steps
  if not target:  # sft.steps = 0: SFT trains nothing (RL starts from what is there)
    return
  if sft:
    ref = run_checkpoints.CheckpointRef(ctx.workdir, SFT, sft[-1])
    try:  # the step SFT's restore reads: a damaged newest one falls back
      ref, meta = run_checkpoints.read_readable(ref, lambda ckpt, s: ckpt.meta(s),
                                                fall_back=True)
    except Exception:  # noqa: BLE001 (nothing readable: SFT's restore says so)
      return
    if ref.step >= target or meta.get("stopped_early"):
      return
  check_rl_start(ctx, [*sft, target], planned=True)


def check_rl_start(ctx: Context, sft: list[int], *, planned: bool = False) -> None:
  """RL checkpoints to resume must continue from the newest SFT checkpoint ``sft[-1]``
  (none: the HF model or a fresh init): RL's meta names the SFT step it started from
  (``sft_start``). SFT trained further since (a rerun with a larger ``sft.steps``) would
  resume a policy that does not descend from it and set its RL gain against the new SFT
  figures: a ConfigError naming ``--workdir``, read from the meta alone (no array). An RL
  run that started from an older step because the newer ones were damaged (``sft_skipped``
  in its meta) resumes while they still are (:func:`fresh_sft_start` reads them to tell, only
  then). RL checkpoints from before the pointer was saved, or whose meta cannot be read, are
  not checked. ``planned``: ``sft[-1]`` is the step SFT is about to train to
  (:func:`check_rl_start_before_sft`), said so."""
  steps = run_checkpoints.available_steps(ctx.workdir, PHASE)
  if not steps:
    return
  ref = run_checkpoints.CheckpointRef(ctx.workdir, PHASE, steps[-1])
  try:  # the step a resume reads: a damaged newest one falls back
    ref, meta = run_checkpoints.read_readable(ref, lambda ckpt, s: ckpt.meta(s), fall_back=True)
  except Exception:  # noqa: BLE001 (nothing readable: the restore says so)
    return
  if "sft_start" not in meta:
    return
  started, newest = meta["sft_start"], (sft[-1] if sft else None)
  newer = [s for s in sft if started is not None and s > started]
  if (started in sft and newer and set(newer) <= set(meta.get("sft_skipped", ()))
          and fresh_sft_start(ctx, sft) == started):
    return  # RL fell back past damaged SFT steps that are still damaged: a start reads it too
  if started != newest:
    what = lambda s: "the HF model / a fresh init" if s is None else f"SFT step {s}"
    directory = ref.directory
    raise ConfigError(
        "--workdir", f"{directory} (step {ref.step}) continues RL from {what(started)}, but"
        f" RL would now start from {what(newest)}"
        + (f" (SFT would first train on to sft.steps = {newest})" if planned
           else " (SFT trained further or was replaced)") + ":"
        " resuming would train on a policy that does not descend from it. Use a new"
        f" --workdir, or delete {directory} to start RL afresh from {what(newest)}")


class RLPhase(Phase):
  """RL from the SFT policy: one rollout batch per step, then the rl_step's inner updates."""

  name = PHASE
  postfix = (("reward", "reward_mean"), ("acc", "accuracy"), ("gnorm", "grad_norm"),
             ("tok/s", "tokens_per_second"))
  # Ratio statistics on a log axis: ρ̂ spans 1 to 1e12 when the likelihood estimates are noisy.
  panels = ("reward_mean", Panel(("accuracy", "val_accuracy", "malformed_fraction")),
            Panel(("grad_norm", "grad_norm_max")), Panel(("ratio_mean", "ratio_max"), log=True),
            Panel(("abs_log_ratio_p50", "abs_log_ratio_p90", "abs_log_ratio_p99",
                   "abs_log_ratio_max"), log=True),
            "bypass_fraction", "tokens_per_second")
  sync_every_step = True  # the rollout's completions are read on the host every step
  rollout_timing = True
  eval_at_start = True
  profile = True

  def __init__(self, ctx: Context):
    super().__init__(ctx)
    r = ctx.config.rl
    self.steps, self.log_every, self.eval_every = r.steps, r.log_every, r.eval_every
    check_rl_start(ctx, sft_steps(ctx))  # a start to read, said before anything is read or built
    self.sft_start = None  # the SFT step RL started from (None: the HF model / a fresh init)
    self.sft_skipped: list[int] = []  # newer SFT steps passed over as damaged at the start
    self.graphdef = transformer.abstract_model(ctx.model_cfg)[0]
    self.optimizer, self.schedule = rl_optimizer(r, lora_only=ctx.model_cfg.lora_rank > 0)
    self.base_accuracy = None  # the starting policy's training accuracy: its first rollouts
    # (examples, batch, completions_BGL, correct_BG, rewards_BG) of the last step
    self.last_rollout = None
    self.rollout_tokens = r.batch_prompts * r.group_size * ctx.sampler_cfg.completion_len
    self.widths: frozenset[int] = frozenset()  # prompt widths this process has compiled
    mc = ctx.model_cfg  # MoE layers: router load statistics every log_every steps
    self.moe_layers = tuple(i for i in range(mc.n_layers) if mc.is_moe_layer(i))

  def init_state(self):
    _, params, self.sft_start = load_sft_params(self.ctx)
    self.sft_skipped = [s for s in run_checkpoints.available_steps(self.ctx.workdir, SFT)
                        if self.sft_start is not None and s > self.sft_start]
    state, self.state_sharding = rl_state(self.ctx, params, self.optimizer)
    return state

  def abstract_state(self):
    """Full fine-tuning without a KL term: the restore template from shapes alone (a resume
    reads no starting policy). LoRA needs the base, a KL term its reference: None."""
    ctx = self.ctx
    if ctx.model_cfg.lora_rank or ctx.config.rl.kl_coef > 0:
      return None
    params = transformer.abstract_params_sharded(ctx.model_cfg, ctx.mesh)[1]
    state, self.state_sharding = rl_state(ctx, params, self.optimizer, abstract=True)
    return state

  def start(self, state, meta: dict, resumed: bool) -> int:
    ctx = self.ctx
    position = meta.get("data_position", 0)
    self.base_accuracy = meta.get("base_accuracy")
    if resumed:  # the run's own start, not the template's (a resume with LoRA or KL reads it)
      self.sft_start = meta.get("sft_start", self.sft_start)
      self.sft_skipped = meta.get("sft_skipped", self.sft_skipped)
    if resumed:
      print(f"[rl] resumed at rollout batch {position}", flush=True)
    self.batches = rollout_prompts(ctx, position)
    self.rollout_cfg, self.rollout_fn = rollout_sampler(ctx, self.graphdef)
    self.step_fn = update_step(ctx, self.graphdef, self.optimizer, self.schedule,
                               self.state_sharding)
    self.hyper = step_hyper(ctx)
    self.build_evaluators()
    return self.batches.position

  def step(self, state, step: int):
    ctx, config = self.ctx, self.ctx.config
    t0 = time.perf_counter()
    batch, padding = trim_to_bucket(next(self.batches), config.data.prompt_buckets)
    k_roll, k_step = step_keys(state.rng, step)
    out = self.rollout_fn(state.params, batch["prompt_BP"], batch["prompt_valid_BP"], k_roll)
    faults.at("rollout", step)  # test-only hook (DLLM_FAULT), a no-op otherwise
    completions = np.asarray(out.completion_BL)
    t_roll = time.perf_counter() - t0
    examples = [ctx.train.examples[i] for i in batch["index"]]
    graded = evaluation.verify_groups(ctx.task, ctx.tokenizer, examples, completions)
    rewards = np.where(graded.malformed_BG, np.float32(config.rl.malformed_reward),
                       graded.rewards_BG)  # rl.malformed_reward: 0, the verifiers' own, by default
    rewards, correct = faults.at("reward", step, rewards), graded.correct_BG
    rollout = rollout_batch(ctx, batch, completions, np.asarray(out.unmask_step_BL), rewards,
                            correct)
    if self.base_accuracy is None:
      self.base_accuracy = float(np.mean(correct))
    self.last_rollout = (examples, batch, completions, correct, rewards)  # samples(): host arrays
    # before the update: the policy that rolled out
    if self.moe_layers and step % self.log_every == 0:
      m = config.model
      routing = router_metrics(self.graphdef, state.params, rollout.prompt_BP,
                               rollout.prompt_valid_BP, rollout.completion_BGL,
                               moe_layers=self.moe_layers, block_size=m.block_size,
                               prompt_block_causal=m.prompt_block_causal)
    state, metrics = self.step_fn(state, rollout, k_step, self.hyper)
    # Malformed rollouts score as wrong answers do (rl.malformed_reward 0); a batch of nothing
    # else gives every group equal rewards, so no gradient: the collapse this fraction foretells.
    metrics = dict(metrics, prompt_padding_fraction=padding,
                   malformed_fraction=float(graded.malformed_BG.mean()))
    if self.moe_layers and step % self.log_every == 0:
      metrics.update(routing)
    faults.at("update", step)
    width = batch["prompt_BP"].shape[1]  # a new data.prompt_buckets width compiles: untimed
    compiles, self.widths = width not in self.widths, self.widths | {width}
    cost = StepCost(tokens=self.rollout_tokens, rollout_seconds=t_roll, compiles=compiles,
                    flops=_step_flops(config, ctx, self.rollout_cfg, out, width))
    return state, metrics, cost

  def samples(self, state, step: int) -> list[dict]:
    """The first completion of each of the first ``log.num_samples`` prompts of the rollout
    batch of step ``step`` (already sampled and verified: no extra sampling)."""
    ctx = self.ctx
    examples, batch, completions, correct, rewards = self.last_rollout
    n = ctx.config.log.num_samples
    split = evaluation.Split(examples[:n], {k: batch[k][:n]
                                            for k in ("prompt_BP", "prompt_valid_BP")})
    return evaluation.rollout_records(ctx.task, ctx.tokenizer, split, completions[:n],
                                      correct[:n], batch["index"][:n], rewards[:n])

  def meta(self) -> dict:
    return {"data_position": self.batches.position, "base_accuracy": self.base_accuracy,
            "sft_start": self.sft_start, "sft_skipped": self.sft_skipped}

  def saved(self, step: int) -> None:
    faults.at("checkpoint", step)

  def summary(self, run: PhaseRun) -> tuple[dict, dict]:
    test, base = run.report, self.base_accuracy
    summary = {
        "rl_steps": run.step,
        "rl_sft_start": self.sft_start,  # the SFT step RL started from (None: no SFT start)
        "rl_accuracy": test["accuracy"],
        "rl_step_seconds": run.timer.run_step_seconds(),
        "rollout_tokens_per_second": run.timer.run_rollout_tokens_per_second(),
        "rl_pass_at_k": test["pass_at_k"],
        "rl_sample_accuracy": test["sample_accuracy"],
        "rl_diversity": test["diversity"],
        "rl_distinct_correct": test["distinct_correct"],
        "rl_malformed_fraction": test["malformed_fraction"],
        "rl_wall_seconds": run.wall_seconds,
        # StepRS calibration: the β with w_β(p̄) = 1 at the starting policy's training accuracy
        # (for 0/1 rewards; rewards a / a + s need β / s: advantages.calibrated_beta).
        "base_train_accuracy": base,
        "calibrated_beta": calibrated_beta(base) if base is not None and 0 < base < 1 else None,
    }
    console = {"steps": run.step, "test_accuracy": test["accuracy"],
               "step_ms": None if summary["rl_step_seconds"] is None
               else 1e3 * summary["rl_step_seconds"]}
    return summary, console


def run_rl(ctx: Context) -> dict:
  """RL from the SFT policy; resumes from ``workdir/checkpoints/rl`` when present."""
  return run_phase(RLPhase, ctx)
