"""Where `MetricsLogger` sends each record beside metrics.jsonl: TensorBoard, Weights & Biases.

A writer has ``scalars(phase, step, values)`` (the record's numbers), ``samples(phase, step,
records)`` (dllm_rl.infra.samples records), ``flush()`` and ``close()``. Both libraries are
imported only when a writer is opened (the primary process of a run that asks for it).

TensorBoard: one folder (run) per phase, scalars under ``f"{phase}/{name}"``, samples as one
markdown text per step under ``f"{phase}/samples"``; a resumed phase purges its superseded
steps (:meth:`TensorBoardWriter.purge`).

W&B (``log.wandb_project``): a run per workdir, its id kept in ``workdir/wandb_run_id`` so a
resumed run (same ``--workdir``) continues it; the resolved config as the run's config; each
phase has its own x-axis ``f"{phase}/step"`` (SFT steps, RL rollout batches: both start at 0, and
W&B's own step must only grow); samples as a table; the run's summary at the end.
``WANDB_MODE=offline`` writes the run under ``<workdir>/wandb`` for a later ``wandb sync``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from dllm_rl import paths
from dllm_rl.infra import samples as samples_lib

WANDB_ID_FILE = "wandb_run_id"


def wandb_missing() -> str | None:
  """Why ``log.wandb_project`` cannot work here (the package is not installed), or None."""
  if importlib.util.find_spec("wandb") is None:
    return ('needs the wandb package, which is not installed: pip install "dllm-rl[wandb]" '
            '(from a checkout: pip install -e ".[wandb]"), or leave log.wandb_project empty')
  return None


class TensorBoardWriter:
  """tensorboardX event files under ``logdir`` (a local path or a gs:// / s3:// URL), one
  folder per phase (``logdir/sft``, ``logdir/rl``, ...: TensorBoard shows each as a run), so
  that :meth:`purge` can drop one phase's superseded steps without touching another's."""

  def __init__(self, logdir: str):
    import tensorboardX  # only the primary host of a run with log.tensorboard
    self._summary_writer = tensorboardX.SummaryWriter
    self._logdir = logdir
    self._writers: dict[str, Any] = {}
    self._purge_from: dict[str, int] = {}

  def _writer(self, phase: str):
    if phase not in self._writers:
      # tensorboardX names a file by the second it opens it; TensorBoard reads a folder's
      # files in name order. The suffix keeps that order the order of opening (and a file
      # opened in the same second from being overwritten), so a purge marker comes last.
      self._writers[phase] = self._summary_writer(
          paths.join(self._logdir, phase), purge_step=self._purge_from.pop(phase, None),
          filename_suffix=f".{time.time_ns():020d}")
    return self._writers[phase]

  def purge(self, phase: str, step: int) -> None:
    """``phase`` resumes at ``step`` (a resumed run): the phase's next event file starts with
    TensorBoard's purge marker (a ``SessionLog.START`` at ``step``), so TensorBoard drops
    that run's earlier events from ``step`` on. The steps after it are redone; at ``step``
    itself a finished phase logs its test figures again (they came after its last save), and
    the caller writes the events kept there again (``MetricsLogger.supersede``). At ``step``
    0 (no checkpoint) the starting evaluation is logged again."""
    if phase in self._writers:
      self._writers.pop(phase).close()
    self._purge_from[phase] = int(step)

  def scalars(self, phase: str, step: int, values: Mapping[str, float]) -> None:
    writer = self._writer(phase)
    for name, value in values.items():
      writer.add_scalar(f"{phase}/{name}", value, global_step=step)

  def samples(self, phase: str, step: int, records: Sequence[Mapping[str, Any]]) -> None:
    self._writer(phase).add_text(f"{phase}/samples", samples_lib.markdown(records),
                                 global_step=step)

  def flush(self) -> None:
    for writer in self._writers.values():
      writer.flush()

  def close(self) -> None:
    """Closes each phase's writer; one whose close fails (a full disk refuses its last flush)
    is shut all the same (:func:`_shut`), and the first error is raised."""
    failed = None
    for writer in self._writers.values():
      try:
        writer.close()
      except OSError as err:
        failed = failed or err
        _shut(writer)
    self._writers = {}
    if failed is not None:
      raise failed


def _shut(writer) -> None:
  """Shuts a tensorboardX (2.6) SummaryWriter whose close failed, writing nothing more: its
  close stops at the first flush that fails, so each event file's thread would go on reading a
  queue that exit closes, and tensorboardX's exit hook would flush again (a traceback each).
  Each event file's thread is stopped and its file closed; what it could not write is lost.
  Another tensorboardX, whose internals differ, is left as it is (its exit hook may print)."""
  with contextlib.suppress(AttributeError):
    for file_writer in (getattr(writer, "all_writers", None) or {}).values():
      events = file_writer.event_writer
      if events._closed:
        continue
      events._worker.stop()
      with contextlib.suppress(OSError):  # the same refused flush: the file is closed anyway
        events._ev_writer._py_recordio_writer.close()
      events._event_queue.close()
      events._closed = True  # the exit hook's close does nothing
    writer.file_writer = writer.all_writers = None


class WandbWriter:
  """One W&B run (module docstring); open it with :meth:`open`."""

  def __init__(self, run, wandb_module):
    self.run, self._wandb = run, wandb_module
    self._phases: set[str] = set()

  @classmethod
  def open(cls, workdir: str, *, project: str, entity: str = "", name: str = "",
           config: Mapping[str, Any] | None = None) -> WandbWriter:
    """Start (or, when ``workdir/wandb_run_id`` exists, resume) the workdir's W&B run."""
    import wandb
    id_path = paths.resolve(paths.join(workdir, WANDB_ID_FILE))
    run_id = id_path.read_text().strip() if id_path.exists() else uuid.uuid4().hex[:12]
    local = None if paths.is_url(workdir) else os.fspath(paths.resolve(workdir))
    if local:
      os.makedirs(local, exist_ok=True)
    run = wandb.init(project=project, entity=entity or None,
                     name=name or os.path.basename(os.fspath(workdir).rstrip("/")),
                     config=dict(config or {}), dir=local, id=run_id, resume="allow")
    if not id_path.exists():
      id_path.write_text(run_id + "\n")
    return cls(run, wandb)

  def _axis(self, phase: str) -> str:
    """The phase's x-axis metric (defined on first use)."""
    axis = f"{phase}/step"
    if phase not in self._phases:
      self.run.define_metric(axis)
      self.run.define_metric(f"{phase}/*", step_metric=axis)
      self._phases.add(phase)
    return axis

  def scalars(self, phase: str, step: int, values: Mapping[str, float]) -> None:
    self.run.log({self._axis(phase): step, **{f"{phase}/{k}": v for k, v in values.items()}})

  def samples(self, phase: str, step: int, records: Sequence[Mapping[str, Any]]) -> None:
    columns = samples_lib.columns(records)
    table = self._wandb.Table(columns=columns,
                              data=[[r.get(c) for c in columns] for r in records])
    self.run.log({self._axis(phase): step, f"{phase}/samples": table})

  def summary(self, values: Mapping[str, Any]) -> None:
    """The run's summary: ``values`` (a run's summary.json), None values left out."""
    self.run.summary.update({k: v for k, v in values.items() if v is not None})

  def flush(self) -> None:
    """Nothing to do: W&B sends in the background."""

  def close(self, exit_code: int = 0) -> None:
    self.run.finish(exit_code=exit_code)
