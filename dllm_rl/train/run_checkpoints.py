"""A finished (or running) run's checkpoints, read-only: which phase and step to use, its
parameters alone and the config it was trained with. Shared by ``mode=eval`` and
``python -m dllm_rl.convert export --workdir``.

Steps are the phase loop's own count, the names of ``workdir/checkpoints/<phase>/<step>/``:
SFT steps (one optimizer update each) and RL **rollout batches** (each followed by
``rl.inner_steps`` optimizer updates; ``TrainState.step`` counts those updates and is never
used as a label). A checkpoint's label is ``<phase><step>``: ``sft200``, ``rl40``.
"""

from __future__ import annotations

import dataclasses
import json
import logging

from typing import Any, Callable

import ml_collections
from flax import nnx

from dllm_rl import paths
from dllm_rl.infra.checkpoint import Checkpointer, CheckpointError, LayoutMismatch, failure_reason
from dllm_rl.models import lora
from dllm_rl.models.transformer import ModelConfig, abstract_params_sharded
from dllm_rl.train.phases import checkpoint_dir

PHASES = ("sft", "rl")  # training order: the newest last
AUTO = "auto"  # the newest phase that has a checkpoint
LATEST = -1  # the newest step of the phase
_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CheckpointRef:
  """One saved step of a run: ``phase`` ("sft" | "rl") and ``step`` (SFT steps, RL
  rollout batches)."""

  workdir: str
  phase: str
  step: int

  @property
  def label(self) -> str:
    return f"{self.phase}{self.step}"

  @property
  def directory(self) -> str:
    return checkpoint_dir(self.workdir, self.phase)


class NoCheckpoint(FileNotFoundError):
  """The phase or step asked for is not in the workdir; ``what`` is "phase" or "step"
  (callers name their own option: ``eval.checkpoint_step``, ``--step``)."""

  def __init__(self, what: str, message: str):
    self.what = what
    super().__init__(message)


def available_steps(workdir: str, phase: str) -> list[int]:
  """The committed checkpoint steps of ``phase`` in ``workdir``, ascending ([] if none)."""
  directory = checkpoint_dir(workdir, phase)
  if not paths.resolve(directory).is_dir():
    return []
  with Checkpointer(directory, read_only=True) as ckpt:
    return ckpt.all_steps()


def find_checkpoint(workdir: str, phase: str = AUTO, step: int = LATEST) -> CheckpointRef | None:
  """The checkpoint ``(phase, step)`` of the run in ``workdir``; no array is read.

  ``phase`` "auto": the newest phase with a checkpoint (RL, else SFT); None when the
  workdir holds none at all. ``step`` -1: the phase's newest. An explicit phase without
  checkpoints, or a step that is not saved, raises :class:`NoCheckpoint` listing what is."""
  if phase not in (AUTO, *PHASES):
    raise ValueError(f"phase must be one of {(AUTO, *PHASES)}, got {phase!r}")
  saved = {p: available_steps(workdir, p) for p in PHASES}
  auto = phase == AUTO
  if auto:
    phase = next((p for p in reversed(PHASES) if saved[p]), None)
    if phase is None:
      return None
  elif not saved[phase]:
    have = [p for p in PHASES if saved[p]]
    raise NoCheckpoint("phase", f"no {phase} checkpoint under {checkpoint_dir(workdir, phase)}"
                       f" (phases with checkpoints: {have or 'none'})")
  steps = saved[phase]
  if step == LATEST:
    step = steps[-1]
  elif step not in steps:
    unit = " (rollout batches)" if phase == "rl" else ""
    other = [p for p in PHASES if p != phase and step in saved[p]]
    hint = (f" ({other[0]} has step {step}: choose that phase)" if auto and other else "")
    raise NoCheckpoint("step", f"no {phase} checkpoint at step {step} in"
                       f" {checkpoint_dir(workdir, phase)}; available steps{unit}: {steps}{hint}")
  return CheckpointRef(workdir, phase, step)


def read_readable(ref: CheckpointRef, read: Callable[[CheckpointRef], Any], *,
                  fall_back: bool) -> tuple[CheckpointRef, Any]:
  """``(ref, read(ref))``, where a damaged step (any error of ``read`` but a LayoutMismatch,
  which is the template's problem, not damage) is not the end: with ``fall_back`` (the newest
  step was asked for) the phase's older steps are read in turn, as a training run's restore
  does, with a warning naming the damaged ones. Nothing readable: CheckpointError naming each
  step's folder and error, and the saved steps."""
  steps = [s for s in available_steps(ref.workdir, ref.phase) if s <= ref.step]
  failures = []
  for step in reversed(steps if fall_back else [ref.step]):
    candidate = dataclasses.replace(ref, step=step)
    try:
      out = read(candidate)
    except LayoutMismatch:
      raise
    except Exception as err:  # noqa: BLE001 (orbax / tensorstore / JSON errors of a damaged step)
      failures.append(f"{ref.directory}/{step}: {failure_reason(err)}")
      continue
    if failures:
      _log.warning("Checkpoint %s is damaged; read step %d instead.", "; ".join(failures), step)
    return candidate, out
  hint = "" if fall_back else "; choose another step"
  raise CheckpointError(f"no readable {ref.phase} checkpoint: {'; '.join(failures)} (saved"
                        f" steps: {available_steps(ref.workdir, ref.phase)}{hint})")


def read_train_config(ref: CheckpointRef) -> ml_collections.ConfigDict:
  """The config the run was trained with, as saved in the checkpoint's meta."""
  with Checkpointer(ref.directory, read_only=True) as ckpt:
    meta = ckpt.meta(ref.step)
  if "config" not in meta:
    raise ValueError(f"{ref.directory}/{ref.step}: the checkpoint's meta holds no config")
  return ml_collections.ConfigDict(json.loads(meta["config"]))


def restore_params(ref: CheckpointRef, model_cfg: ModelConfig, mesh, *,
                   base: Callable[[], Any] | None = None):
  """The policy parameters of checkpoint ``ref`` only (no optimizer state is read),
  placed on their shardings on ``mesh``, in ``model_cfg.param_dtype``. A LoRA model
  (``model_cfg.lora_rank`` > 0): the checkpoint's adapters on the frozen base that
  ``base()`` rebuilds from the run's pointer (``lora_checkpoint.base_params``)."""
  _, target = abstract_params_sharded(model_cfg, mesh)
  if model_cfg.lora_rank:
    target = lora.split_adapters(target)[0]
  with Checkpointer(ref.directory, read_only=True) as ckpt:
    params, _ = ckpt.restore_part(target, "params", ref.step)
  if model_cfg.lora_rank:
    params = nnx.merge_state(base(), params)
  return params
