"""``python -m dllm_rl.convert`` (console script ``dllm-rl-convert``): HF checkpoints in and
out of the framework.

    python -m dllm_rl.convert import    --hf_dir HF_DIR --out CKPT_DIR [--dtype float32]
    python -m dllm_rl.convert export    --workdir RUN_DIR [--phase auto|sft|rl] [--step N]
                                        --hf_dir OUT_DIR [--dtype bfloat16] [--max_shard_bytes 5e9]
                                        [--hf_source HF_DIR]
    python -m dllm_rl.convert export    --ckpt CKPT_DIR --hf_dir OUT_DIR [--dtype bfloat16]
    python -m dllm_rl.convert roundtrip --hf_dir HF_DIR --tmp TMP_DIR

* ``import``: an HF folder → a ``convert import`` folder (:mod:`dllm_rl.models.convert`).
* ``export --workdir``: a training run's checkpoint → an HF folder that
  ``dllm_rl.load_pretrained`` and ``model.hf_checkpoint`` read (:mod:`dllm_rl.train.export`).
  ``--phase`` auto (default) = the newest phase with a checkpoint (rl, else sft); ``--step``
  -1 (default) = its newest step; RL steps are rollout batches. ``--out`` is ``--hf_dir``.
  A run from ``model.hf_checkpoint`` copies that folder's config.json and tokenizer files
  (and rebuilds a LoRA run's base from its weights): ``--hf_source`` names the folder to read
  them from instead, when it has moved since the run.
* ``export --ckpt``: a ``convert import`` folder back to an HF folder.
* ``roundtrip``: import, export and check that every exported tensor equals the original
  byte for byte (exit 1 otherwise).

Each command prints its throughput (MB of tensors per second) and the peak RSS. Bad input
(missing folder or checkpoint, a step that is not saved, unsupported architecture, missing
tensor, shape mismatch, existing output) exits with status 2 and one ``error:`` line naming it.

Processes: ``export --workdir`` first initialises ``jax.distributed`` from the environment as
``dllm_rl.main`` does with the default ``config.distributed`` (the DLLM_* variables, a multi-task
SLURM step, Open MPI, a TPU slice) and runs on all of them: process 0 writes the folder, the
others add their devices and wait (:mod:`dllm_rl.train.export`). ``import``, ``roundtrip`` and
``export --ckpt`` run on one process and never join ``jax.distributed`` (one worker of a
multi-host TPU slice runs them alone); under a multi-process launch (DLLM_*, a SLURM step of
several tasks, an Open MPI world) each exits 2 saying so, since every process would write the
whole folder into the same place.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
from typing import Any

from dllm_rl.errors import ConfigError
from dllm_rl.train.checkpoint_choice import AUTO, LATEST, PHASES

# JAX, Orbax and the model code are imported by the commands, after the arguments are parsed,
# as dllm_rl.main does: `--help` and a usage error answer in a fraction of a second, not ~2 s.

DTYPES = ("float32", "bfloat16", "float16")


def _peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _report(what: str, stats: dict[str, Any]) -> None:
  mb = stats["bytes"] / 1e6
  parts = ", ".join(f"{k} {v:.3f}" for k, v in stats.items() if k.endswith("_s") and k != "total_s")
  print(f"{what} [{stats['family']}]: {mb:.2f} MB in {stats['total_s']:.3f} s "
        f"({mb / max(stats['total_s'], 1e-9):.1f} MB/s; {parts}); "
        f"peak RSS {_peak_rss_mb():.0f} MB")


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="python -m dllm_rl.convert", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("import", help="HF folder -> Orbax params + model.json")
  p.add_argument("--hf_dir", required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  p = sub.add_parser("export", help="a training run's checkpoint (--workdir) or an imported"
                                    " folder (--ckpt) -> HF folder")
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--workdir", help="a training run's --workdir")
  src.add_argument("--ckpt", help="a `convert import` folder")
  p.add_argument("--phase", default=AUTO, choices=(AUTO, *PHASES),
                 help="--workdir: the phase (default: the newest with a checkpoint)")
  p.add_argument("--step", type=int, default=LATEST,
                 help="--workdir: the saved step (SFT steps, RL rollout batches; -1 = newest)")
  p.add_argument("--hf_dir", "--out", dest="hf_dir", required=True, help="the new HF folder")
  p.add_argument("--dtype", default=None, choices=DTYPES,
                 help="tensor dtype written (default: the params' dtype)")
  p.add_argument("--max_shard_bytes", type=float, default=5e9)
  p.add_argument("--peft_dir", default=None,
                 help="--workdir of a LoRA run: also write its adapters as a PEFT folder here")
  p.add_argument("--hf_source", default=None, metavar="DIR",
                 help="--workdir of a run from model.hf_checkpoint: the folder to read that"
                      " source's config.json and tokenizer files (a LoRA run's base weights"
                      " too) from, when it has moved since the run (default: the path the run"
                      " recorded)")
  p = sub.add_parser("roundtrip", help="import, export and compare tensors byte for byte")
  p.add_argument("--hf_dir", required=True)
  p.add_argument("--tmp", required=True)
  return parser


def one_process(command: str, env=None) -> None:
  """ValueError when a multi-process launch started this process (``distributed.plan`` finds
  the DLLM_* variables, a SLURM step of several tasks or an Open MPI world; a TPU slice's own
  variables do not count): ``command`` writes its whole folder from each process, all into the
  same place. Nothing is initialised."""
  from dllm_rl.parallel import distributed

  env = os.environ if env is None else env
  launch_env = {k: v for k, v in env.items() if not k.startswith(("TPU_", "MEGASCALE_"))}
  p = distributed.plan(None, launch_env, cloud_tpu_vm=False)
  if p.kind != "single":
    raise ValueError(f"`convert {command}` runs on one process, and this one was started by a"
                     f" multi-process launch ({p.reason.removeprefix('auto: ')}): run it once,"
                     " on one machine, outside the launch; only `convert export --workdir`"
                     " runs on several")


def _export(args) -> None:
  import jax

  from dllm_rl.models import convert
  from dllm_rl.parallel import distributed
  from dllm_rl.train.export import export_run
  from dllm_rl.train.run_checkpoints import NoCheckpoint

  if args.ckpt is not None:
    one_process("export --ckpt")
    try:  # a file there, or on the way there: named as the flag before anything is read
      convert.check_new_hf_dir(args.hf_dir)
    except convert.OutputFolderError as err:
      raise ConfigError("--hf_dir", str(err)) from None
    if (args.phase, args.step) != (AUTO, LATEST):
      raise ValueError("--phase / --step choose a checkpoint of a --workdir run; --ckpt has one")
    if args.hf_source is not None:
      raise ConfigError("--hf_source", "only with --workdir (a run's source folder): a --ckpt"
                        " folder holds its own config.json and tokenizer files")
    _report("export", convert.export_hf(args.ckpt, args.hf_dir, dtype=args.dtype,
                                        max_shard_bytes=args.max_shard_bytes))
    return
  distributed.initialize(None)  # dllm_rl.main's default: before anything touches a device
  try:  # every process (export.py): process 0 writes
    stats = export_run(args.workdir, args.hf_dir, phase=args.phase, step=args.step,
                       dtype=args.dtype, max_shard_bytes=args.max_shard_bytes,
                       peft_dir=args.peft_dir, hf_source=args.hf_source)
  except NoCheckpoint as err:
    raise NoCheckpoint(err.what, f"--{err.what}: {err}") from None
  if distributed.is_primary():
    _report(f"export {stats['label']}", stats)
  else:
    print(f"export {stats['label']} [{stats['family']}]: process {jax.process_index()} of"
          f" {jax.process_count()} gathered its shards; process 0 wrote {args.hf_dir}")


def _roundtrip(args) -> int:
  from dllm_rl.models import convert, hf

  try:
    convert.check_new_folder(args.tmp)
  except convert.OutputFolderError as err:
    raise ConfigError("--tmp", str(err)) from None
  os.makedirs(args.tmp, exist_ok=True)
  work = tempfile.mkdtemp(prefix="roundtrip_", dir=args.tmp)
  ckpt, out = os.path.join(work, "ckpt"), os.path.join(work, "hf")
  _report("import", convert.import_hf(args.hf_dir, ckpt))
  _report("export", convert.export_hf(ckpt, out, dtype=convert.source_dtype(args.hf_dir)))
  problems = convert.compare_tensors(args.hf_dir, out)
  if problems:
    print(f"roundtrip FAILED ({len(problems)} differences):\n  " + "\n  ".join(problems[:20]))
    return 1
  n = len(hf.tensor_index(out)[0])
  print(f"roundtrip OK: {n} tensors byte-identical ({out})")
  return 0


def main(argv: list[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  try:
    if args.command == "import":
      from dllm_rl.models import convert

      one_process("import")
      try:  # the library checks --out before it reads the source: named here as the flag
        stats = convert.import_hf(args.hf_dir, args.out, dtype=args.dtype)
      except convert.OutputFolderError as err:  # a file there or on the way, a checkpoint there
        raise ConfigError("--out", str(err)) from None
      _report("import", stats)
    elif args.command == "export":
      _export(args)
    else:
      one_process("roundtrip")
      return _roundtrip(args)
  except (FileNotFoundError, FileExistsError, NotADirectoryError, ValueError, KeyError,
          json.JSONDecodeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


def run() -> None:
  """Console-script entry point (pyproject.toml): ``dllm-rl-convert``."""
  sys.exit(main())


if __name__ == "__main__":
  run()
