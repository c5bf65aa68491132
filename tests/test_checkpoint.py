"""Tests for dllm_rl.infra.checkpoint: round trips of real training-state pytrees, retention,
errors."""

from __future__ import annotations

import os
import warnings
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from dllm_rl.infra.checkpoint import Checkpointer


class _Tiny(nnx.Module):
  """A small model with an nnx.List of layers (integer keys in its nnx.State)."""

  def __init__(self, rngs: nnx.Rngs):
    self.layers = nnx.List([nnx.Linear(4, 4, rngs=rngs) for _ in range(2)])
    self.head = nnx.Linear(4, 3, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    for layer in self.layers:
      x = jax.nn.relu(layer(x))
    return self.head(x)


@flax.struct.dataclass
class _TrainState:
  step: Any
  params: nnx.State
  opt_state: optax.OptState
  rng: jax.Array
  raw_rng: jax.Array
  py_count: int


def _make_state(seed: int) -> tuple[nnx.GraphDef, _TrainState]:
  graphdef, params = nnx.split(_Tiny(nnx.Rngs(seed)))
  opt = optax.adamw(1e-2)
  opt_state = opt.init(params)
  # One real update so the optimizer moments are non-zero.
  grads = jax.tree.map(jnp.ones_like, params)
  _, opt_state = opt.update(grads, opt_state, params)
  state = _TrainState(step=jnp.asarray(seed, jnp.int32), params=params, opt_state=opt_state,
                      rng=jax.random.key(seed), raw_rng=jax.random.PRNGKey(seed),
                      py_count=seed)
  return graphdef, state


def _assert_same(a: Any, b: Any) -> None:
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert type(x) is type(y) or (isinstance(x, jax.Array) and isinstance(y, jax.Array))
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      assert x.dtype == y.dtype
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert np.asarray(x).dtype == np.asarray(y).dtype


def test_round_trip_real_train_state(tmp_path):
  graphdef, state = _make_state(3)
  assert list(state.params["layers"].keys()) == [0, 1]  # Integer keys from nnx.List.
  _, template = _make_state(7)  # Same structure, different values.
  with Checkpointer(str(tmp_path / "ckpt"), keep=2) as ckpt:
    assert ckpt.save(10, state, {"data_pos": 123, "phase": "sft", "config": {"lr": 0.1}})
    ckpt.wait()
    restored, meta = ckpt.restore(template)
  assert meta == {"data_pos": 123, "phase": "sft", "config": {"lr": 0.1}}
  assert isinstance(restored, _TrainState)
  assert isinstance(restored.params, nnx.State)
  assert isinstance(restored.py_count, int) and restored.py_count == 3
  _assert_same(state, restored)
  # The restored typed key is usable and equal to the original stream.
  np.testing.assert_array_equal(jax.random.normal(restored.rng, (3,)),
                                jax.random.normal(state.rng, (3,)))
  # The restored params rebuild a working model.
  x = jnp.ones((2, 4))
  np.testing.assert_allclose(nnx.merge(graphdef, restored.params)(x),
                             nnx.merge(graphdef, state.params)(x))


def test_restore_from_shape_dtype_structs_with_sharding(tmp_path):
  _, state = _make_state(1)
  mesh = jax.make_mesh((8,), ("x",))
  keys = jax.device_put(jax.random.split(jax.random.key(0), 8), NamedSharding(mesh, P("x")))
  tree = {"state": state, "keys": keys}
  ckpt = Checkpointer(str(tmp_path), keep=1, async_save=False)
  ckpt.save(5, tree, {})
  abstract = jax.tree.map(  # Python scalars stay Python scalars in the template.
      lambda x: x if isinstance(x, int) else jax.ShapeDtypeStruct(
          x.shape, x.dtype, sharding=x.sharding), tree)
  restored, _ = ckpt.restore(abstract)
  _assert_same(tree, restored)
  assert restored["keys"].sharding == keys.sharding
  ckpt.close()


@flax.struct.dataclass
class _PolicyState:
  params: Any
  opt_state: Any


def test_restore_part_reads_the_params_alone_onto_new_shardings(tmp_path):
  """A state saved with its optimizer moments; its ``params`` restored alone (what eval and
  export read) onto a new sharding, equal to the saved ones; a template leaf the checkpoint
  lacks is a LayoutMismatch naming it, and so is a saved one the template lacks but with
  ``subset``; a read-only Checkpointer creates nothing, never saves."""
  from dllm_rl.infra.checkpoint import LayoutMismatch
  params = {"embed": np.arange(12, dtype=np.float32).reshape(4, 3), "head": {"bias": np.ones(3)}}
  state = _PolicyState(params=params, opt_state={"mu": {"embed": np.zeros((4, 3), np.float32)}})
  with Checkpointer(str(tmp_path / "ckpt"), keep=2, async_save=False) as ckpt:
    ckpt.save(4, state, {"phase": "rl"})
  sharding = NamedSharding(jax.make_mesh((2,), ("x",)), P("x"))
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                        {"embed": params["embed"]})
  with Checkpointer(str(tmp_path / "ckpt"), read_only=True) as ckpt:
    restored, meta = ckpt.restore_part(target, "params", 4, subset=True)
    assert meta == ckpt.meta(4) == {"phase": "rl"}
    with pytest.raises(LayoutMismatch, match=r"the template has no leaf params\.head\.bias"):
      ckpt.restore_part(target, "params", 4)  # a saved leaf left out: only with subset
    with pytest.raises(FileNotFoundError, match=r"step 5 .*available steps: \[4\]"):
      ckpt.restore_part(target, "params", 5)
    with pytest.raises(LayoutMismatch, match=r"no saved leaf params\.extra"):
      ckpt.restore_part({**target, "extra": target["embed"]}, "params", 4)
    with pytest.raises(ValueError, match="read-only"):
      ckpt.save(6, state, {})
  np.testing.assert_array_equal(restored["embed"], params["embed"])
  assert restored["embed"].sharding == sharding and set(restored) == {"embed"}
  with Checkpointer(str(tmp_path / "none"), read_only=True) as ckpt:
    assert ckpt.all_steps() == []
  assert not os.path.exists(tmp_path / "none")


def test_a_read_leaving_a_field_out_reads_all_of_the_others(tmp_path):
  """``restore(leave_out=...)`` (a resume with the KL reference turned off) reads every saved
  leaf of the other fields: a template without one (a model with tied embeddings against an
  untied checkpoint) is a LayoutMismatch naming it, not a state whose trained head and its
  moments are dropped without a word."""
  from dllm_rl.infra.checkpoint import LayoutMismatch
  params = {"embed": np.ones((4, 3), np.float32), "lm_head": np.ones((3, 4), np.float32)}
  with Checkpointer(str(tmp_path / "ckpt"), async_save=False) as ckpt:
    ckpt.save(2, _PolicyState(params=params, opt_state={"count": np.zeros(())}), {})
  both = _PolicyState(params=params, opt_state={"count": np.zeros(())})
  tied = _PolicyState(params={"embed": params["embed"]}, opt_state={"count": np.zeros(())})
  with Checkpointer(str(tmp_path / "ckpt"), read_only=True) as ckpt:
    state, _ = ckpt.restore(both, leave_out=("opt_state",))
    assert set(state.params) == {"embed", "lm_head"}
    with pytest.raises(LayoutMismatch, match=r"the template has no leaf params\.lm_head"):
      ckpt.restore(tied, leave_out=("opt_state",))


def test_keep_latest_and_specific_step(tmp_path):
  ckpt = Checkpointer(str(tmp_path), keep=2)
  assert ckpt.latest_step() is None
  for step in range(2, 9, 2):  # When to save is the caller's decision (train.resilience).
    tree = {"w": jnp.full((3,), float(step)), "k": jax.random.key(step)}
    assert ckpt.save(step, tree, {"step": step})
  assert ckpt.save(9, tree, {"step": 9})
  assert not ckpt.save(9, tree, {"step": 9})  # Never overwrites a step.
  ckpt.wait()
  assert ckpt.all_steps() == [8, 9]
  assert ckpt.latest_step() == 9
  restored, meta = ckpt.restore(tree, step=8)
  assert meta == {"step": 8}
  np.testing.assert_array_equal(restored["w"], np.full((3,), 8.0))
  np.testing.assert_array_equal(jax.random.key_data(restored["k"]),
                                jax.random.key_data(jax.random.key(8)))
  ckpt.close()
  # A new Checkpointer on the same directory (a resumed run) sees the same steps.
  with Checkpointer(str(tmp_path), keep=2) as again:
    assert again.latest_step() == 9
    assert again.restore(tree)[1] == {"step": 9}


def test_async_save_then_wait(tmp_path):
  ckpt = Checkpointer(str(tmp_path), keep=3, async_save=True)
  tree = {"w": jnp.arange(1000.0)}
  assert ckpt.save(1, tree, {})
  ckpt.wait()
  assert os.path.isdir(tmp_path / "1")
  assert ckpt.latest_step() == 1
  np.testing.assert_array_equal(ckpt.restore(tree)[0]["w"], tree["w"])
  ckpt.close()


def test_restore_errors(tmp_path):
  with Checkpointer(str(tmp_path / "empty"), keep=1) as ckpt:
    with pytest.raises(FileNotFoundError, match="empty"):
      ckpt.restore({"w": jnp.zeros(2)})
  with Checkpointer(str(tmp_path / "c"), keep=2) as ckpt:
    ckpt.save(1, {"a": {"w": jnp.zeros(2)}, "b": jnp.ones(3)}, {})
    ckpt.wait()
    with pytest.raises(FileNotFoundError, match=r"step 7.*available steps: \[1\]"):
      ckpt.restore({"a": {"w": jnp.zeros(2)}, "b": jnp.ones(3)}, step=7)
    with pytest.raises(ValueError, match=r"\['a'\]\['v'\]"):
      ckpt.restore({"a": {"v": jnp.zeros(2)}, "b": jnp.ones(3)})
    with pytest.raises(ValueError, match=r"\['b'\].*\(4,\).*\(3,\)"):
      ckpt.restore({"a": {"w": jnp.zeros(2)}, "b": jnp.ones(4)})
    with pytest.raises(ValueError, match=r"\['b'\]"):
      ckpt.restore({"a": {"w": jnp.zeros(2)}, "b": jax.random.key(0)})


def test_failed_save_keeps_older_checkpoints(tmp_path):
  with Checkpointer(str(tmp_path), keep=1) as ckpt:
    good = {"w": jnp.ones(3)}
    ckpt.save(1, good, {"ok": True})
    ckpt.wait()
    with pytest.raises(TypeError, match=r"\['bad'\]"):
      ckpt.save(2, {"w": jnp.ones(3), "bad": object()}, {})
    with pytest.raises(TypeError, match="JSON"):
      ckpt.save(3, good, {"not_json": object()})
    ckpt.wait()
    assert ckpt.all_steps() == [1]
    restored, meta = ckpt.restore(good)
  assert meta == {"ok": True}
  np.testing.assert_array_equal(restored["w"], np.ones(3))


# --- damaged checkpoints fall back to the previous step (issue 11) ---

import glob  # noqa: E402
import logging as _logging  # noqa: E402

from dllm_rl.infra.checkpoint import CheckpointError  # noqa: E402


def _three_steps(tmp_path):
  _, state = _make_state(0)
  directory = str(tmp_path / "ckpt")
  with Checkpointer(directory, keep=5, async_save=False) as ckpt:
    for step in (1, 2, 3):
      ckpt.save(step, state.replace(step=jnp.asarray(step, jnp.int32)), {"at": step})
  return directory, state


def _truncate_arrays(step_dir):
  files = [f for f in glob.glob(os.path.join(step_dir, "state", "**", "*"), recursive=True)
           if os.path.isfile(f) and os.path.getsize(f) > 64 and "/d/" in f]
  assert files
  for f in files:
    with open(f, "r+b") as fh:
      fh.truncate(os.path.getsize(f) // 2)


def _drop_meta(step_dir):
  os.remove(os.path.join(step_dir, "meta", "metadata"))


def _garble_layout(step_dir):
  with open(os.path.join(step_dir, "layout", "metadata"), "w") as fh:
    fh.write("{not json")


@pytest.mark.parametrize("damage", [_truncate_arrays, _drop_meta, _garble_layout])
def test_damaged_newest_step_falls_back_with_a_warning(tmp_path, caplog, damage):
  directory, template = _three_steps(tmp_path)
  damage(os.path.join(directory, "3"))
  with Checkpointer(directory, keep=5, async_save=False) as ckpt:
    with caplog.at_level(_logging.WARNING, logger="dllm_rl.infra.checkpoint"):
      state, meta = ckpt.restore(template)
    assert meta == {"at": 2} and int(state.step) == 2
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert f"{directory}/3 is damaged" in warning and "previous step 2" in warning
    # the run goes on and saves step 3 again: the fresh copy replaces the damaged one
    assert ckpt.save(3, state.replace(step=jnp.asarray(3, jnp.int32)), {"at": 33})
    ckpt.wait()
    assert ckpt.restore(template)[1] == {"at": 33}


def test_a_fall_back_read_twice_in_a_run_is_said_once(tmp_path, caplog):
  """A run reads a damaged step's meta and then its state (two checkpointers, as a resume
  does): the fall-back is one warning, not one per read."""
  directory, template = _three_steps(tmp_path)
  _drop_meta(os.path.join(directory, "3"))
  with caplog.at_level(_logging.WARNING, logger="dllm_rl.infra.checkpoint"):
    with Checkpointer(directory, read_only=True) as ckpt:
      assert ckpt.first_readable(ckpt.meta, [3, 2, 1]) == (2, {"at": 2})
    with Checkpointer(directory, read_only=True) as ckpt:
      assert ckpt.restore(template)[1] == {"at": 2}
  said = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
  assert len(said) == 1 and f"{directory}/3 is damaged" in said[0]


def test_nothing_readable_is_a_clear_error(tmp_path):
  directory, template = _three_steps(tmp_path)
  for step in (1, 2, 3):
    _drop_meta(os.path.join(directory, str(step)))
  with Checkpointer(directory, keep=5, async_save=False) as ckpt:
    with pytest.raises(CheckpointError, match=r"No readable checkpoint in .*step 3: .*step 1: "):
      ckpt.restore(template)


def test_a_template_mismatch_is_not_treated_as_damage(tmp_path):
  directory, _ = _three_steps(tmp_path)
  _, other = _make_state(1)
  other = other.replace(py_count=jnp.zeros((7,)))
  with Checkpointer(directory, keep=5, async_save=False) as ckpt:
    with pytest.raises(ValueError, match="mismatch with checkpoint .*/3 "):
      ckpt.restore(other)


def test_a_damaged_step_silences_only_the_closed_loop_callbacks(monkeypatch):
  """After a failed read, tensorstore callbacks hit orbax's closed asyncio loop: their
  'Event loop is closed' errors are dropped; any other unraisable error still reaches the
  previous hook (once installed, the filter is not stacked again)."""
  import sys
  import types

  from dllm_rl.infra import checkpoint as ck
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", seen.append)
  ck._quiet_closed_loop_callbacks()
  ck._quiet_closed_loop_callbacks()
  def raised(fn):
    try:
      fn()
    except Exception as err:  # noqa: BLE001
      return types.SimpleNamespace(exc_value=err, exc_traceback=err.__traceback__, object=None)

  def call_soon_threadsafe():  # asyncio's, on a closed loop
    raise RuntimeError("Event loop is closed")

  def elsewhere():
    raise RuntimeError("Event loop is closed")

  def _read_array_index_and_device_put():  # orbax's read of another array of the step
    raise Exception("Encountered error while reading array index: (slice(0, 4, 1),)")

  sys.unraisablehook(raised(call_soon_threadsafe))
  sys.unraisablehook(raised(_read_array_index_and_device_put))
  other, real = raised(elsewhere), raised(lambda: 1 / 0)
  sys.unraisablehook(other)
  sys.unraisablehook(real)
  assert seen == [other, real]
  # the same reads' gathering futures, collected with their exceptions never retrieved
  import logging
  log, sibling = logging.getLogger("asyncio"), raised(_read_array_index_and_device_put)
  assert [f for f in log.filters if isinstance(f, ck._SiblingReadFailures)] != []
  def record(err):
    return log.makeRecord("asyncio", logging.ERROR, "x", 1, "_GatheringFuture exception was"
                          " never retrieved", (), (type(err), err, err.__traceback__))
  assert not log.filter(record(sibling.exc_value)) and log.filter(record(real.exc_value))


@pytest.mark.filterwarnings("error:coroutine .* was never awaited:RuntimeWarning")
def test_a_damaged_step_s_reads_that_never_started_are_closed(tmp_path):
  """Orbax closes a failed restore's event loop with the step's other reads still scheduled
  (those spawned last): each such coroutine, collected later, warned "coroutine ... was never
  awaited" (a later test's check of its own save caught one in a whole-suite run). The
  fall-back closes them; the previous step reads as before."""
  import asyncio
  import gc

  async def read_array():
    return 0

  async def read_all():
    asyncio.gather(read_array(), read_array())  # the other reads, scheduled as orbax's
    asyncio.get_running_loop().stop()  # the loop ends before they start
    raise ValueError("DATA_LOSS: truncated")

  def read(step):
    if step == 2:
      return "step 2"
    loop = asyncio.new_event_loop()  # orbax's run_sync: closed with tasks pending
    try:
      return loop.run_until_complete(read_all())
    finally:
      loop.close()

  with Checkpointer(str(tmp_path / "ckpt"), keep=2, async_save=False) as ckpt:
    assert ckpt.first_readable(read, [3, 2]) == (2, "step 2")
  with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    gc.collect()
  assert [str(w.message) for w in said if "never awaited" in str(w.message)] == []


def test_a_failed_array_read_is_said_with_its_cause_not_its_spec():
  """Orbax's "Encountered error while reading array index" carries tensorstore's spec
  (kilobytes) and not the damage: the short reason cuts the spec and says its cause."""
  from dllm_rl.errors import short_reason
  try:
    try:
      raise ValueError('FAILED_PRECONDITION: Error reading "params.w/0.0" in OCDBT database at'
                       ' local file "/w/checkpoints/sft/4/state/": Truncated Zstd stream')
    except ValueError as cause:
      raise Exception("Encountered error while reading array index: (slice(0, 4, 1),). See"
                      " full TensorStore details: <bound method spec of TensorStore({\n"
                      "  'driver': 'zarr', ...})>") from cause
  except Exception as err:  # noqa: BLE001
    said = short_reason(err)
  assert said == ("Exception: Encountered error while reading array index: (slice(0, 4, 1),)."
                  ' (ValueError: FAILED_PRECONDITION: Error reading "params.w/0.0" in OCDBT'
                  ' database at local file "/w/checkpoints/sft/4/state/": Truncated Zstd'
                  " stream)")
  assert short_reason(ValueError("x" * 300)).endswith("x...")


def test_the_closed_loop_filter_is_on_before_the_first_read(tmp_path, monkeypatch):
  """A failed read's callbacks can reach the hook before its exception is caught, so the
  filter goes on before any step is read, not after the first failure."""
  import sys
  monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: None)
  filtered_at_read = []

  def read(step):
    filtered_at_read.append(getattr(sys.unraisablehook, "quiet_closed_loop", False))
    return step

  with Checkpointer(str(tmp_path / "ckpt"), keep=2, async_save=False) as ckpt:
    assert ckpt.first_readable(read, [3]) == (3, 3)
  assert filtered_at_read == [True]


@pytest.mark.parametrize("async_save", [True, False])
def test_a_failed_write_is_named_and_the_earlier_steps_stand(tmp_path, monkeypatch, async_save):
  """A write that fails (a full disk, a folder that became read-only mid-run; simulated by the
  final rename failing) is a CheckpointWriteError naming the step and the folder, raised by
  save or by the wait for the asynchronous write, not orbax's raw traceback; the steps
  committed before it still restore."""
  import errno

  from dllm_rl.infra.checkpoint import CheckpointWriteError
  good = {"w": jnp.ones(3)}
  directory = str(tmp_path / "ckpt")
  with Checkpointer(directory, keep=3, async_save=async_save) as ckpt:
    ckpt.save(1, good, {"at": 1})
    ckpt.wait()

    def full(*args, **kwargs):
      raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "rename", full)
    with pytest.raises(CheckpointWriteError, match=rf"^saving checkpoint step 2 in"
                                                   rf" {directory} failed \(OSError: .*No space"
                                                   r" left on device\); the steps committed"):
      ckpt.save(2, {"w": jnp.full(3, 2.0)}, {"at": 2})
      ckpt.wait()
    monkeypatch.undo()
  with Checkpointer(directory, keep=3) as ckpt:
    assert ckpt.all_steps() == [1]
    restored, meta = ckpt.restore(good)
  assert meta == {"at": 1}
  np.testing.assert_array_equal(restored["w"], np.ones(3))


def test_a_refused_write_is_found_in_an_oserror_or_tensorstore_s_text():
  """Full, over quota, read-only or no rights: the errno of an OSError, of tensorstore's
  ValueError ("... [os_error_code='28']"), or of either as a cause; anything else is None.
  ``refused_errno`` reads the error itself only (dllm_rl.main's check)."""
  import errno

  from dllm_rl.errors import refused_errno, refused_write
  tensorstore = ValueError('RESOURCE_EXHAUSTED: Error writing local file "/w/8/_sharding":'
                           " Failed to write 15439 bytes to file 18: No space left on device"
                           " [os_error_code='28']")
  try:
    try:
      raise PermissionError(errno.EACCES, "Permission denied", "/w/8.orbax-checkpoint-tmp")
    except PermissionError as cause:
      raise RuntimeError("the save failed") from cause
  except RuntimeError as err:
    wrapped = err
  assert refused_write(tensorstore) == errno.ENOSPC and refused_write(wrapped) == errno.EACCES
  assert refused_write(OSError(errno.EIO, "Input/output error")) is None
  assert refused_write(ValueError("DATA_LOSS: [os_error_code='5']")) is None
  assert refused_errno(tensorstore) == errno.ENOSPC and refused_errno(wrapped) is None
  assert refused_errno(wrapped.__cause__) == errno.EACCES


def test_orbax_s_tracebacks_of_a_refused_write_are_dropped_and_no_others(tmp_path):
  """Each thread of a save that a full disk refused logs the same error with its traceback
  through absl (some 300 lines before the run's one error line): a writing Checkpointer
  drops those records, orbax's and only for a refused write; another error, or another
  module's record of a full disk, still logs."""
  import errno
  import logging
  import sys

  import orbax.checkpoint as ocp
  Checkpointer(str(tmp_path / "ckpt"), keep=1, async_save=False).close()
  log = logging.getLogger("absl")
  in_orbax = os.path.join(os.path.dirname(ocp.__file__), "_src", "futures", "future.py")

  def record(err, pathname=in_orbax):
    try:
      raise err
    except Exception:  # noqa: BLE001
      info = sys.exc_info()
    return log.makeRecord("absl", logging.ERROR, pathname, 387, "_SignalingThread.run() raised"
                          " an exception: %s", (err,), info)

  full = ValueError("RESOURCE_EXHAUSTED: ... No space left on device [os_error_code='28']")
  assert not log.filter(record(full))
  assert not log.filter(record(PermissionError(errno.EACCES, "Permission denied")))
  assert log.filter(record(OSError(errno.EIO, "Input/output error")))
  assert log.filter(record(full, pathname=__file__))


def test_a_refused_write_s_error_line_says_why_when_tensorstore_s_text_is_cut(tmp_path):
  """tensorstore's message names the file twice before the OS error: cut to 200 characters
  it lost "No space left on device"; the error line now says it first."""
  from dllm_rl.infra.checkpoint import CheckpointWriteError
  long_path = "/w/checkpoints/rl/8.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/_sharding"
  tensorstore = ValueError(f'RESOURCE_EXHAUSTED: Error writing local file "{long_path}": Failed'
                           f' writing: "{long_path}.__lock": Failed to write 15439 bytes to'
                           " file 18: No space left on device [os_error_code='28']")
  with Checkpointer(str(tmp_path / "ckpt"), keep=1, async_save=False) as ckpt:
    ckpt._writing = 8
    said = str(ckpt._write_failed(tensorstore))
    assert isinstance(ckpt._write_failed(tensorstore), CheckpointWriteError)
  assert said.startswith(f"saving checkpoint step 8 in {tmp_path}/ckpt failed ([Errno 28] No"
                         " space left on device; ValueError: RESOURCE_EXHAUSTED: "), said


@pytest.mark.filterwarnings("error:coroutine .* was never awaited:RuntimeWarning")
def test_a_step_folder_that_cannot_be_made_leaves_no_thread_waiting(tmp_path, monkeypatch):
  """An asynchronous save whose step folder the disk refuses (no rights, full): orbax's other
  commit threads waited 300 s for the folder's signal, and the process could not exit until
  they gave up (then each logged a TimeoutError). They end with the error now."""
  import errno
  import threading
  import time

  from orbax.checkpoint._src.futures import future

  from dllm_rl.infra.checkpoint import CheckpointWriteError
  real_makedirs = os.makedirs

  def refuse(path, *args, **kwargs):
    if ".orbax-checkpoint-tmp" in os.fspath(path):
      raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
    return real_makedirs(path, *args, **kwargs)

  with Checkpointer(str(tmp_path / "ckpt"), keep=1, async_save=True) as ckpt:
    monkeypatch.setattr(os, "makedirs", refuse)
    with pytest.raises(CheckpointWriteError, match=r"^saving checkpoint step 2 in .*Permission"
                                                   " denied"):
      ckpt.save(2, {"w": jnp.ones(3)}, {"at": 2})
      ckpt.wait()
    monkeypatch.undo()
  deadline = time.monotonic() + 1.0
  waiting = lambda: [t for t in threading.enumerate()
                     if isinstance(t, future._SignalingThread) and t.is_alive()]
  while waiting() and time.monotonic() < deadline:
    time.sleep(0.02)
  assert waiting() == []
  import gc
  with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    gc.collect()  # the cancelled commits' coroutines, never run, were closed: no warning
  assert [str(w.message) for w in said if "never awaited" in str(w.message)] == []


@pytest.mark.filterwarnings("error:coroutine .* was never awaited:RuntimeWarning")
def test_a_save_that_cannot_make_its_folder_leaves_another_checkpointer_s_save_alone(
    tmp_path, monkeypatch):
  """Two Checkpointers in one process: the second's asynchronous save is in flight (the
  creation of its step folder held back) when the first's save fails because its step folder
  cannot be made. Only the failed save's waiting commit threads are released: the other save
  still commits and restores (its commit threads were cancelled too, and its step was lost
  without a word)."""
  import errno
  import threading

  from orbax.checkpoint._src.futures import future

  from dllm_rl.infra.checkpoint import CheckpointWriteError
  real_makedirs = os.makedirs
  refused, held = str(tmp_path / "refused") + os.sep, str(tmp_path / "held") + os.sep
  reached, go_on = threading.Event(), threading.Event()

  def makedirs(path, *args, **kwargs):
    path = os.fspath(path)
    if ".orbax-checkpoint-tmp" in path and path.startswith(refused):
      raise PermissionError(errno.EACCES, "Permission denied", path)
    if ".orbax-checkpoint-tmp" in path and path.startswith(held):
      reached.set()
      go_on.wait(timeout=120.0)  # a bound against a hang, not a timing
    return real_makedirs(path, *args, **kwargs)

  with Checkpointer(held, keep=1, async_save=True) as other, \
       Checkpointer(refused, keep=1, async_save=True) as failing:
    monkeypatch.setattr(os, "makedirs", makedirs)
    try:
      other.save(1, {"w": jnp.arange(3.0)}, {"at": 1})
      assert reached.wait(timeout=120.0)  # its folder is being made: its commit waits for it
      with pytest.raises(CheckpointWriteError, match=r"^saving checkpoint step 2 in .*refused"
                                                     " failed .*Permission denied"):
        failing.save(2, {"w": jnp.ones(3)}, {"at": 2})
        failing.wait()
    finally:
      go_on.set()
    other.wait()
    monkeypatch.undo()
  # the failed save's threads were released (else they waited 300 s), and ended at its close
  assert [t for t in threading.enumerate()
          if isinstance(t, future._SignalingThread) and t.is_alive()] == []
  with Checkpointer(held, keep=1, read_only=True) as reader:
    restored, meta = reader.restore({"w": jnp.zeros(3)})
  assert meta == {"at": 1}
  np.testing.assert_array_equal(restored["w"], np.arange(3.0))


def test_a_damaged_step_that_cannot_be_deleted_is_a_write_error(tmp_path, monkeypatch):
  """Replacing a damaged step in a folder made read-only (or without our rights): its
  deletion's PermissionError is the one-line CheckpointWriteError naming the step and the
  folder, not a traceback."""
  import errno

  from dllm_rl.infra.checkpoint import CheckpointWriteError
  with Checkpointer(str(tmp_path / "ckpt"), keep=2, async_save=False) as ckpt:
    ckpt.save(2, {"w": jnp.ones(3)}, {"at": 2})
    ckpt._damaged.add(2)  # as first_readable marks a step it could not read

    def refuse(step):
      raise PermissionError(errno.EACCES, "Permission denied", f"{ckpt.directory}/{step}")

    monkeypatch.setattr(ckpt._manager, "delete", refuse)
    with pytest.raises(CheckpointWriteError, match=rf"^replacing damaged checkpoint step 2 in"
                                                   rf" {tmp_path}/ckpt failed \(PermissionError"
                                                   r": .*; the steps committed before it stand"):
      ckpt.save(2, {"w": jnp.full(3, 2.0)}, {"at": 2})
