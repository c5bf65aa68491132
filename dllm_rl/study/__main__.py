"""``python -m dllm_rl.study NAME --workdir=DIR [--seeds=N] [--quick] [--config.key=value ...]``

NAME: ``stability``, ``steprs``, ``baselines`` or ``all`` (every registered study). Trains one SFT checkpoint per seed,
runs every arm from it, writes ``DIR/<study>.json`` (every run, per-step
records, per-arm summaries), ``DIR/<study>_curves.png`` / ``_spikes.png``, and
``--results`` (default ``docs/results.md``, plots and JSON copied to
``docs/results/``) from that JSON. ``--config.KEY=VALUE`` (or the older spelling
``--set=KEY=VALUE``) overrides a config key of every run (e.g. tiny sizes for tests), parsed
as ``python -m dllm_rl.main`` parses it (dllm_rl.config.cli: every problem printed, exit
status 2). Finished arms are reused on rerun.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time

from absl import app, flags, logging

from dllm_rl.config import cli
from dllm_rl.config.defaults import get_config as default_config
from dllm_rl.errors import ConfigError
from dllm_rl.study import arms as arms_lib

_WORKDIR = flags.DEFINE_string("workdir", None, "Study directory (SFT, arms, JSON, plots).")
_SEEDS = flags.DEFINE_integer("seeds", None, "Seeds (default 3; 1 with --quick).")
_QUICK = flags.DEFINE_bool("quick", False, "1 seed, fewer RL steps: a smoke run of the study.")
_ARMS = flags.DEFINE_list("arms", None, "Only the arms whose names match one of these shell"
                          " patterns (e.g. 'grpo@*,stabledrl@*'); default: every arm.")
_overrides: list[tuple[str, str]] = []  # --config.KEY=VALUE and --set=KEY=VALUE
_RESULTS = flags.DEFINE_string("results", "docs/results.md", "Markdown report to write.")
_STEPS = flags.DEFINE_integer("rl_steps", None, "RL steps per arm (default: the study size).")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", None, "Validation every N RL steps.")


def _machine() -> str:
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as fh:
      names = [l.split(":", 1)[1].strip() for l in fh if l.startswith("model name")]
    cpu = names[0] if names else cpu
  except OSError:
    pass
  return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores ({cpu})"


def _load() -> str:
  try:
    return f"{os.getloadavg()[0]:.1f}"
  except OSError:
    return "n/a"


def study(names: list[str], workdir: str, seeds: int | None, quick: bool,
          overrides: dict[str, object],
          results_md: str, command: str, rl_steps: int | None = None,
          eval_every: int | None = None, cache_dir: str | None = None,
          arm_patterns: list[str] | None = None) -> dict:
  """Run the named studies and write their JSON, plots and the markdown report.
  ``arm_patterns``: only the arms matching one of these shell patterns."""
  import jax

  from dllm_rl.study import plots, report, runner

  size = arms_lib.QUICK if quick else arms_lib.FULL
  size = arms_lib.Size(rl_steps=rl_steps or size.rl_steps,
                       eval_every=eval_every or size.eval_every,
                       seeds=seeds or size.seeds)
  started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
  t0, load_start = time.time(), _load()
  os.makedirs(workdir, exist_ok=True)
  done = []
  for name in names:
    with runner.compilation_cache(cache_dir):
      result = runner.run_study(name, arms_lib.select(arms_lib.STUDIES.get(name)(), arm_patterns),
                                workdir, size.seeds, size,
                                overrides)
    result["command"], result["quick"] = command, quick
    with open(os.path.join(workdir, f"{name}.json"), "w") as fh:
      json.dump(result, fh)
    plots.curves(result, os.path.join(workdir, f"{name}_curves.png"))
    if name == "stability":
      plots.spikes(result, os.path.join(workdir, f"{name}_spikes.png"))
    done.append(result)
  meta = {"command": command, "quick": quick, "machine": _machine(), "load_start": load_start,
          "load_end": _load(), "jax": jax.__version__, "started": started,
          "wall_seconds": time.time() - t0}
  with open(os.path.join(workdir, "meta.json"), "w") as fh:
    json.dump(meta, fh, indent=2)
  report.write(done, meta, workdir, results_md)
  print(f"[study] wrote {results_md} ({meta['wall_seconds']:.0f} s)", flush=True)
  return {"studies": done, "meta": meta}


def main(argv):
  if len(argv) != 2:
    raise app.UsageError("usage: python -m dllm_rl.study NAME --workdir=DIR; NAME: "
                         f"{', '.join(arms_lib.STUDIES.names())} or all")
  name = argv[1]
  if name != "all" and name not in arms_lib.STUDIES:
    raise app.UsageError(arms_lib.STUDIES.unknown_message(name))
  if not _WORKDIR.value:
    raise app.UsageError("--workdir is required")
  logging.set_verbosity(logging.WARNING)
  names = arms_lib.STUDIES.names() if name == "all" else [name]
  names = sorted(names, key=lambda n: n != "stability")  # stability first
  if (problem := arms_lib.unmatched(names, _ARMS.value)) is not None:
    raise app.UsageError(problem)
  command = "python -m dllm_rl.study " + " ".join(sys.argv[1:])
  from dllm_rl.train.validate import validate
  config = cli.load(None, _overrides, check=validate, default=default_config)  # exits 2, all
  overrides = cli.override_values(config, _overrides)
  try:
    study(names, _WORKDIR.value, _SEEDS.value, _QUICK.value, overrides, _RESULTS.value, command,
          _STEPS.value, _EVAL_EVERY.value, os.path.join(_WORKDIR.value, "jax_cache"), _ARMS.value)
  except ConfigError as err:
    cli.fail([err])


def run():
  """Console-script entry point (pyproject.toml)."""
  app.run(main, flags_parser=cli.flags_parser(_overrides, aliases=("--set=",)))


if __name__ == "__main__":
  run()
