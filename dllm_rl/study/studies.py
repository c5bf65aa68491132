"""The study as a library call: run the named studies, write their JSON, plots and the report.

``python -m dllm_rl.study`` (``__main__``) is its command line; tests and scripts call
:func:`study` without defining absl flags (``__main__`` defines them at import, and two entry
points defining the same flag cannot share a process).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time

from dllm_rl.config import testbeds
from dllm_rl.errors import ConfigError, raise_all
from dllm_rl.study import arms as arms_lib
from dllm_rl.study import arguments, provenance, reuse


def _load() -> str:
  try:
    return f"{os.getloadavg()[0]:.1f}"
  except OSError:
    return "n/a"


def chosen_arms(names: list[str], base, patterns: list[str] | None,
                ) -> tuple[dict[str, list[arms_lib.Arm]], list[str]]:
  """({study: its arms that match ``patterns``} of the studies that have any, in ``names``'
  order; the studies that have none). A study with no arm is skipped whole rather than run
  empty: it would train its SFT starts for nothing, and its plots have no panel to draw
  (matplotlib refuses a figure of 0 rows)."""
  chosen = {name: arms_lib.select(arms_lib.STUDIES.get(name)(base), patterns) for name in names}
  return {n: a for n, a in chosen.items() if a}, [n for n, a in chosen.items() if not a]


def short_run_warning(size: arms_lib.Size, rl_steps: int | None, eval_every: int | None,
                      testbed: str, quick: bool) -> str | None:
  """The warning, said before anything trains, when the arms run fewer RL steps than the
  validation interval: validation runs at step 0 and every ``size.eval_every`` steps, so
  none runs after the start, collapse (judged on validation) is not judged and the final
  validation accuracy is n/a in every arm. Names both flags, their values and where each
  came from (``rl_steps`` / ``eval_every``: the flags as given, None for the testbed's);
  None when some validation runs after step 0."""
  if size.rl_steps >= size.eval_every:
    return None
  where = f"the testbed {testbed}'s{' --quick' if quick else ''} default"
  steps = f"--rl_steps={size.rl_steps}" + ("" if rl_steps is not None else f" ({where})")
  every = f"--eval_every={size.eval_every}" + ("" if eval_every is not None else f" ({where})")
  return (f"warning: {steps} is below {every}: validation runs at step 0 and every"
          f" {size.eval_every} steps, so no arm validates after step 0; the report's collapse"
          " counts and final validation accuracy will say \"not judged\" and n/a, and the"
          f" verdicts rest on test accuracy alone. Give --rl_steps of at least {size.eval_every}"
          f" or --eval_every of at most {size.rl_steps} to judge collapse.")


def study(names: list[str], workdir: str, seeds: int | None, quick: bool,
          overrides: dict[str, object],
          results_md: str, command: str, rl_steps: int | None = None,
          eval_every: int | None = None, cache_dir: str | None = None,
          arm_patterns: list[str] | None = None, testbed: str = testbeds.DEFAULT,
          prefetch: bool | None = None, sft_seed: int = 0,
          reuse_from: list[str] | None = None, first_seed: int = 0) -> dict:
  """Run the named studies on ``testbed`` (its base config and run lengths,
  ``dllm_rl/config/testbeds.py``) and write their JSON, plots and the markdown report.
  ``arm_patterns``: only the arms matching one of these shell patterns. ``prefetch``: compile
  the arms' RL programs in the background ahead of the arm that trains (runner.run_study;
  None: on GPU and TPU only). ``sft_seed``: the seed of the one SFT start of a testbed whose
  seeds share it (runner.run_study). ``reuse_from``: study JSONs whose runs seed DIR where it
  has none, and against which the runs DIR has are checked (dllm_rl.study.reuse; a file of
  none of these studies, or of another testbed, is a ConfigError before anything is written).
  ``first_seed``: the seeds are ``seeds`` of them from this one (runner.seed_range). An
  override that every chosen arm of a study sets itself (``rl.lr``: the lr grid follows the
  base config) is a ConfigError before anything runs (arms.shadowed_overrides); a study
  ``arm_patterns`` leaves no arm of is skipped with a note (:func:`chosen_arms`); a count
  below 1, a negative seed or a path that cannot be written is a ConfigError naming its flag
  (arguments.argument_problems; None means the default)."""
  raise_all(arguments.argument_problems(workdir=workdir, results=results_md, seeds=seeds,
                                        rl_steps=rl_steps, eval_every=eval_every,
                                        first_seed=first_seed, sft_seed=sft_seed,
                                        arms=arm_patterns, reuse_from=reuse_from))
  base = testbeds.testbed(testbed).get_config()  # a ValueError listing the names when unknown
  provenance.git_commit()  # the code this process imported: read now, before any run
  import jax

  from dllm_rl.study import plots, report_files, runner

  size = arms_lib.size(testbed, quick)
  size = arms_lib.Size(rl_steps=size.rl_steps if rl_steps is None else rl_steps,
                       eval_every=size.eval_every if eval_every is None else eval_every,
                       seeds=size.seeds if seeds is None else seeds)  # None: the default
  if quick and "rl.warmup_steps" not in overrides:  # the full arm's warm-up, shrunk in step
    full = arms_lib.size(testbed, quick=False)
    overrides = {**overrides, "rl.warmup_steps": round(
        base.rl.warmup_steps * size.rl_steps / full.rl_steps)}
  chosen, empty = chosen_arms(names, base, arm_patterns)
  if not chosen:
    raise ConfigError("--arms", f"{', '.join(arm_patterns or ())} selects no arm of"
                      f" {', '.join(names)}")
  for name in empty:
    print(f"note: --arms={','.join(arm_patterns or ())} selects no arm of {name}: that study is"
          " skipped", file=sys.stderr, flush=True)
  named, names = names, list(chosen)  # a file of a study --arms skips is not unused by mistake
  raise_all(arms_lib.sized_overrides(overrides) + [
      e for name in names for e in arms_lib.shadowed_overrides(name, chosen[name], overrides)])
  seed_list = runner.seed_range(size.seeds, first_seed)  # a ConfigError when first_seed < 0
  if reuse_from:  # every file's problem before DIR is claimed (a rerun with the --testbed
    reuse.check_files(reuse_from, named, testbed)  # the error names must not find it claimed)
  runner.claim_workdir(workdir, testbed)  # DIR's testbed, then its finished runs: before any run
  runner.check_sft_starts(workdir, size.seeds, overrides, testbed, base, sft_seed, first_seed)
  reused = {}
  for name in names:
    arms = chosen[name]
    if reuse_from:  # written before the check below, which then covers them too
      reused[name] = reuse.reuse_runs(workdir, name, [a.name for a in arms], seed_list,
                                      reuse_from, testbed)
      print(f"[study] reused {reused[name]['line']}", flush=True)
    runner.check_finished_runs(name, arms, workdir, size.seeds, size, overrides, base,
                               first_seed)
  if (warning := short_run_warning(size, rl_steps, eval_every, testbed, quick)) is not None:
    print(warning, file=sys.stderr, flush=True)
  started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
  t0, load_start = time.monotonic(), _load()
  os.makedirs(workdir, exist_ok=True)
  done = []
  for name in names:
    with runner.compilation_cache(cache_dir):
      arms = chosen[name]
      result = runner.run_study(name, arms, workdir, size.seeds, size, overrides,
                                testbed=testbed, base=base, prefetch=prefetch,
                                sft_seed=sft_seed, first_seed=first_seed)
    result["command"], result["quick"] = command, quick
    with open(os.path.join(workdir, f"{name}.json"), "w") as fh:
      json.dump(result, fh)
    plots.curves(result, os.path.join(workdir, f"{name}_curves.png"))
    if name == "stability":
      plots.spikes(result, os.path.join(workdir, f"{name}_spikes.png"))
    done.append(result)
  meta = {"command": command, "quick": quick, "testbed": testbed, "machine": provenance.machine(),
          "load_start": load_start, "load_end": _load(), "jax": jax.__version__,
          "started": started, "commit": provenance.git_commit(),
          "wall_seconds": time.monotonic() - t0, "reused": reused}
  with open(os.path.join(workdir, "meta.json"), "w") as fh:
    json.dump(meta, fh, indent=2)
  report_files.write(done, meta, workdir, results_md)
  print(f"[study] wrote {results_md} ({meta['wall_seconds']:.0f} s)", flush=True)
  return {"studies": done, "meta": meta}
