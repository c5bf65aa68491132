"""SFT phase: batches → jitted sft step; early stop at the target validation accuracy.
The loop (checkpoints, metrics, evaluation, preemption) is dllm_rl.train.phases. No math here."""

from __future__ import annotations

import sys

import jax

from dllm_rl.config.schema import base_config
from dllm_rl.models import transformer
from dllm_rl.parallel.distributed import is_primary
from dllm_rl.parallel.shard import abstract_state_sharded, init_state_sharded
from dllm_rl.tasks.data import BatchIterator
from dllm_rl.train import flops
from dllm_rl.train.context import Context, init_params, to_device
from dllm_rl.train.optim import make_optimizer
from dllm_rl.train.phases import Phase, PhaseRun, StepCost, run_phase
from dllm_rl.train.sft_step import ESTIMATOR_KEYS, make_sft_step, step_options
from dllm_rl.types import SequenceBatch

PHASE = "sft"


class SFTPhase(Phase):
  """Masked-diffusion SFT on the training set; stops early once the validation accuracy
  reaches ``sft.target_accuracy`` (> 0)."""

  name = PHASE
  postfix = (("loss", "loss"), ("val_acc", "val_accuracy"), ("gnorm", "grad_norm"),
             ("tok/s", "tokens_per_second"))
  panels = ("loss", "val_accuracy", "grad_norm", "lr", "tokens_per_second")
  # RL's settings come after the SFT phase; of the estimator's, SFT reads attention_impl only
  unrelated_keys = ("mode", "rl", *(f"estimator.{key}" for key in base_config().estimator
                                    if key not in ESTIMATOR_KEYS))

  def __init__(self, ctx: Context):
    super().__init__(ctx)
    f = ctx.config.sft
    self.steps, self.log_every, self.eval_every = f.steps, f.log_every, f.eval_every
    self.target_accuracy = f.target_accuracy
    self.graphdef = transformer.abstract_model(ctx.model_cfg)[0]
    self.optimizer, self.schedule = make_optimizer(f, lora_only=ctx.model_cfg.lora_rank > 0)
    self.val = {}  # the latest validation result (summary of a resumed run)
    d = ctx.config.data
    self.cost = StepCost(tokens=d.batch_size * (d.prompt_len + d.completion_len),
                         flops=flops.sft_step_flops(ctx.config, ctx.model_cfg))

  def _rng(self) -> jax.Array:
    return jax.random.fold_in(jax.random.key(self.ctx.config.seed), 1)

  def init_state(self):
    ctx = self.ctx
    state, self.state_sharding = init_state_sharded(init_params(ctx)[1], self.optimizer,
                                                    self._rng(), ctx.mesh)
    return state

  def abstract_state(self):
    """Full fine-tuning: the restore template from shapes alone (a resume neither loads the
    HF weights nor initialises a model). LoRA needs the frozen base: None."""
    ctx = self.ctx
    if ctx.model_cfg.lora_rank:
      return None
    params = transformer.abstract_params_sharded(ctx.model_cfg, ctx.mesh)[1]
    state, self.state_sharding = abstract_state_sharded(params, self.optimizer, self._rng(),
                                                        ctx.mesh)
    return state

  def start(self, state, meta: dict, resumed: bool) -> int:
    ctx, config = self.ctx, self.ctx.config
    position = meta.get("data_position", 0)
    self.stopped = bool(meta.get("stopped_early", False))
    self.val = meta.get("val", {})
    if resumed:
      print(f"[sft] resumed from step {int(state.step)} (data position {position})", flush=True)
    self.batches = BatchIterator(ctx.train.arrays, config.data.batch_size, config.seed,
                                 position=position)
    self.step_fn = make_sft_step(self.graphdef, self.optimizer, self.schedule,
                                 mask_id=ctx.tokenizer.mask_id, mesh=ctx.mesh,
                                 state_sharding=self.state_sharding, **step_options(config))
    self.build_evaluators()
    return int(state.step)

  def step(self, state, step: int):
    batch = to_device(self.ctx, next(self.batches), SequenceBatch)
    state, metrics = self.step_fn(state, batch, jax.random.fold_in(state.rng, step))
    return state, metrics, self.cost

  def evaluated(self, val: dict) -> None:
    self.val = val
    self.stopped = 0 < self.target_accuracy <= val["accuracy"]

  def meta(self) -> dict:
    return {"data_position": self.batches.position, "stopped_early": bool(self.stopped),
            "val": {k: float(v) for k, v in self.val.items()}}

  def summary(self, run: PhaseRun) -> tuple[dict, dict]:
    report, ctx = run.report, self.ctx
    n_tokens = len(ctx.test.examples) * ctx.sampler_cfg.completion_len
    summary = {
        "sft_steps": run.step,
        "sft_val_accuracy": self.val.get("accuracy"),
        "sft_accuracy": report["accuracy"],
        "sft_pass_at_k": report["pass_at_k"],
        "sft_sample_accuracy": report["sample_accuracy"],
        "sft_diversity": report["diversity"],
        "sft_step_seconds": run.timer.run_step_seconds(),
        "eval_tokens_per_second": n_tokens / report["greedy_seconds"],
        "sft_wall_seconds": run.wall_seconds,
    }
    console = {"step": run.step, "test_accuracy": report["accuracy"],
               "step_ms": None if summary["sft_step_seconds"] is None
               else 1e3 * summary["sft_step_seconds"]}
    return summary, console


def below_target(summary: dict, target: float) -> str | None:
  """The warning for a warm-up that ended below ``sft.target_accuracy`` (> 0) at its last
  validation, i.e. ran out of ``sft.steps`` before the early stop; None when it reached the
  target, no target is set, or no validation ran (dllm_rl.config.unread says so)."""
  val = summary.get("sft_val_accuracy")
  if not 0 < target or val is None or val >= target:
    return None
  return (f"[sft] warning: the warm-up ended below sft.target_accuracy = {target:g}:"
          f" validation accuracy {val:.3f} at its last evaluation, after"
          f" {summary.get('sft_steps')} steps (sft.steps). RL from a start that rarely answers"
          " correctly sees almost no reward; raise sft.steps or sft.lr, or try another seed.")


def run_sft(ctx: Context) -> dict:
  """Train with the masked-diffusion SFT loss; resume from ``workdir`` when possible.

  Returns a summary with validation/test greedy accuracy, pass@k, steps and timings. A
  warm-up that ended below its target is said on stderr (:func:`below_target`), also when
  its summary is read back from a finished phase.
  """
  summary = run_phase(SFTPhase, ctx)
  warning = below_target(summary, ctx.config.sft.target_accuracy)
  if warning and is_primary():
    print(warning, file=sys.stderr, flush=True)
  return summary
