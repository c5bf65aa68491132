"""One phase runner for SFT and RL: restore → steps → save / preempt / evaluate / log → test
→ summary. No math here; what differs between the phases is a :class:`Phase`.

:func:`run_phase` owns, for every phase:

* restore: the newest checkpoint of ``workdir/checkpoints/<phase>`` (else a fresh state), and
  the metrics lines of steps about to be redone are superseded (``MetricsLogger.supersede``);
* the step loop, a progress bar and one :class:`StepTimer` (the log lines' throughput and the
  summary's step time; the first step a process runs compiles and is not timed);
* after each step, :meth:`StepGuard.poll`: a step- or time-based save, or a stop request;
  a save carries the phase's meta, the metrics line count and the window of steps not yet
  logged (a resumed run logs what an uninterrupted one does); a stop saves, then raises
  :class:`Preempted`;
* periodic evaluation (``val_*`` lines), a metrics line every ``log_every`` steps (the mean
  of the window, ``skipped_steps``, throughput; the progress bar's fields: ``Phase.postfix``)
  and one at the phase's last step (its end or an early stop) for the steps since the last,
  sample completions every ``log.samples_every`` steps (:meth:`Phase.samples` →
  ``samples.jsonl``), the final save, the test evaluation, the curves
  (``workdir/<phase>_curves.png`` of ``Phase.panels``) and the one-line console summary;
* the summary's record (``workdir/<phase>_summary.json``, :mod:`dllm_rl.train.phase_record`):
  a rerun finds the phase finished and returns it without building, restoring or evaluating.

Timing (:class:`_StepClock`). A phase whose step waits for the device anyway
(``sync_every_step``: RL reads its rollouts) is timed per step, up to that wait, but for the
steps that compile (``StepCost.compiles``: a new prompt bucket's first batch). Otherwise
(SFT) there is no sync per step: a window runs from the start of its first step to the sync
of the next log line, with evaluation and checkpoint saves paused out.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import jax
import numpy as np

from dllm_rl import paths
from dllm_rl.infra.checkpoint import Checkpointer
from dllm_rl.infra.observability import MetricsLogger, phase_summary, postfix, progress
from dllm_rl.infra.plots import Panel, plot_metrics
from dllm_rl.parallel.distributed import is_primary, sync
from dllm_rl.train import evaluation, layout_errors, phase_record
from dllm_rl.train.context import Context
from dllm_rl.train.lora_checkpoint import base_pointer, restore_checkpoint, saved_state
from dllm_rl.train.resilience import Preempted, StepGuard, window_to_meta
from dllm_rl.train.throughput import ProfileWindow, StepTimer

# (logged key, key of the test report)
TEST_METRICS = (("test_accuracy", "accuracy"), ("test_sample_accuracy", "sample_accuracy"),
                ("test_diversity", "diversity"), ("test_distinct_correct", "distinct_correct"),
                ("test_malformed_fraction", "malformed_fraction"))


def checkpoint_dir(workdir: str, phase: str) -> str:
  """The checkpoints of ``phase`` in ``workdir``."""
  return paths.join(workdir, "checkpoints", phase)


def available_steps(workdir: str, phase: str) -> list[int]:
  """The committed checkpoint steps of ``phase`` in ``workdir``, ascending ([] if none), read
  without creating its folder."""
  directory = checkpoint_dir(workdir, phase)
  if not paths.resolve(directory).is_dir():
    return []
  with Checkpointer(directory, read_only=True) as ckpt:
    return ckpt.all_steps()


def open_checkpointer(ctx: Context, phase: str) -> Checkpointer:
  """The checkpointer of ``phase`` (``checkpoint.keep`` / ``async_save`` of the config)."""
  c = ctx.config.checkpoint
  return Checkpointer(checkpoint_dir(ctx.workdir, phase), keep=c.keep, async_save=c.async_save)


def mean_metrics(window: list[dict]) -> dict:
  """Per-key mean of the metrics of the steps in ``window`` (blocks on the device)."""
  host = jax.device_get(window)  # float64 means: equal for live and checkpointed windows
  keys = dict.fromkeys(k for m in host for k in m)  # some keys only on log steps (router stats)
  return {k: float(np.mean([float(m[k]) for m in host if k in m])) for k in keys}


@dataclasses.dataclass(frozen=True)
class StepCost:
  """What one step did, for the throughput metrics."""

  tokens: float
  flops: float
  rollout_seconds: float = 0.0
  # the step compiled a program (RL: the first batch of a data.prompt_buckets width): not
  # timed, as a process's first step is not (per-step timing, ``sync_every_step``, only)
  compiles: bool = False


@dataclasses.dataclass
class PhaseRun:
  """The end of a phase, for :meth:`Phase.summary`."""

  state: Any
  step: int
  report: dict  # the test evaluation (evaluation.evaluate_policy)
  timer: StepTimer  # run_* totals: the timed steps of the run
  wall_seconds: float  # the phase's, earlier processes' time up to the restored step included


class Phase:
  """The phase-specific parts of :func:`run_phase`; SFT and RL subclass it."""

  name: str  # "sft" / "rl": checkpoint folder, metrics phase, console prefix
  graphdef: Any  # the policy's model graph (set by the subclass)
  steps: int
  log_every: int
  eval_every: int  # 0 = no periodic evaluation
  postfix: tuple[tuple[str, str], ...]  # (progress-bar label, metric key) after each log line
  panels: tuple[str | Panel, ...]  # the curves of workdir/<name>_curves.png (infra/plots.py)
  sync_every_step = False  # the step waits for the device: time each step (see _StepClock)
  rollout_timing = False  # log rollout_seconds / update_seconds
  eval_at_start = False  # evaluate the starting policy (a val_* line at step 0)
  profile = False  # trace the steps of ``profile.steps``
  stopped = False  # an early stop (ends the phase like its last step)
  # top-level config keys that change neither the phase's policy nor its test evaluation: a
  # finished phase's recorded summary is reused across them (dllm_rl.train.phase_record)
  unrelated_keys: tuple[str, ...] = ("mode",)

  def __init__(self, ctx: Context):
    self.ctx = ctx
    self.wall0 = time.monotonic()
    self.val_graded: tuple[int, list] | None = None  # (step, graded) of the last validation

  def init_state(self):
    """A fresh training state: the start, and the template of a restore that needs values
    (:meth:`abstract_state` None)."""
    raise NotImplementedError

  def abstract_state(self):
    """The restore template as shapes, dtypes and shardings (``jax.ShapeDtypeStruct``
    leaves) when a resume needs no value of a fresh state; else None (the default)."""
    return None

  def start(self, state, meta: dict, resumed: bool) -> int:
    """Prepare the steps from ``meta`` (a restored checkpoint's, when ``resumed``); returns
    the number of steps already done."""
    raise NotImplementedError

  def step(self, state, step: int) -> tuple[Any, dict, StepCost]:
    """Step ``step`` (0-based): (state, metrics, cost)."""
    raise NotImplementedError

  def build_evaluators(self) -> None:
    """One jitted greedy sampler of the policy (``self.graphdef``) for validation and the
    test's greedy pass (:meth:`evaluate`, :meth:`test`); call from :meth:`start`."""
    ctx = self.ctx
    self.greedy_fn, self.grade = evaluation.make_greedy_evaluator(
        self.graphdef, ctx.decoding, ctx.eval_options)

  def evaluate(self, state, step: int) -> dict:
    """Validation metrics (logged with a ``val_`` prefix): greedy accuracy and reward on the
    val split; its graded completions are kept for :meth:`samples` at the same step."""
    graded = self.grade(state.params, self.ctx.val)
    self.val_graded = (step, graded)
    return evaluation.mean_scores(graded)

  def samples(self, state, step: int) -> list[dict]:
    """Sample completions of step ``step`` (``log.samples_every``; dllm_rl.infra.samples):
    here the greedy completions of the first ``log.num_samples`` validation prompts, those of
    the validation pass when it ran at this step, else one greedy batch."""
    ctx = self.ctx
    val = evaluation.head(ctx.val, ctx.config.log.num_samples)
    if self.val_graded is not None and self.val_graded[0] == step:
      graded = self.val_graded[1][:len(val.examples)]
    else:
      graded = self.grade(state.params, val)
    return evaluation.generation_records(ctx.tokenizer, val, graded)

  def evaluated(self, val: dict) -> None:
    """Called with each periodic evaluation's result."""

  def meta(self) -> dict:
    """The phase's fields of a checkpoint's meta (data position, ...)."""
    raise NotImplementedError

  def saved(self, step: int) -> None:
    """Called after each checkpoint save is started."""

  def test(self, state) -> dict:
    """The final test evaluation (``evaluation.evaluate_policy``'s report), reusing the
    greedy sampler of :meth:`build_evaluators`."""
    ctx = self.ctx
    return evaluation.evaluate_policy(self.graphdef, state.params, ctx.decoding, ctx.test,
                                      ctx.eval_options, sample_fn=self.greedy_fn)

  def summary(self, run: PhaseRun) -> tuple[dict, dict]:
    """(the phase's summary, the fields of its console line)."""
    raise NotImplementedError


class _StepClock:
  """Wall time of the timed steps into one StepTimer (module docstring: Timing)."""

  def __init__(self, timer: StepTimer, sync_every_step: bool):
    self.timer, self.sync = timer, sync_every_step
    self.first = True  # the first step a process runs compiles: untimed
    self.t0 = 0.0  # start of the current step
    self.clock: float | None = None  # start of the open window (no-sync mode)
    self.pending: list[StepCost] = []  # steps of the open window

  def start(self) -> None:
    """Before a step."""
    self.t0 = time.perf_counter()
    if not self.sync and self.clock is None and not self.first:
      self.clock = self.t0

  def stop(self, state, cost: StepCost) -> None:
    """After a step: in sync mode wait for it and add its time; else add it to the window."""
    if self.sync:
      jax.block_until_ready(state.step)
      if not (self.first or cost.compiles):
        self.timer.add(time.perf_counter() - self.t0, tokens=cost.tokens, flops=cost.flops,
                       rollout_seconds=cost.rollout_seconds)
    elif self.first:
      jax.block_until_ready(state.step)  # once: the timed window starts after compilation
    else:
      self.pending.append(cost)
    self.first = False

  def flush(self) -> None:
    """Close the open window (call right after a sync with the device)."""
    if self.pending:
      self.timer.add(time.perf_counter() - self.clock, steps=len(self.pending),
                     tokens=sum(c.tokens for c in self.pending),
                     flops=sum(c.flops for c in self.pending),
                     rollout_seconds=sum(c.rollout_seconds for c in self.pending))
    self.clock, self.pending = None, []

  def close(self, state) -> None:
    """Wait for ``state`` and close the open window (the end of the phase)."""
    if self.pending:
      jax.block_until_ready(state.step)
    self.flush()

  def paused(self, state, fn):
    """``fn()`` with the window's clock stopped (the device work before it counted)."""
    if self.clock is None:
      return fn()
    jax.block_until_ready(state.step)
    t = time.perf_counter()
    out = fn()
    self.clock += time.perf_counter() - t
    return out


def _restore(phase: Phase, ckpt: Checkpointer) -> tuple[Any, dict, int]:
  """(state, meta, steps done): the newest checkpoint of the phase (read into
  :meth:`Phase.abstract_state`, else into a fresh state), else a fresh start."""
  resumed = ckpt.latest_step() is not None
  if not resumed:
    state, meta = phase.init_state(), {"metric_lines": 0}
  else:
    template = phase.abstract_state()
    state, meta = restore_checkpoint(ckpt, phase.init_state() if template is None else template,
                                     phase.ctx.config)
    _say_changes(phase, meta)
  return state, meta, phase.start(state, meta, resumed)


def _say_changes(phase: Phase, meta: dict, limit: int = 12) -> None:
  """The settings a resume of ``phase`` changes since its checkpoint was saved (its
  ``unrelated_keys`` aside, and ``distributed.*``: a requeued job's new coordinator address
  or process ids are no change to the run), one stderr line
  (layout_errors.changed_settings; at most ``limit`` named)."""
  name = phase.name
  changes = layout_errors.changed_settings(meta, phase.ctx.config,
                                           (*phase.unrelated_keys, "distributed"))
  if not changes or not is_primary():
    return
  print(f"[{name}] note: resuming with settings changed since the checkpoint was saved:"
        f" {layout_errors.said_changes(changes, limit)}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class _Reporter:
  """Where a phase's step loop reports, fixed for the loop: the metrics ``logger`` and the
  progress ``bar`` (``shown``: the newest value of each metric so far, for the bar's fields
  ``Phase.postfix``), with the ``guard`` that reads the skip counters and the ``clock`` whose
  timer gives the throughput."""

  phase: Phase
  logger: MetricsLogger
  bar: Any
  guard: StepGuard
  clock: _StepClock
  shown: dict = dataclasses.field(default_factory=dict)

  def show(self, record: dict) -> None:
    """Put ``record``'s values on the progress bar's fields (``shown`` updated)."""
    self.shown.update(record)
    self.bar.set_postfix(postfix(self.shown, self.phase.postfix), refresh=False)

  def log_window(self, step: int, window: list, skipped, state) -> int:
    """Log the metrics line of the steps in ``window`` (their mean, ``skipped_steps``,
    throughput) at ``step`` and show it on the progress bar (:meth:`show`); returns its skip
    count. ``skipped``: the skip count read at this step, or None (read here: raises after too
    many non-finite updates in a row)."""
    logged = mean_metrics(window)  # blocks on the device: the window's time is real
    if skipped is None:
      skipped = self.guard.skipped(state.opt_state, step)
    logged["skipped_steps"] = skipped
    self.clock.flush()
    logged.update(self.clock.timer.metrics(rollout=self.phase.rollout_timing))
    self.logger.log(step, logged, phase=self.phase.name)
    self.show(logged)
    return skipped


def _log_val(logger: MetricsLogger, phase: Phase, step: int, val: dict) -> None:
  logger.log(step, {f"val_{k}": v for k, v in val.items()}, phase=phase.name)


def curves_path(workdir: str, phase: str) -> str:
  """The phase's training-curve plot in ``workdir``."""
  return paths.join(workdir, f"{phase}_curves.png")


def _recorded(phase_cls: type[Phase], ctx: Context) -> dict | None:
  """The finished phase's recorded summary (dllm_rl.train.phase_record) when it is still
  this workdir's and this config's, said on the console; else None."""
  name = phase_cls.name
  step = (available_steps(ctx.workdir, name) or [None])[-1]
  summary = phase_record.read(ctx.workdir, name, step, ctx.config, phase_cls.unrelated_keys)
  if summary is not None and is_primary():
    print(f"[{name}] finished at step {step}: its summary and test evaluation are read from"
          f" {phase_record.record_path(ctx.workdir, name)} (delete it to evaluate again)",
          flush=True)
  return summary


def run_phase(phase_cls: type[Phase], ctx: Context) -> dict:
  """Run the phase to its last step (or early stop), resuming from its newest checkpoint;
  raises Preempted after saving on a stop request. Returns the phase's summary, which is
  also recorded; a finished phase's recorded summary is returned as it is, before the phase
  is built (:func:`_recorded`)."""
  config, name = ctx.config, phase_cls.name
  recorded = _recorded(phase_cls, ctx)
  if recorded is not None:  # the plot where this workdir has it now (it may have moved)
    return {**recorded, f"{name}_plot": curves_path(ctx.workdir, name)}
  # Every process has looked for the phase's checkpoint folder before any creates it below: a
  # process that found the folder process 0 had just made opened it read-only, whose
  # collectives then met process 0's creating ones (a multi-process run on a fresh workdir
  # stopped with "sync_global_devices name mismatch").
  sync(f"{name}: looked for its checkpoints")
  phase = phase_cls(ctx)
  ckpt = open_checkpointer(ctx, name)
  state, meta, step = _restore(phase, ckpt)
  earlier = float(meta.get("wall_seconds", 0.0))  # the phase's time up to that checkpoint
  pointer = base_pointer(config, ctx.hf_checkpoint)  # a LoRA base's, fingerprinted once
  phase.wall0 -= earlier
  if step > phase.steps and is_primary():  # e.g. a rerun with a smaller {name}.steps
    print(f"[{name}] warning: the newest checkpoint is at step {step}, past {name}.steps ="
          f" {phase.steps}: nothing to train; the phase ends with the checkpoint's policy",
          file=sys.stderr, flush=True)
  window = meta.get("metrics_window", [])  # steps since the last log, saved with the checkpoint
  guard = StepGuard.from_config(name, ckpt, config)
  timer = StepTimer.from_config(config, ctx.mesh)
  clock = _StepClock(timer, phase.sync_every_step)
  profile_steps = config.profile.steps if phase.profile else ""
  samples_every = config.log.samples_every
  with MetricsLogger(ctx.workdir, tensorboard=config.log.tensorboard, writers=ctx.writers,
                     enabled=is_primary()) as logger, \
       ProfileWindow(profile_steps, ctx.workdir, enabled=is_primary()) as profile:
    if "metric_lines" in meta:  # drop records (and samples) of steps about to be redone
      logger.supersede(name, meta["metric_lines"], step=step)
    if phase.eval_at_start and step == 0:
      _log_val(logger, phase, 0, phase.evaluate(state, 0))
    bar = progress(phase.steps, desc=name, initial=step,
                   disable=not (config.log.progress and is_primary()))
    reporter = _Reporter(phase, logger, bar, guard, clock)
    finished = phase.stopped or step >= phase.steps
    try:
      while not finished:
        profile.before(step + 1)
        clock.start()
        state, metrics, cost = phase.step(state, step)
        step += 1
        # The skip counters are read from the device at most once a step: every step when the
        # step syncs anyway, else only at a log line or a save.
        skipped = guard.skipped(state.opt_state, step) if phase.sync_every_step else None
        clock.stop(state, cost)
        profile.after(step, state)
        window.append(metrics)
        bar.update(1)
        if step % phase.log_every == 0:
          window, skipped = [], reporter.log_window(step, window, skipped, state)
        if phase.eval_every and step % phase.eval_every == 0:
          val = clock.paused(state, lambda: phase.evaluate(state, step))
          _log_val(logger, phase, step, val)
          phase.evaluated(val)
          reporter.show({f"val_{k}": v for k, v in val.items()})
        if samples_every and step % samples_every == 0:  # every host: SFT's may sample
          logger.log_samples(step, clock.paused(state, lambda: phase.samples(state, step)),
                             phase=name)
        finished = phase.stopped or step >= phase.steps
        if finished and window:  # the last steps since the previous line get theirs too
          window, skipped = [], reporter.log_window(step, window, skipped, state)
        save, stop = guard.poll(step)  # step- or time-based save; a stop signal (all hosts agree)
        if finished or save:
          if skipped is None:
            guard.skipped(state.opt_state, step)  # never save after a non-finite run
          clock.paused(state, lambda: ckpt.save(step, saved_state(state), {
              "phase": name, **phase.meta(), **pointer, "config": config.to_json(),
              "metric_lines": logger.lines(name), "metrics_window": window_to_meta(window),
              "wall_seconds": time.monotonic() - phase.wall0}))
          guard.saved(step)
          phase.saved(step)
        if stop and not finished:
          bar.close()
          ckpt.close()  # waits for the write
          logger.flush()
          raise Preempted(name, step)
    finally:  # on an error or a stop too: the bar's last line before its message
      bar.close()
    clock.close(state)
    ckpt.wait()
    report = phase.test(state)
    logger.log(step, {k: report[r] for k, r in TEST_METRICS}, phase=name)
  ckpt.close()
  plot = curves_path(ctx.workdir, name)
  if is_primary():
    plot_metrics(paths.join(ctx.workdir, "metrics.jsonl"), plot, phase.panels, phase=name)
  run = PhaseRun(state=state, step=step, report=report, timer=timer,
                 wall_seconds=time.monotonic() - phase.wall0)
  summary, console = phase.summary(run)
  summary = {**summary, f"{name}_plot": plot}
  if earlier:  # a resumed phase: {name}_wall_seconds counts the earlier processes' part too
    summary[f"{name}_earlier_wall_seconds"] = earlier
  if is_primary():
    phase_record.write(ctx.workdir, name, step, config, phase_cls.unrelated_keys, summary)
  phase_summary(name, console, run.wall_seconds)
  return summary
