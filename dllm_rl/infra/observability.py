"""Metrics and sample logging, progress bars, end-of-phase summaries (plots: infra/plots.py).

`MetricsLogger.log` appends one JSON object per call to ``<workdir>/metrics.jsonl``::

  {"phase": "sft", "step": 100, "time": 1718000000.1, "loss": 0.41, "accuracy": 0.35}

The file is opened in append mode, so a resumed run continues the same file, and every record
is flushed to the OS as it is written (a crash or ``kill -9`` loses no logged line). Checkpoints
store how many lines of their phase had been logged (`MetricsLogger.lines`); a resumed phase
calls `MetricsLogger.supersede` with that count, which drops the phase's later lines (those
of steps that are about to be redone), so the file, the plots and ``summary.json`` read as if
the run had never been interrupted. Values are converted to Python ``int``/``float``/``bool``
(jax/numpy scalars and size-1 arrays included). Strict JSON has no NaN/Infinity, so non-finite
floats are written as the strings ``"nan"``, ``"inf"`` and ``"-inf"``; `read_metrics` turns them
back into floats. Non-numeric values (short strings) are written as they are.

When ``tensorboard`` is on, numeric values are also written as TensorBoard scalars under
``<workdir>/tb/<phase>`` with tags ``f"{phase}/{name}"`` (a resumed phase's superseded steps are
purged there too); further ``writers`` (W&B) get them too
(dllm_rl.infra.writers). `MetricsLogger.log_samples` appends sample completions to
``<workdir>/samples.jsonl`` (dllm_rl.infra.samples) and sends them to the same writers; a
resumed phase drops its samples of steps after the restored one. ``enabled=False`` makes the
logger a no-op (for non-primary hosts).

The workdir may be a URL (``gs://bucket/run``; see dllm_rl.paths): object stores cannot
append, so there the logger keeps the file's lines and rewrites the object on every
`flush` (and `close`); TensorBoard gets the URL as is (tensorboardX writes gs:// and s3://).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tqdm

from dllm_rl import paths
from dllm_rl.errors import short_reason
from dllm_rl.infra import samples as samples_lib
from dllm_rl.infra.writers import TensorBoardWriter

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_RESERVED = ("phase", "step", "time")


def _to_python(name: str, value: Any) -> Any:
  """A JSON-ready Python value; non-finite floats become "nan"/"inf"/"-inf"."""
  if isinstance(value, (str, bool)) or value is None:
    return value
  if isinstance(value, int):
    return value
  try:
    arr = np.asarray(value)
  except Exception as e:  # e.g. an object numpy cannot hold
    raise TypeError(f"metric {name!r}: cannot convert {type(value).__name__} to a number") from e
  if arr.size != 1 or arr.dtype.kind not in "biuf":
    raise TypeError(f"metric {name!r}: expected a numeric scalar, got shape {arr.shape} "
                    f"dtype {arr.dtype}")
  item = arr.reshape(()).item()
  if isinstance(item, float) and not math.isfinite(item):
    return "nan" if math.isnan(item) else ("inf" if item > 0 else "-inf")
  return item


def _from_json(value: Any) -> Any:
  return _NONFINITE.get(value, value) if isinstance(value, str) else value


class _RewrittenFile:
  """Append-only text file on an object store: the lines so far (the existing object's
  first), written back whole on `flush` and `close`."""

  def __init__(self, path):
    self.path = path
    self._text = path.read_text(encoding="utf-8") if path.exists() else ""
    self._dirty = False

  def write(self, text: str) -> None:
    self._text += text
    self._dirty = True

  def flush(self) -> None:
    if self._dirty:
      self.path.write_text(self._text, encoding="utf-8")
      self._dirty = False

  def close(self) -> None:
    self.flush()


class _LineFile:
  """An append-only JSONL file of the workdir (metrics.jsonl, samples.jsonl), opened on first
  use; every line reaches the OS as it is written; `replace` rewrites it whole."""

  def __init__(self, path: str):
    self.path = path
    self._file = None

  def lines(self) -> list[str]:
    return _read_text(self.path).splitlines()

  def append(self, lines: Sequence[str]) -> None:
    if self._file is None:
      self._file = _open_append(self.path)
    self._file.write("".join(line + "\n" for line in lines))
    self._file.flush()  # line-flushed: a killed process loses no logged record

  def replace(self, lines: Sequence[str]) -> None:
    """Rewrite the file as ``lines`` (atomically where the filesystem can)."""
    self.close()
    paths.write_atomic(self.path, "".join(line + "\n" for line in lines))

  def flush(self) -> None:
    if self._file is not None:
      self._file.flush()

  def close(self) -> None:
    file, self._file = self._file, None
    if file is not None:
      file.close()  # a refused flush raises, and the file is closed all the same


class MetricsLogger:
  """Appends metrics to ``<workdir>/metrics.jsonl`` (samples to ``samples.jsonl``) and sends
  both to TensorBoard (``tensorboard``) and any further ``writers`` (dllm_rl.infra.writers:
  W&B), which stay open when the logger closes (their owner closes them)."""

  def __init__(self, workdir: str, *, tensorboard: bool = True, writers: Sequence = (),
               enabled: bool = True):
    self.workdir = os.fspath(workdir)
    self.enabled = enabled
    self.path = paths.join(self.workdir, "metrics.jsonl")
    self._metrics = _LineFile(self.path)
    self._samples = _LineFile(paths.join(self.workdir, samples_lib.SAMPLES_FILE))
    self._tensorboard = None
    self._writers: list = []
    self._lines: dict[str, int] = {}
    self._closed = False
    if not enabled:
      return
    paths.resolve(self.workdir).mkdir(parents=True, exist_ok=True)
    self._lines = _count_phases(self._metrics.lines())
    self._metrics.append([])  # opened now: a resumed run appends to the same file
    if tensorboard:
      self._tensorboard = TensorBoardWriter(paths.join(self.workdir, "tb"))
      self._writers.append(self._tensorboard)
    self._writers += list(writers)

  def log(self, step: int, metrics: Mapping[str, Any], *, phase: str) -> dict[str, Any]:
    """Writes one record; returns it as written (non-finite floats as strings)."""
    record: dict[str, Any] = {"phase": phase, "step": int(step), "time": time.time()}
    for name, value in metrics.items():
      if name in _RESERVED:
        raise ValueError(f"metric name {name!r} is reserved ({', '.join(_RESERVED)})")
      record[name] = _to_python(name, value)
    if not self.enabled:
      return record
    self._check_open()
    self._metrics.append([json.dumps(record, allow_nan=False)])
    self._lines[phase] = self._lines.get(phase, 0) + 1
    numbers = _numbers(record)
    for writer in self._writers:
      writer.scalars(phase, int(step), numbers)
    return record

  def log_samples(self, step: int, records: Sequence[Mapping[str, Any]], *,
                  phase: str) -> None:
    """Appends sample completions (dllm_rl.infra.samples) to samples.jsonl and the writers."""
    if not self.enabled or not records:
      return
    self._check_open()
    self._samples.append(samples_lib.sample_lines(phase, step, records, time.time()))
    for writer in self._writers:
      writer.samples(phase, int(step), records)

  def _check_open(self) -> None:
    if self._closed:
      raise ValueError(f"MetricsLogger({self.workdir!r}) is closed")

  def lines(self, phase: str) -> int:
    """Records of ``phase`` in the file (kept from earlier runs and logged by this one)."""
    return self._lines.get(phase, 0)

  def supersede(self, phase: str, keep: int, *, step: int | None = None) -> int:
    """Keep only the first ``keep`` records of ``phase`` (those logged up to the checkpoint a
    resumed run restored); later ones are dropped. Other phases and a truncated last line are
    left as they are / dropped. Rewrites the file atomically; returns the number dropped.
    ``step``: the restored step; the phase's samples of later steps are dropped too, and a
    writer with ``purge(phase, step)`` (TensorBoard) is told to drop the phase's events from
    ``step`` on, then gets the kept records and samples at ``step`` again (W&B keeps all)."""
    if not self.enabled:
      return 0
    kept, seen, dropped = [], 0, 0
    lines = self._metrics.lines()
    for line in lines:
      record_phase = _phase_of(line)
      if record_phase is _CUT:
        dropped += 1  # a line cut short by a crash
        continue
      if record_phase == phase:
        seen += 1
        if seen > keep:
          dropped += 1
          continue
      kept.append(line)
    if dropped:
      self._metrics.replace(kept)
    self._lines = _count_phases(kept)
    if step is not None:
      old = self._samples.lines()
      new = samples_lib.keep_until(old, phase, step)
      if new != old:
        self._samples.replace(new)
      for writer in self._writers:  # TensorBoard drops the phase's events from `step` on
        if hasattr(writer, "purge"):  # and gets the kept ones at `step` again: a finished
          writer.purge(phase, step)  # phase logs its test figures at its last step again
          _rewrite_step(writer, phase, step, kept, new)
    return dropped

  def flush(self) -> None:
    """Flushes the JSONL files, TensorBoard events and the other writers."""
    self._metrics.flush()
    self._samples.flush()
    for writer in self._writers:
      writer.flush()

  def close(self) -> None:
    """Flushes and closes (TensorBoard too; other writers are only flushed); later calls to
    `log` fail (except when disabled). A part that fails (a full disk) does not keep the
    others open; the first OSError is raised."""
    if self._closed:
      return
    failed = None
    others = [w for w in self._writers if w is not self._tensorboard]
    closes = [self._metrics.close, self._samples.close, *(w.flush for w in others)]
    if self._tensorboard is not None:
      closes.append(self._tensorboard.close)
    for close in closes:  # each, even when one before it fails (a full disk): nothing is
      try:  # left for an exit hook to flush again
        close()
      except OSError as err:
        failed = failed or err
    self._writers, self._tensorboard, self._closed = [], None, True
    if failed is not None:
      raise failed

  def __enter__(self) -> MetricsLogger:
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc is None:
      self.close()
      return
    try:  # the error in flight is the one to see: a full disk that failed a checkpoint write
      self.close()  # fails the last flush too, whose OSError replaced it (a bare traceback)
    except OSError as err:
      print(f"warning: closing {self.path} failed too ({short_reason(err)})", file=sys.stderr,
            flush=True)


def _numbers(record: Mapping[str, Any]) -> dict[str, int | float]:
  """The numeric values of a metrics record (as written: non-finite floats as strings)."""
  numbers = {name: _from_json(value) for name, value in record.items()
             if name not in _RESERVED and not isinstance(value, bool)}
  return {k: v for k, v in numbers.items() if isinstance(v, (int, float))}


def _rewrite_step(writer, phase: str, step: int, metric_lines: Sequence[str],
                  sample_lines: Sequence[str]) -> None:
  """Send ``writer`` the kept metrics records and samples of ``phase`` at ``step`` again (after
  its purge of the phase's events from ``step`` on)."""
  for line in metric_lines:
    record = json.loads(line)  # the kept lines: no line cut short among them
    if record.get("phase") == phase and record.get("step") == step:
      writer.scalars(phase, step, _numbers(record))
  records = [{k: v for k, v in r.items() if k not in _RESERVED}
             for r in samples_lib.read_samples("\n".join(sample_lines), phase)
             if r.get("step") == step]
  if records:
    writer.samples(phase, step, records)


def _read_text(path: str) -> str:
  """The file's text ("" when it does not exist); local paths and URLs alike."""
  p = paths.resolve(path)
  return p.read_text(encoding="utf-8") if p.exists() else ""


def _open_append(path: str):
  """An append-mode text file: a local file, or on an object store a `_RewrittenFile`.
  A last line cut short by a crash gets its newline first, so no record is glued onto it."""
  if paths.is_url(path):  # no append on object stores: rewrite on flush
    f = _RewrittenFile(paths.resolve(path))
    if f._text and not f._text.endswith("\n"):
      f.write("\n")
    return f
  f = open(path, "a", encoding="utf-8")  # Append: never truncate on resume.
  if f.tell() > 0:
    with open(path, "rb") as g:
      g.seek(-1, os.SEEK_END)
      if g.read(1) != b"\n":
        f.write("\n")
  return f


_CUT = object()  # _phase_of: not a record (a line cut short by a crash)


def _phase_of(line: str):
  """The ``phase`` of one metrics.jsonl line, or ``_CUT`` when it is not a JSON record."""
  try:
    return json.loads(line).get("phase")
  except (json.JSONDecodeError, AttributeError):
    return _CUT


def _count_phases(lines: Sequence[str]) -> dict[str, int]:
  """Records per phase among metrics.jsonl ``lines``."""
  counts: dict[str, int] = {}
  for phase in map(_phase_of, lines):
    if phase is not _CUT:
      counts[phase] = counts.get(phase, 0) + 1
  return counts


def read_metrics(path: str, phase: str | None = None) -> list[dict[str, Any]]:
  """All records of a metrics.jsonl (optionally one phase), with "nan"/"inf" back as floats.

  ``path`` may be the file or the workdir that holds it. A truncated last line (a crash
  mid-write) is skipped.
  """
  path = paths.resolve(path)
  if path.is_dir():
    path = path / "metrics.jsonl"
  records = []
  lines = path.read_text(encoding="utf-8").splitlines()
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      if i == len(lines) - 1:
        continue
      raise
    if phase is None or record.get("phase") == phase:
      records.append({k: _from_json(v) for k, v in record.items()})
  return records


def progress(total: int, *, desc: str, initial: int = 0,
             disable: bool | None = None) -> tqdm.tqdm:
  """A tqdm bar with rate and ETA, refreshed at most once a second (short CI logs).

  ``disable=None`` keeps the bar on even when stderr is not a TTY.
  """
  return tqdm.tqdm(total=total, desc=desc, initial=initial, disable=bool(disable),
                   mininterval=1.0, dynamic_ncols=True, file=sys.stderr,
                   bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} "
                              "[{elapsed}<{remaining}, {rate_fmt}{postfix}]")


def _fmt(value: Any) -> str:
  """Numbers with 4 significant digits; anything else as str."""
  try:
    value = _from_json(_to_python("", value))
  except TypeError:
    return str(value)
  return f"{value:.4g}" if isinstance(value, float) else str(value)


def postfix(record: Mapping[str, Any], fields: Sequence[tuple[str, str]]) -> dict[str, str]:
  """The progress bar's fields from a metrics record: ``{label: value}`` for each
  ``(label, key)`` of ``fields`` whose key the record has (3 significant digits; values of
  1000 and more as integers: tokens/s)."""
  out = {}
  for label, key in fields:
    value = _from_json(record.get(key))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      out[label] = f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"
  return out


def phase_summary(phase: str, metrics: Mapping[str, Any], wall_seconds: float) -> str:
  """One line like "[sft] done in 83.2s | step 600 | loss 0.412 | accuracy 0.352"; printed.
  A None value (not measured, e.g. the step time of a run resumed with one step left: its
  only step compiles) is left out."""
  parts = [f"[{phase}] done in {wall_seconds:.1f}s"]
  parts += [f"{name} {_fmt(value)}" for name, value in metrics.items() if value is not None]
  line = " | ".join(parts)
  print(line, flush=True)
  return line
