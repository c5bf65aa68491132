"""``dllm-rl-data`` / ``python -m dllm_rl.data``:

    dllm-rl-data prepare gsm8k --out DIR|gs://BUCKET/data/gsm8k [--source train=FILE] [--limit N]
    dllm-rl-data weights GSAI-ML/LLaDA-8B-Instruct      # or gs://BUCKET/ckpt/LLaDA-8B-Instruct
    dllm-rl-data list

Exit status: 0 done; 2 a problem, printed as one ``error: ...`` line (unknown data set,
unreachable source with how to work offline, unavailable weights with how to fetch them).
"""

from __future__ import annotations

import argparse
import sys

from dllm_rl.data import prepare as prep
from dllm_rl.data.recipes import RECIPES
from dllm_rl.infra import weights
from dllm_rl.paths import BackendMissing

EXIT_ERROR = 2


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="dllm-rl-data", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("prepare", help="a named data set -> the trainer's JSONL files")
  p.add_argument("name", help=f"one of: {', '.join(sorted(RECIPES))}")
  p.add_argument("--out", required=True, help="output folder (local or gs://)")
  p.add_argument("--source", action="append", default=[], metavar="SPLIT=PATH",
                 help="read SPLIT (train / test; test only for an evaluation-only set) from "
                      "a local .jsonl/.json/.csv/.parquet file, a save_to_disk folder, or "
                      "another hub data set org/name[:config][@split]")
  p.add_argument("--limit", type=int, default=None, help="keep at most N rows per split")
  p.add_argument("--cache-dir", default=None, help="datasets cache (default: HF_DATASETS_CACHE)")
  p = sub.add_parser("weights", help="fetch a checkpoint into the local cache; print its folder")
  p.add_argument("spec", help="hub id (org/name[@revision]), gs:// folder or local folder")
  sub.add_parser("list", help="the data sets and their sources")
  return parser


def _list() -> None:
  for name, rec in sorted(RECIPES.items()):
    splits = "; ".join(f"{s}: {src.describe()}" for s, src in sorted(rec.splits.items()))
    print(f"{name} (task {rec.task}): {splits}" + (f" [{rec.note}]" if rec.note else ""))


def main(argv: list[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  try:
    if args.command == "list":
      _list()
    elif args.command == "weights":
      print(weights.resolve_checkpoint(args.spec))
    else:
      if args.limit is not None and args.limit < 1:
        raise prep.DataError(f"--limit must be >= 1, got {args.limit}")
      sources = dict(prep.parse_source(text) for text in args.source)
      manifest = prep.prepare(args.name, args.out, sources=sources, limit=args.limit,
                              cache_dir=args.cache_dir)
      for split, path in manifest["files"].items():  # train, then test (as prepared)
        dropped = sum(manifest["dropped"][split].values())
        print(f"{split}: {manifest['rows'][split]} rows -> {path}"
              + (f" ({dropped} dropped: see {prep.MANIFEST})" if dropped else ""))
      flags = manifest["config"]
      print("train / evaluate with: " + " ".join(flags) + (
          " (from a checkout's root; add what the config names as required, e.g."
          " --config.model.hf_checkpoint)" if flags[0].startswith("--config=")
          else " and a --config file whose model and prompt width suit the task"))
  except (prep.DataError, weights.WeightsUnavailable, BackendMissing, ValueError) as err:
    print(f"error: {err}", file=sys.stderr)
    return EXIT_ERROR
  return 0


def run() -> None:
  """Console-script entry point (pyproject.toml): ``dllm-rl-data``."""
  sys.exit(main())


if __name__ == "__main__":
  run()
