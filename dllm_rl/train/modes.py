"""Mode dispatch: ``run(config, workdir)`` validates, builds the context, runs the mode.

One runner is registered per name of ``dllm_rl.config.choices.RUN_MODES`` (the list
validation checks ``config.mode`` against); an import-time check keeps the two equal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time

from dllm_rl import paths
from dllm_rl.config.choices import RUN_MODES
from dllm_rl.config.unread import unread_settings
from dllm_rl.errors import ConfigError
from dllm_rl.registry import Registry

RUNNERS: Registry = Registry("mode")


@RUNNERS.register("sft")
def _sft(ctx) -> dict:
  from dllm_rl.train.sft_loop import run_sft
  return run_sft(ctx)


@RUNNERS.register("eval")
def _eval(ctx) -> dict:
  from dllm_rl.train.eval_mode import run_eval
  return run_eval(ctx)


@RUNNERS.register("rl")
def _rl(ctx) -> dict:
  from dllm_rl.train.rl_loop import run_rl
  return run_rl(ctx)


@RUNNERS.register("pipeline")
def _pipeline(ctx) -> dict:
  """SFT warm-up → RL → held-out evaluation (each phase plots its curves). A stop request
  that came during SFT's test evaluation stops the run before RL starts."""
  from dllm_rl.train.resilience import Preempted, stop_agreed
  from dllm_rl.train.rl_loop import check_rl_start_before_sft, run_rl, sft_steps
  from dllm_rl.train.sft_loop import run_sft

  if ctx.config.sft.steps == 0:  # RL's start must exist already: said before SFT evaluates
    sft_steps(ctx)
  check_rl_start_before_sft(ctx)  # RL checkpoints that SFT's training would orphan
  sft = run_sft(ctx)
  if stop_agreed():  # a signal during SFT's test evaluation: stop before RL starts
    raise Preempted("sft", sft["sft_steps"], "stopped on request after the SFT phase (its"
                    " checkpoint and test evaluation are saved); rerun the same command to"
                    " start RL")
  rl = run_rl(ctx)
  return {**sft, **rl, "pass_at_k": rl["rl_pass_at_k"], "rl_gain": _rl_gain(sft, rl),
          "plot": rl["rl_plot"]}


def _rl_gain(sft: dict, rl: dict) -> float | None:
  """RL's test accuracy minus that of the SFT step it started from; None, said on stderr, when
  SFT's summary evaluated another step (its newest, damaged since it was recorded: RL fell
  back to an older one)."""
  start = rl.get("rl_sft_start")
  if start is not None and start != sft["sft_steps"]:
    print(f"[pipeline] warning: rl_gain not computed: RL started from SFT step {start}, the SFT"
          f" test accuracy is that of step {sft['sft_steps']}", file=sys.stderr, flush=True)
    return None
  return rl["rl_accuracy"] - sft["sft_accuracy"]


if set(RUNNERS) != set(RUN_MODES):  # one list of modes: validation's and the runners'
  raise ImportError(f"run modes {sorted(RUNNERS)} differ from config.choices.RUN_MODES")


def enable_compilation_cache(path: str) -> str | None:
  """Turn on JAX's persistent compilation cache in ``path`` (``~`` expanded; a gs:// URL
  stays one); returns the directory, or None when ``path`` is empty (off). When ``path`` is
  the config's default and a cache directory was already set through JAX (the environment's
  ``JAX_COMPILATION_CACHE_DIR``, or ``jax.config``), that directory is kept and returned: the
  default does not override the user's JAX setting; a ``compilation_cache`` set in the
  config does."""
  if not path:
    return None
  import os

  import jax

  from dllm_rl.config.schema import DEFAULT_COMPILATION_CACHE
  if path == DEFAULT_COMPILATION_CACHE and jax.config.jax_compilation_cache_dir:
    return jax.config.jax_compilation_cache_dir
  directory = os.fspath(paths.resolve(os.path.expanduser(path)))
  if not paths.is_url(directory) and os.path.exists(directory) and not os.path.isdir(directory):
    raise ConfigError("compilation_cache", f"{directory} is a file, not a folder (JAX would"
                      " run without its cache, saying so only in a warning); name a folder, or"
                      " '' to turn the cache off")
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)  # only slow compiles
  return directory


@contextlib.contextmanager
def open_writers(config, workdir: str, *, enabled: bool):
  """The run's metric writers beside metrics.jsonl and TensorBoard: W&B when
  ``log.wandb_project`` is set (primary process only), given the resolved config; closed at
  the end (a preempted run with exit code 75, a failed one with 1)."""
  g = config.log
  if not (enabled and g.wandb_project):
    yield ()
    return
  from dllm_rl.infra.writers import WandbWriter
  from dllm_rl.train.resilience import EXIT_PREEMPTED, Preempted
  try:
    writer = WandbWriter.open(workdir, project=g.wandb_project, entity=g.wandb_entity,
                              name=g.wandb_name, config=json.loads(config.to_json_best_effort()))
  except Exception as err:  # wandb.errors.*: no API key, no network, a bad entity  # noqa: BLE001
    if type(err).__module__.split(".")[0] != "wandb":
      raise
    raise ConfigError("log.wandb_project", f"W&B could not start the run ({type(err).__name__}:"
                      f" {err}): run `wandb login` or set WANDB_API_KEY, or WANDB_MODE=offline"
                      " to write it under the workdir for a later `wandb sync`") from None
  try:
    yield (writer,)
  except Preempted:
    writer.close(exit_code=EXIT_PREEMPTED)
    raise
  except BaseException:
    writer.close(exit_code=1)
    raise
  writer.close()


LOCK_FILE = ".dllm_rl.lock"


def _take_lock(workdir: str) -> int:
  """An open descriptor of ``workdir/.dllm_rl.lock`` holding its ``flock`` (not locked where
  the file system has no ``flock``); ConfigError naming ``--workdir`` and the holder when
  another process holds it."""
  import fcntl
  import os
  import socket
  fd = os.open(os.path.join(workdir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "holder unknown"
    os.close(fd)
    raise ConfigError("--workdir", f"{workdir} is in use by another training run ({holder}):"
                      " two runs in one folder overwrite each other's checkpoints and"
                      " metrics; wait for it to end or stop it, or use another --workdir"
                      ) from None
  except OSError:  # no flock on this file system (some network mounts): not locked
    return fd
  os.ftruncate(fd, 0)
  os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since"
                f" {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
  return fd


@contextlib.contextmanager
def workdir_lock(workdir: str, *, enabled: bool):
  """Hold an exclusive lock on ``workdir/.dllm_rl.lock`` for the duration (a training run):
  a second training run started on the same local folder (the command given twice, a
  scheduler's requeue while the first still runs) is a ConfigError naming ``--workdir`` and
  the holder, instead of the two deleting each other's checkpoint writes and superseding each
  other's metrics. Process 0 takes the lock; every process calls this at the same point and
  learns whether it could, so that all of them stop with the error (not process 0 alone, the
  others waiting for it in their first collective). A URL workdir, or a file system without
  ``flock``, is not locked. The lock goes with the process (the file stays)."""
  if not enabled or paths.is_url(workdir):
    yield
    return
  import os

  from dllm_rl.parallel.distributed import is_primary, raise_agreed
  fd, failure = None, None
  if is_primary():
    try:
      fd = _take_lock(workdir)
    except Exception as err:  # noqa: BLE001  (said to every process first, raised below)
      failure = err
  raise_agreed(failure, ConfigError(
      "--workdir", f"{workdir} is in use by another training run, or its lock file could not"
      " be opened: process 0 could not lock it (its error names the holder)"))
  try:
    yield
  finally:
    if fd is not None:
      os.close(fd)  # releases the lock


def mesh_notes(mesh) -> list[str]:
  """A line when the mesh leaves devices idle (a fully specified ``mesh`` smaller than the
  device count uses the first devices: dllm_rl.parallel.mesh.make_mesh)."""
  import jax
  used, have = mesh.devices.size, jax.device_count()
  if used >= have:
    return []
  shape = ", ".join(f"{name}={size}" for name, size in mesh.shape.items())
  return [f"config.mesh ({shape}) uses {used} of the {have} devices; the others stay idle"
          " (set an axis to -1 to fill them)"]


def run(config, workdir: str, *, quiet_unread=()) -> dict:
  """Run ``config.mode``; write ``workdir/config_<mode>.json`` (the resolved config,
  overrides applied; rewritten by each run of that mode, so an eval run never replaces the
  training run's) and, for the training modes, ``workdir/summary.json``; return the summary.
  ``eval`` writes its own ``eval_<task>_<label>.json`` instead (dllm_rl.train.eval_mode), so
  the training run's summary stays. With ``log.wandb_project`` the W&B run (:func:`open_writers`)
  gets the resolved config, every metrics record and sample of the phases, and the summary.

  SIGTERM / SIGINT during training save a checkpoint after the current step and raise
  ``dllm_rl.train.resilience.Preempted`` (no summary is written); during ``eval`` the first
  signal raises it at once (nothing to save); see that module.
  ``quiet_unread``: keys whose "not read" warning (dllm_rl.config.unread) is not printed."""
  from dllm_rl.parallel.distributed import initialize
  from dllm_rl.train.context import build_context, prepare_workdir
  from dllm_rl.train.validate import validate

  t0 = time.monotonic()
  workdir = paths.expand(workdir)  # --workdir=~/run: the shell does not expand it
  validate(config)
  initialize(config.distributed)  # before anything touches devices
  enable_compilation_cache(config.compilation_cache)
  from dllm_rl.train.resilience import handle_signals
  from dllm_rl.parallel.distributed import is_primary
  training = config.mode != "eval"  # eval writes only its own files, beside a training run
  with handle_signals(saves=training):
    mesh = prepare_workdir(config, workdir)  # made, nothing of the run written or read yet
    with workdir_lock(workdir, enabled=training):  # a run on it already: before reading data
      ctx = build_context(config, workdir, mesh)
      if is_primary():
        # settings that change nothing, said before anything compiles
        for line in (unread_settings(config, quiet_unread) + list(ctx.notes)
                     + mesh_notes(ctx.mesh)):
          print(f"warning: {line}", file=sys.stderr, flush=True)
        # the resolved config of this run (file + overrides), for the record
        paths.write_atomic(paths.join(workdir, f"config_{config.mode}.json"),
                           config.to_json_best_effort(indent=2, sort_keys=True) + "\n")
      with open_writers(config, workdir, enabled=is_primary()) as writers:
        summary = {"mode": config.mode,
                   **RUNNERS.get(config.mode)(dataclasses.replace(ctx, writers=writers))}
        summary["wall_seconds"] = time.monotonic() - t0
        for writer in writers:
          writer.summary(summary)
      if is_primary() and training:
        # whole or not at all: a study reuses a start whose summary.json exists
        paths.write_atomic(paths.join(workdir, "summary.json"), json.dumps(summary, indent=2))
  return summary
