"""Checkpointing: a thin wrapper over `orbax.checkpoint.CheckpointManager`.

One checkpoint step is a directory `<directory>/<step>/` holding three composite items:

* ``state``  — the arrays (`StandardSave` / `StandardRestore`),
* ``meta``   — the caller's JSON dict: data position, config, phase name, ... (`JsonSave`),
* ``layout`` — our own JSON description of the state's leaves (path, shape, dtype, kind), used
  to check the restore template before any array is read and to rebuild typed PRNG keys.

Arbitrary pytrees are stored in a canonical form so that orbax only ever sees a nested dict of
string keys whose leaves are arrays:

* The state is flattened with `jax.tree_util.tree_flatten_with_path`; each leaf path is turned
  into a tuple of strings (``DictKey(0) -> "0"``, ``GetAttrKey("value") -> "value"``, ...) and the
  leaves are stored in a nested dict along those strings. This covers `flax.nnx.State` with
  integer keys (from `nnx.List` layer lists), optax named tuples, `flax.struct` dataclasses, etc.
  On restore the arrays are put back into the *template's* tree structure
  (`tree_unflatten(treedef_of(abstract_state), leaves)`), so the result has exactly the type and
  structure of ``abstract_state``.
* Typed PRNG keys (`jax.random.key`, dtype ``key<impl>``) are stored as their raw ``uint32`` data
  (`jax.random.key_data`) and the implementation name (e.g. ``"threefry2x32"``) is recorded in
  ``layout``; on restore they are rebuilt with `jax.random.wrap_key_data(data, impl=...)`.
  Raw (legacy ``uint32``) keys are ordinary arrays.
* Python scalars and numpy values are stored as numpy arrays and come back as the template's
  type (``int``, ``float``, ``bool``, numpy array/scalar).

Restores use the template's shardings when present (concrete `jax.Array` leaves, or
`jax.ShapeDtypeStruct` with ``.sharding``), so a checkpoint can be restored onto another mesh;
leaves without a sharding go to the default device. Dtypes follow the template (orbax casts).

Failure behaviour: the state and meta are validated (and the state converted) *before* orbax is
called, so an unserialisable leaf or meta raises `TypeError` synchronously and nothing is
written or deleted. Orbax only prunes old steps (``keep`` = ``max_to_keep``) after a new step
has been committed, so a failed save never deletes older checkpoints. With ``async_save`` the
arrays are copied to host before `save` returns (the caller may donate/overwrite its buffers);
errors raised by the background write surface in `wait`, `close` or the next `save`. A write
the disk or the folder refuses (full, read-only, no rights) is `CheckpointWriteError`, its
step and folder named; orbax's logged tracebacks of it are dropped (`_RefusedWriteLogs`).
The commit threads and unrun coroutines orbax leaves behind when a save's step folder cannot
be made, or a damaged step's read fails, are released and closed by `orbax_threads`.

Readers: ``Checkpointer(directory, read_only=True)`` neither creates the folder nor cleans
uncommitted tmp folders (a training run may be writing one) and refuses to save;
`restore_part` restores one field of the saved state (``"params"`` of a ``TrainState``:
no optimizer moments are read) with an orbax partial restore, the template's leaves matched to
the saved ones by their path; `meta` reads a step's JSON meta alone.

Damaged checkpoints: `restore` without an explicit step tries the newest step first; when it
cannot be read (a truncated or missing file, unreadable metadata) it logs a warning naming the
damaged step and the one it falls back to, and tries the next older step. A folder without
any readable step raises `CheckpointError` listing every step and why it failed. A template
that does not match the checkpoint (another model) is not damage: that raises at once. The
damaged step is deleted only when the run saves that step again (a fresh copy replaces it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from dllm_rl import paths
from dllm_rl.errors import refused_write, short_reason
from dllm_rl.infra import orbax_threads

_LAYOUT_FORMAT = "dllm_rl.infra.checkpoint/1"

_log = logging.getLogger(__name__)
# (folder, damaged steps, step read) fall-backs already warned of: a run reads a step's meta
# and its state separately, and says each fall-back once
_WARNED_FALL_BACKS: set[tuple[str, tuple[int, ...], int]] = set()


def _part(entry: Any) -> str:
  """One path entry of `tree_flatten_with_path` as a string dict key for orbax."""
  if isinstance(entry, jax.tree_util.DictKey):
    return str(entry.key)
  if isinstance(entry, jax.tree_util.SequenceKey):
    return str(entry.idx)
  if isinstance(entry, jax.tree_util.GetAttrKey):
    return entry.name
  if isinstance(entry, jax.tree_util.FlattenedIndexKey):
    return str(entry.key)
  return str(entry)


def _is_key(leaf: Any) -> bool:
  dtype = getattr(leaf, "dtype", None)
  return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _leaf_kind(leaf: Any) -> str | None:
  """'key', 'array', 'numpy' or 'scalar'; None for a leaf we cannot store."""
  if isinstance(leaf, (np.ndarray, np.generic)):
    return "numpy"
  if isinstance(leaf, (bool, int, float)):
    return "scalar"
  if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)):
    return "key" if _is_key(leaf) else "array"
  return None


def _describe(state: Any, what: str) -> tuple[list[dict[str, Any]], list[Any], Any]:
  """Flattens ``state``; returns (layout entries, leaves, treedef). Raises on bad leaves."""
  flat, treedef = jax.tree_util.tree_flatten_with_path(state)
  entries, leaves, seen = [], [], {}
  for path, leaf in flat:
    name = jax.tree_util.keystr(path)
    kind = _leaf_kind(leaf)
    if kind is None:
      raise TypeError(
          f"{what}: leaf at {name} has type {type(leaf).__name__}; only jax arrays, "
          "jax.ShapeDtypeStruct, numpy arrays and Python scalars can be checkpointed.")
    parts = [_part(p) for p in path]
    dotted = ".".join(parts)
    if dotted in seen:
      raise ValueError(f"{what}: leaf paths {seen[dotted]} and {name} map to the same "
                       f"checkpoint name {dotted!r}")
    seen[dotted] = name
    entry: dict[str, Any] = {"name": name, "parts": parts, "kind": kind}
    if kind == "scalar":
      entry.update(shape=[], dtype=np.asarray(leaf).dtype.name)
    else:
      entry.update(shape=list(leaf.shape), dtype=str(leaf.dtype))
    if kind == "key" and isinstance(leaf, jax.Array):
      entry["key_impl"] = str(jax.random.key_impl(leaf))
    entries.append(entry)
    leaves.append(leaf)
  if not entries:
    raise ValueError(f"{what}: the state has no array leaves")
  return entries, leaves, treedef


def _nest(entries: list[dict[str, Any]], values: list[Any]) -> dict[str, Any]:
  """Nested dict of string keys along each entry's ``parts``."""
  tree: dict[str, Any] = {}
  for entry, value in zip(entries, values):
    node = tree
    for p in entry["parts"][:-1]:
      node = node.setdefault(p, {})
    node[entry["parts"][-1]] = value
  return tree


def _lookup(tree: Mapping[str, Any], parts: list[str]) -> Any:
  for p in parts:
    tree = tree[p]
  return tree


def _to_storable(leaf: Any, kind: str) -> Any:
  if kind == "key":
    return jax.random.key_data(leaf)
  if kind in ("numpy", "scalar"):
    return np.asarray(leaf)
  return leaf


def _key_data_sharding(leaf: Any) -> jax.sharding.Sharding | None:
  """Sharding for the uint32 data of a typed-key template leaf (trailing dims replicated)."""
  if isinstance(leaf, jax.Array):
    return jax.random.key_data(leaf).sharding
  sharding = getattr(leaf, "sharding", None)
  if isinstance(sharding, (jax.sharding.NamedSharding, jax.sharding.SingleDeviceSharding)):
    return sharding  # A NamedSharding spec shorter than the rank replicates trailing dims.
  return None


def _restore_target(leaf: Any, kind: str, saved: dict[str, Any]) -> Any:
  """The orbax restore template for one leaf of ``abstract_state``."""
  if kind in ("numpy", "scalar"):
    return np.zeros(saved["shape"], dtype=jax.numpy.dtype(saved["dtype"]))
  default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  if kind == "key":
    data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(leaf.shape, leaf.dtype))
    return jax.ShapeDtypeStruct(data.shape, data.dtype,
                                sharding=_key_data_sharding(leaf) or default)
  return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                              sharding=getattr(leaf, "sharding", None) or default)


def _from_stored(value: Any, template: Any, kind: str, saved: dict[str, Any]) -> Any:
  if kind == "key":
    return jax.random.wrap_key_data(value, impl=saved["key_impl"])
  if kind == "scalar":
    return type(template)(np.asarray(value).item())
  if kind == "numpy":
    value = np.asarray(value, dtype=template.dtype)
    return value[()] if isinstance(template, np.generic) else value
  return value


# Orbax's coroutine that reads one array of a restore (orbax-checkpoint 0.11.x).
_ARRAY_READ = "_read_array_index_and_device_put"


def _in_array_read(err: BaseException | None) -> bool:
  """Whether ``err`` was raised by (or through) orbax's read of one array."""
  return err is not None and any(
      f.name == _ARRAY_READ for f in traceback.extract_tb(err.__traceback__))


class _SiblingReadFailures(logging.Filter):
  """asyncio's "exception was never retrieved" for the other arrays' reads of a restore that
  failed: each is the same damage, already reported with the step."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.exc_info and _in_array_read(record.exc_info[1]))


def _quiet_closed_loop_callbacks() -> None:
  """When a damaged step's restore fails, the other arrays' reads still in flight fail or
  finish after orbax has closed their asyncio loop: each callback's ``RuntimeError('Event
  loop is closed')`` and each read's own exception (a coroutine or gathering future whose
  exception nobody retrieves, reported when it is collected) would print a traceback per
  array, hundreds of lines with nothing to act on (the damage itself is reported). Drop
  those; everything else goes to the previous hook and to asyncio's log."""
  previous = sys.unraisablehook
  if getattr(previous, "quiet_closed_loop", False):
    return

  def hook(unraisable):
    err, frames = unraisable.exc_value, traceback.extract_tb(unraisable.exc_traceback)
    closed = (isinstance(err, RuntimeError) and str(err) == "Event loop is closed"
              and any(f.name == "call_soon_threadsafe" for f in frames))
    if not (closed or _in_array_read(err)):  # only the patterns above
      previous(unraisable)

  hook.quiet_closed_loop = True
  sys.unraisablehook = hook
  _filter_once("asyncio", _SiblingReadFailures)


def _filter_once(logger: str, kind: type[logging.Filter]) -> None:
  """Adds a ``kind`` filter to the logger named ``logger`` unless it has one."""
  log = logging.getLogger(logger)
  if not any(isinstance(f, kind) for f in log.filters):
    log.addFilter(kind())


_ORBAX_DIR = os.path.dirname(ocp.__file__) + os.sep


class _RefusedWriteLogs(logging.Filter):
  """Orbax's ERROR records (absl's logger) of a checkpoint write that the disk or the folder
  refused (`dllm_rl.errors.refused_write`: full, read-only, no rights): each thread of the
  save logs the same error with its traceback, some 300 lines, and `Checkpointer` raises it
  as one CheckpointWriteError naming the step. Orbax's other records, and any other error's,
  pass."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.exc_info and record.pathname.startswith(_ORBAX_DIR)
                and refused_write(record.exc_info[1]) is not None)


class CheckpointError(FileNotFoundError):
  """No readable checkpoint (every step is damaged)."""


class CheckpointWriteError(CheckpointError):
  """A checkpoint could not be written (a full disk, a folder that became read-only); the
  steps committed before it stand."""


# What a failed write raises: OSError (no space, no rights), tensorstore's ValueError,
# orbax's RuntimeError.
_WRITE_ERRORS = (OSError, ValueError, RuntimeError)


class LayoutMismatch(ValueError):
  """The restore template does not match the checkpoint (not damage: no fall-back)."""


def _check_layout(saved: list[dict[str, Any]], wanted: list[dict[str, Any]], where: str) -> None:
  """Raises ValueError naming the first path where the template differs from the checkpoint."""
  for i in range(max(len(saved), len(wanted))):
    s = saved[i] if i < len(saved) else None
    w = wanted[i] if i < len(wanted) else None
    if s is None or w is None or s["name"] != w["name"]:
      raise LayoutMismatch(
          f"State structure mismatch with checkpoint {where} at leaf #{i}: template has "
          f"{w['name'] if w else '<nothing>'}, checkpoint has {s['name'] if s else '<nothing>'}")
    if (s["kind"] == "key") != (w["kind"] == "key"):
      raise LayoutMismatch(f"State structure mismatch with checkpoint {where} at {w['name']}: "
                       f"template dtype {w['dtype']}, checkpoint dtype {s['dtype']}")
    if s["kind"] == "key" and s["dtype"] != w["dtype"]:
      raise LayoutMismatch(f"PRNG key implementation mismatch with checkpoint {where} at "
                       f"{w['name']}: template {w['dtype']}, checkpoint {s['dtype']}")
    if list(s["shape"]) != list(w["shape"]):
      raise LayoutMismatch(f"Shape mismatch with checkpoint {where} at {w['name']}: template "
                       f"{tuple(w['shape'])}, checkpoint {tuple(s['shape'])}")


def _matching_entries(saved: list[dict[str, Any]], wanted: list[dict[str, Any]],
                      where: str, subset: bool = False) -> list[dict[str, Any]]:
  """The saved layout entry of each wanted leaf, found by its path parts and renamed as
  the template names it (for :func:`_check_layout`); LayoutMismatch when one is absent, or,
  unless ``subset``, when a field read holds a saved leaf the template lacks (a model with
  tied embeddings read from an untied checkpoint: its trained lm_head dropped unsaid)."""
  by_parts = {tuple(s["parts"]): s for s in saved}
  out = []
  for w in wanted:
    s = by_parts.get(tuple(w["parts"]))
    if s is None:
      raise LayoutMismatch(f"State structure mismatch with checkpoint {where}: no saved leaf "
                           f"{'.'.join(w['parts'])} (template {w['name']})")
    out.append(dict(s, name=w["name"]))
  fields, read = {w["parts"][0] for w in wanted}, {tuple(w["parts"]) for w in wanted}
  extra = [s for s in saved if s["parts"][0] in fields and tuple(s["parts"]) not in read]
  if extra and not subset:
    raise LayoutMismatch(f"State structure mismatch with checkpoint {where}: the template has no"
                         f" leaf {'.'.join(extra[0]['parts'])} (checkpoint {extra[0]['name']})")
  return out


class Checkpointer:
  """Saves/restores (state pytree, JSON meta) by step, keeping the newest ``keep``.

  When to save is the caller's decision (the training loops: ``train.resilience.StepGuard``).

  Usage::

    with Checkpointer(workdir + "/ckpt", keep=3) as ckpt:
      if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(state)        # template = freshly initialised state
      for step in range(start, num_steps + 1):
        ...
        if step % 100 == 0:
          ckpt.save(step, state, {"data_pos": pos})
  """

  def __init__(self, directory: str, *, keep: int = 1, async_save: bool = True,
               read_only: bool = False):
    if keep < 1:
      raise ValueError(f"keep must be >= 1, got {keep=}")
    self.directory = os.fspath(paths.resolve(directory))  # gs:// stays a URL
    self.keep = keep
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        enable_async_checkpointing=async_save and not read_only,
        # Drop uncommitted tmp dirs of a crashed save; a reader (``read_only``: eval, export)
        # never does, since a training run may be writing one right now, and never creates
        # the folder. (Not orbax's own read_only, which warns at every open.)
        cleanup_tmp_directories=not read_only,
        create=not read_only,
    )
    self.read_only = read_only
    if not read_only:
      _filter_once("absl", _RefusedWriteLogs)
    self._manager = ocp.CheckpointManager(self.directory, options=options)
    self._damaged: set[int] = set()  # steps this process found unreadable
    self._writing: int | None = None  # the step of the newest save (its write may be pending)
    self._commit_threads: list[threading.Thread] = []  # orbax's, of the newest save

  def _write_failed(self, err: Exception, what: str = "saving",
                    threads: Sequence[threading.Thread] = ()) -> CheckpointWriteError:
    """The error to raise for ``err``, a failed write of step ``self._writing`` (``what``:
    "saving" it, "replacing damaged"); ``threads``, orbax's commit threads of the failed
    save, are released when stalled (`orbax_threads.release_stalled_commits`)."""
    orbax_threads.release_stalled_commits(threads)
    reason, code = short_reason(err), refused_write(err)
    if code is not None and os.strerror(code) not in reason:  # tensorstore's, cut short
      reason = f"[Errno {code}] {os.strerror(code)}; {reason}"
    return CheckpointWriteError(
        f"{what} checkpoint step {self._writing} in {self.directory} failed ({reason}); the"
        " steps committed before it stand: free space or fix the folder's rights, then rerun"
        " the same command to resume from the newest")

  def all_steps(self) -> list[int]:
    """Committed checkpoint steps, ascending."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """The newest committed step, or None when the directory holds no checkpoint."""
    return self._manager.latest_step()

  def save(self, step: int, state: Any, meta: Mapping[str, Any]) -> bool:
    """Saves ``state`` and ``meta`` as ``step``.

    Returns whether a save was started. A step that already exists is never overwritten
    (returns False). Raises TypeError/ValueError, before writing anything, for a leaf that is
    not an array/scalar or a ``meta`` that is not JSON-serialisable.
    """
    if self.read_only:
      raise ValueError(f"save(step={step}): {self.directory} was opened read-only")
    if step in self._damaged:  # unreadable: replaced by this fresh save of the same step
      _log.warning("Replacing damaged checkpoint step %d in %s.", step, self.directory)
      self._writing = step
      try:
        self._manager.delete(step)
      except _WRITE_ERRORS as err:  # a folder made read-only, or without our rights
        raise self._write_failed(err, "replacing damaged") from err  # no commit stalled
      self._damaged.discard(step)
    if step in self._manager.all_steps():
      _log.warning("Checkpoint step %d already exists in %s; not overwriting.", step,
                   self.directory)
      return False
    entries, leaves, _ = _describe(state, f"save(step={step})")
    try:
      meta = json.loads(json.dumps(dict(meta)))
    except (TypeError, ValueError) as e:
      raise TypeError(f"save(step={step}): meta is not JSON-serialisable: {e}") from e
    arrays = _nest(entries, [_to_storable(x, e["kind"]) for x, e in zip(leaves, entries)])
    layout = {"format": _LAYOUT_FORMAT, "leaves": entries}
    self._writing = step
    mark = orbax_threads.save_mark()
    try:
      started = self._manager.save(
          step,
          args=ocp.args.Composite(
              state=ocp.args.StandardSave(arrays),
              meta=ocp.args.JsonSave(meta),
              layout=ocp.args.JsonSave(layout),
          ),
          force=True,  # The caller decides when to save (no CheckpointManager policy).
      )
    except _WRITE_ERRORS as err:  # this save's, or the previous one's raised by its wait
      threads = self._commit_threads + orbax_threads.threads_of_save(mark)
      raise self._write_failed(err, threads=threads) from err
    # the previous save's threads ended before it
    self._commit_threads = orbax_threads.threads_of_save(mark)
    return started

  def restore(self, abstract_state: Any, step: int | None = None, *,
              leave_out: Sequence[str] = ()) -> tuple[Any, dict[str, Any]]:
    """Restores ``step`` (None = the newest readable one) into the structure of ``abstract_state``.

    ``abstract_state`` has the saved structure; its leaves may be concrete arrays or
    `jax.ShapeDtypeStruct` (with ``.sharding`` to place the restored arrays). Returns
    ``(state, meta)`` with ``state`` of the same pytree type as ``abstract_state``.
    ``leave_out``: fields of a dataclass state (``.replace``) that the checkpoint holds but
    that are not read; they come back as ``abstract_state`` has them (a partial read: orbax
    serves it from a checkpointer that has not saved in this process, e.g. ``read_only``).
    Raises FileNotFoundError when the step is absent, `LayoutMismatch` (a ValueError) on a
    structure mismatch, `CheckpointError` when no step can be read. With ``step=None`` a
    damaged newest step falls back to the previous one, with a warning naming both.
    """
    self.wait()
    self._manager.reload()
    steps = self.all_steps()
    if not steps:
      raise FileNotFoundError(f"No checkpoints in {self.directory} (available steps: [])")
    read = lambda s: self._restore_step(abstract_state, s)
    if leave_out:  # the other fields, matched by their paths
      fields = {f.name: getattr(abstract_state, f.name) for f in dataclasses.fields(abstract_state)
                if f.name not in leave_out}

      def read(s):
        parts, meta = self._restore_step(fields, s, partial=True)
        return abstract_state.replace(**parts), meta
    if step is not None:
      if step not in steps:
        raise FileNotFoundError(
            f"No checkpoint for step {step} in {self.directory}; available steps: {steps}")
      return read(step)
    _describe(abstract_state, "restore template")  # a bad template is not damage: raise here
    return self.first_readable(read, list(reversed(steps)))[1]

  def first_readable(self, read: Callable[[int], Any], steps: Sequence[int], *,
                     hint: str = "Delete the damaged steps (or the folder) to start this"
                                 " phase afresh.") -> tuple[int, Any]:
    """``(step, read(step))`` for the first of ``steps`` that ``read`` (which reads this
    directory's checkpoint of a step, its template built beforehand) reads: a step whose read
    raises anything but LayoutMismatch (the template's problem, raised at once) is damaged,
    and the next is tried, with a warning naming the damaged ones. None readable:
    CheckpointError naming each step's error, then ``hint``."""
    failures = []
    # before any read: a failed read's late callbacks can fire before its exception is caught
    _quiet_closed_loop_callbacks()
    for candidate in steps:
      try:
        out = read(candidate)
      except LayoutMismatch:
        raise
      except Exception as e:  # orbax/tensorstore/json errors of a damaged step  # noqa: BLE001
        failures.append((candidate, short_reason(e)))  # tensorstore: KBs of spec
        self._damaged.add(candidate)
        orbax_threads.close_dropped_reads(e)
        continue
      said = (self.directory, tuple(s for s, _ in failures), candidate)
      if failures and said not in _WARNED_FALL_BACKS:
        _WARNED_FALL_BACKS.add(said)
        _log.warning("Checkpoint %s is damaged (%s); restored the previous step %d instead.",
                     ", ".join(f"{self.directory}/{s}" for s, _ in failures),
                     "; ".join(f"step {s}: {why}" for s, why in failures), candidate)
      return candidate, out
    raise CheckpointError(
        f"No readable checkpoint in {self.directory}: "
        + "; ".join(f"step {s}: {why}" for s, why in failures) + f". {hint}")

  def restore_part(self, abstract_part: Any, name: str, step: int, *,
                   subset: bool = False) -> tuple[Any, dict[str, Any]]:
    """Restores only the field ``name`` of the saved state (e.g. ``"params"`` of a
    ``TrainState``: no optimizer moments are read) at ``step``, into the structure of
    ``abstract_part``; returns ``(part, meta)``. Same errors as :meth:`restore` with a step.
    ``subset``: ``abstract_part`` may leave out saved leaves of the field (LoRA adapters of
    targets no longer adapted); else a saved leaf it lacks is a LayoutMismatch too."""
    self.wait()
    self._manager.reload()
    if step not in self.all_steps():
      raise FileNotFoundError(
          f"No checkpoint for step {step} in {self.directory}; available steps: "
          f"{self.all_steps()}")
    state, meta = self._restore_step({name: abstract_part}, step, partial=True, subset=subset)
    return state[name], meta

  def meta(self, step: int) -> dict[str, Any]:
    """The JSON meta saved with ``step`` (no array is read)."""
    out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    if not isinstance(out["meta"], Mapping):
      raise ValueError(f"{self.directory}/{step}: meta is not a JSON object")
    return dict(out["meta"])

  def _restore_step(self, abstract_state: Any, step: int, partial: bool = False,
                    subset: bool = False) -> tuple[Any, dict[str, Any]]:
    """``partial``: ``abstract_state`` holds some of the saved fields, its leaves matched by
    their path parts (a dict ``{field: subtree}`` for a dataclass's field); all of each
    field's saved leaves but with ``subset`` (:func:`_matching_entries`)."""
    where = f"{self.directory}/{step}"
    saved = self._manager.restore(step, args=ocp.args.Composite(layout=ocp.args.JsonRestore()))
    saved_entries = saved["layout"]["leaves"]
    entries, leaves, treedef = _describe(abstract_state, "restore template")
    if partial:
      saved_entries = _matching_entries(saved_entries, entries, where, subset)
    _check_layout(saved_entries, entries, where)
    targets = [_restore_target(x, e["kind"], s)
               for x, e, s in zip(leaves, entries, saved_entries)]
    target = _nest(entries, targets)
    item = (ocp.args.PyTreeRestore(target, partial_restore=True,
                                   restore_args=ocp.checkpoint_utils.construct_restore_args(target))
            if partial else ocp.args.StandardRestore(target))
    out = self._manager.restore(
        step, args=ocp.args.Composite(state=item, meta=ocp.args.JsonRestore()))
    values = [_from_stored(_lookup(out["state"], e["parts"]), x, e["kind"], s)
              for x, e, s in zip(leaves, entries, saved_entries)]
    if not isinstance(out["meta"], Mapping):
      raise ValueError(f"{where}: meta is not a JSON object")
    return jax.tree_util.tree_unflatten(treedef, values), dict(out["meta"])

  def wait(self) -> None:
    """Blocks until pending async saves are committed; a failed write raises
    :class:`CheckpointWriteError` naming the step and the folder."""
    try:
      self._manager.wait_until_finished()
    except _WRITE_ERRORS as err:
      raise self._write_failed(err, threads=self._commit_threads) from err
    self._commit_threads = []  # all ended

  def close(self) -> None:
    """Waits for pending saves (as :meth:`wait`) and releases orbax resources."""
    try:
      self.wait()
    except CheckpointWriteError:
      with contextlib.suppress(*_WRITE_ERRORS):  # the same failure again
        self._manager.close()
      raise
    finally:
      orbax_threads.close_released()
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()
