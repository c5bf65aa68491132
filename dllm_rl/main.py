"""Entry point.

    python -m dllm_rl.main --workdir=DIR                       # embedded tiny default
    python -m dllm_rl.main --config=configs/tiny_cpu.py --workdir=DIR [--config.sft.lr=3e-4 ...]

The config is validated before anything is compiled; a bad key or value exits
with status 2 and a message that names it. Re-running with the same
``--workdir`` resumes from the latest checkpoint.
"""

from __future__ import annotations

import json
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from dllm_rl.config import ConfigError
from dllm_rl.default_config import get_config as default_config

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "ml_collections config file (default: the embedded tiny CPU config).",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, summary.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not _WORKDIR.value:
    raise app.UsageError("--workdir is required")
  config = _CONFIG.value if _CONFIG.value is not None else default_config()
  from dllm_rl import run  # after flag parsing: keeps --help fast

  logging.set_verbosity(logging.WARNING)  # orbax is chatty at INFO

  try:
    summary = run.run(config, _WORKDIR.value)
  except ConfigError as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)
  print(json.dumps(summary, indent=2))


if __name__ == "__main__":
  app.run(main)
