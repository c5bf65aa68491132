"""Entry point.

    python -m dllm_rl.main --workdir=DIR [--config.rl.lr=1e-3 ...]    # embedded tiny default
    python -m dllm_rl.main --config=configs/tiny_cpu.py --workdir=DIR [--config.sft.lr=3e-4 ...]

``--config.KEY=VALUE`` overrides any key of the config file or of the embedded default; the
value is parsed as the type of the key. The config is validated before anything is compiled.

Exit status (``-h`` / ``--help`` / ``--helpfull``: the usage, 0):

* 0: the run finished (``summary.json`` written);
* 2: a usage error (a stray argument, an unknown flag), a config problem or a missing
  input. Every config problem is printed at once, one line each, as
  ``error: config.<key>: <message>`` (unknown keys, wrong types, bad values; mode ``rl`` /
  ``eval`` with neither the checkpoint it starts from nor ``model.hf_checkpoint``; a data file
  smaller than the split), or ``error: <file>: <message>`` (a gs:// path without gcsfs, a
  missing file), with no traceback;
* 75 (``EX_TEMPFAIL``): stopped by SIGTERM/SIGINT after saving a checkpoint at the step in
  progress (``mode=eval``, which saves nothing: at once); rerun the same command to resume
  (``dllm_rl.train.resilience``). A second signal
  exits at once with 128 + the signal number (143 for SIGTERM, 130 for SIGINT);
* 1: the run failed: e.g. ``train.max_consecutive_nonfinite`` non-finite updates in a row,
  no readable checkpoint, a checkpoint that could not be written (``error: ...`` names the
  step / the checkpoint), another write the disk refused (full, over quota, read-only, or a
  file in the workdir without write rights: metrics, curves, summary; ``error: a write failed
  (...)``). Orbax's and TensorBoard's tracebacks of such a write are not printed.

Re-running with the same ``--workdir`` resumes from the latest checkpoint.
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags, logging

from dllm_rl.config import cli
from dllm_rl.config.defaults import get_config as default_config
from dllm_rl.errors import DISK_ERRNOS, ConfigError, refused_errno
from dllm_rl.paths import BackendMissing

_CONFIG = flags.DEFINE_string("config", None,
                              "ml_collections config file (default: the embedded tiny CPU config).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, summary.")
_overrides: list[tuple[str, str]] = []


def _refused_write(err: OSError, workdir: str) -> bool:
  """Whether ``err`` is a write in ``workdir`` that the disk or the folder's rights refused
  (outside a checkpoint save, which names its step: CheckpointWriteError); no rights count
  only for a file in the workdir (an input's is not a write). ``err``'s own errno decides, not
  its cause's (:func:`dllm_rl.errors.refused_errno`)."""
  code = refused_errno(err)
  if code in DISK_ERRNOS:
    return True
  if code is None or not isinstance(err.filename, (str, bytes)):  # rights: where it wrote
    return False
  inside = os.path.abspath(os.fsdecode(err.filename)) + os.sep
  return inside.startswith(os.path.abspath(workdir) + os.sep)


def load(path: str | None, overrides: list[tuple[str, str]]):
  """The config file (or the embedded default) with the overrides applied and validated;
  exits with status 2 listing every problem."""
  from dllm_rl.train.validate import validate
  return cli.load(path, overrides, check=validate, default=default_config)


def main(argv):
  if len(argv) > 1:
    raise cli.usage_error(f"unexpected arguments: {argv[1:]}")
  if not _WORKDIR.value:
    cli.fail([ConfigError("--workdir", "required: the run's folder (checkpoints, metrics,"
                                       " summary; a rerun resumes from it)")])
  config = load(_CONFIG.value, _overrides)
  from dllm_rl.infra.checkpoint import CheckpointError
  from dllm_rl.train import modes as run  # after flag parsing: keeps --help fast
  from dllm_rl.train.resilience import EXIT_PREEMPTED, NonFiniteError, Preempted

  logging.set_verbosity(logging.WARNING)  # orbax is chatty at INFO

  try:
    summary = run.run(config, _WORKDIR.value)
  except ConfigError as err:
    cli.fail([err])
  except Preempted as stop:
    print(f"[preemption] {stop}", file=sys.stderr, flush=True)
    sys.exit(EXIT_PREEMPTED)
  except (NonFiniteError, CheckpointError) as err:  # before FileNotFoundError, its base class
    print(f"error: {err}", file=sys.stderr)
    sys.exit(1)
  except (BackendMissing, FileNotFoundError) as err:  # --workdir=gs://... without gcsfs; a
    print(f"error: {err}", file=sys.stderr)  # missing input, named in the message
    sys.exit(cli.EXIT_CONFIG)
  except OSError as err:  # metrics.jsonl, TensorBoard, the curves, a summary on a full disk
    if not _refused_write(err, _WORKDIR.value):
      raise
    print(f"error: a write failed ({err}); the checkpoints committed before it stand: free"
          " space or fix the folder's rights, then rerun the same command to resume from the"
          " newest", file=sys.stderr)
    sys.exit(1)
  print(json.dumps(summary, indent=2))


def run():
  """Console-script entry point (pyproject.toml)."""
  _overrides.clear()  # a second call in one process (tests) starts from none
  cli.run_app(main, _overrides, sys.modules[__name__])


if __name__ == "__main__":
  run()
