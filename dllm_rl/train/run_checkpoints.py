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

from typing import Any, Callable

import ml_collections
from flax import nnx

from dllm_rl.infra.checkpoint import Checkpointer, LayoutMismatch
from dllm_rl.models import lora
from dllm_rl.models.transformer import ModelConfig, abstract_params_sharded
from dllm_rl.train import layout_errors
from dllm_rl.train.checkpoint_choice import AUTO, LATEST, PHASES  # noqa: F401 (re-exported)
from dllm_rl.train.lora_checkpoint import check_base
from dllm_rl.train.phases import available_steps, checkpoint_dir


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


def read_readable(ref: CheckpointRef, read: Callable[[Checkpointer, int], Any], *,
                  fall_back: bool) -> tuple[CheckpointRef, Any]:
  """``(ref, read(ckpt, ref.step))`` on the phase's checkpointer; a damaged step is not the
  end where ``fall_back`` (the newest step was asked for): the older steps are read in turn,
  with a warning naming the damaged ones, as a training run's restore does
  (:meth:`Checkpointer.first_readable`; ``read`` reads, its template built beforehand, so only
  the checkpoint's own errors count as damage). The returned ref is the step read. Nothing
  readable: CheckpointError naming each step's error and the saved steps."""
  with Checkpointer(ref.directory, read_only=True) as ckpt:
    saved = ckpt.all_steps()
    steps = [s for s in reversed(saved) if s <= ref.step] if fall_back else [ref.step]
    hint = f"Saved steps: {saved}{'' if fall_back else '; choose another step'}."
    step, out = ckpt.first_readable(lambda s: read(ckpt, s), steps, hint=hint)
  return dataclasses.replace(ref, step=step), out


def meta_for_notes(ref: CheckpointRef) -> dict:
  """The meta of checkpoint ``ref`` (its step only), for a note or a warning: {} when it cannot
  be read (its parameters were read already; an unreadable meta only silences the note)."""
  try:
    return read_readable(ref, lambda ckpt, s: ckpt.meta(s), fall_back=False)[1]
  except Exception:  # noqa: BLE001
    return {}


def train_config(meta: dict, where: str) -> ml_collections.ConfigDict:
  """The config a run was trained with, from a checkpoint's meta (``where``: its folder)."""
  if "config" not in meta:
    raise ValueError(f"{where}: the checkpoint's meta holds no config")
  return ml_collections.ConfigDict(json.loads(meta["config"]))


def read_train_config(ref: CheckpointRef, *, fall_back: bool = False
                      ) -> tuple[CheckpointRef, ml_collections.ConfigDict]:
  """(the step read, the config the run was trained with, as saved in its meta); with
  ``fall_back``, a damaged newest step's is read from the step before (:func:`read_readable`)."""
  return read_readable(ref, lambda ckpt, s: train_config(ckpt.meta(s), f"{ref.directory}/{s}"),
                       fall_back=fall_back)


def read_params(ref: CheckpointRef, model_cfg: ModelConfig, mesh, *, fall_back: bool = False):
  """(the step read, (the checkpoint's policy parameters, its meta)) as saved: no optimizer
  state, a LoRA model's adapters alone (no base); placed on their shardings on ``mesh``.
  ``fall_back``: as :func:`read_readable`. LayoutMismatch when they do not fit ``model_cfg``."""
  _, target = abstract_params_sharded(model_cfg, mesh)  # the template: not part of the read
  if model_cfg.lora_rank:
    target = lora.split_adapters(target)[0]
  # adapters of targets left out since (lora.targets) are dropped, said by the callers; any
  # other saved leaf the model lacks is a LayoutMismatch (model.tie_embeddings)
  return read_readable(ref, lambda ckpt, s: ckpt.restore_part(
      target, "params", s, subset=bool(model_cfg.lora_rank)), fall_back=fall_back)


def restore_params(ref: CheckpointRef, model_cfg: ModelConfig, mesh, *,
                   base: Callable[[], Any] | None = None, fall_back: bool = False,
                   config: ml_collections.ConfigDict | None = None, base_key: str | None = None):
  """(the step read, the policy parameters of checkpoint ``ref`` only): no optimizer state is
  read; placed on their shardings on ``mesh``, in ``model_cfg.param_dtype``. ``fall_back``:
  a damaged newest step falls back to the step before (:func:`read_readable`). A LoRA model
  (``model_cfg.lora_rank`` > 0): the checkpoint's adapters on the frozen base that ``base()``
  rebuilds from the run's pointer (``lora_checkpoint.base_params``), after the read. With the
  run's ``config``, a checkpoint it does not fit is a ConfigError naming the keys it was
  trained with (dllm_rl.train.layout_errors), and so are adapters trained on another base
  (``lora_checkpoint.check_base``), checked before ``base()`` runs. ``base_key``: that check
  alone, against ``config`` (the run's own), with the option that points at the base named
  in its error (export's ``--hf_source``)."""
  try:
    ref, (params, meta) = read_params(ref, model_cfg, mesh, fall_back=fall_back)
  except LayoutMismatch as err:
    if config is None or base_key is not None:
      raise
    raise layout_errors.for_checkpoint(err, ref.directory, ref.step, config) from err
  if config is not None:
    check_base(meta, config, f"{ref.directory}/{ref.step}",
               key=base_key or "model.hf_checkpoint")
  if model_cfg.lora_rank:
    params = nnx.merge_state(base(), params)
  return ref, params
