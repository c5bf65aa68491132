"""Run a study: SFT once per seed, then every arm from that seed's SFT checkpoint.

Runs go through the public ``dllm_rl.train.modes.run(config, workdir)``: SFT in
``DIR/sft/seed<k>`` (``config.mode=sft``; shared by the studies run in one DIR; on a testbed
with ``shared_sft``, only ``DIR/sft/seed0``, which every seed's arms start from), each arm in
``DIR/<study>/seed<k>/<arm>`` (``config.mode=rl``) with a copy of the SFT
checkpoint under ``checkpoints/sft``, which ``rl`` mode restores. A finished arm
keeps ``run.json`` and is not rerun, so an interrupted study resumes. Every run is the
study's base config (the testbed's, ``dllm_rl/config/testbeds.py``) with overrides; a DIR
holds one testbed (``DIR/testbed.txt``), so SFT starts of different testbeds never mix.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import time

import ml_collections
import numpy as np

from dllm_rl.config import testbeds
from dllm_rl.study import provenance, stats
from dllm_rl.study.arms import Arm, Size

STEP_KEYS = ("reward_mean", "accuracy", "grad_norm", "grad_norm_max", "ratio_max",
             "ratio_max_first", "log_ratio_max", "bypass_fraction", "clip_fraction", "loss",
             "entropy", "adv_abs_mean", "malformed_fraction") + tuple(
                 f"abs_log_ratio_{q}{w}" for q in ("p50", "p90", "p99", "max")
                 for w in ("", "_first"))


def _numbers(xs) -> list[float]:
  """``xs`` without None and NaN (a step with no value: NaN compares false with everything,
  so Python's max over a list holding one depends on where it stands); ±inf stay."""
  return [x for x in xs if x is not None and x == x]


def ratio_summary(records: list[dict]) -> dict:
  """|log ρ̂| of a run: for each per-step batch quantile (p50 / p90 / p99, at the first inner
  step and averaged over the inner steps), its median over the steps; the max over steps of
  the per-step max. Keys ``p50_first`` … ``max_first``, ``p50_all`` … ``max_all``. Steps
  without the value (None, NaN) are left out."""
  out = {}
  for when, suffix in (("first", "_first"), ("all", "")):
    for q in ("p50", "p90", "p99", "max"):
      xs = _numbers(r.get(f"abs_log_ratio_{q}{suffix}") for r in records)
      out[f"{q}_{when}"] = (None if not xs else
                            float(max(xs)) if q == "max" else float(np.median(xs)))
  return out


_STUDY_CACHE: str | None = None  # the study's cache directory while compilation_cache is open


@contextlib.contextmanager
def compilation_cache(cache_dir: str | None):
  """JAX's persistent compilation cache in ``cache_dir`` for the arms of a study: the
  samplers and evaluators of every arm have the same programs, so only the first compiles
  them. While it is open, each run's own ``config.compilation_cache`` is switched off, so a
  run does not move the cache back to ``~/.cache/dllm_rl/xla`` (:func:`_run`). The previous
  settings are restored on exit. ``None``: unchanged."""
  global _STUDY_CACHE
  if not cache_dir:
    yield
    return
  import jax
  from jax.experimental.compilation_cache import compilation_cache as cc
  keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
          "jax_persistent_cache_min_entry_size_bytes")
  old = {k: jax.config.values[k] for k in keys}
  os.makedirs(cache_dir, exist_ok=True)
  for k, v in zip(keys, (cache_dir, 0.0, 0)):
    jax.config.update(k, v)
  cc.reset_cache()
  _STUDY_CACHE = cache_dir
  try:
    yield
  finally:
    _STUDY_CACHE = None
    for k, v in old.items():
      jax.config.update(k, v)
    cc.reset_cache()


def make_config(overrides: dict,
                base: ml_collections.ConfigDict | None = None) -> ml_collections.ConfigDict:
  """A copy of ``base`` (default: the embedded default) with flattened overrides
  (``{"rl.lr": 1e-3}``) applied."""
  if base is None:
    config = testbeds.testbed(testbeds.DEFAULT).get_config()
  else:
    config = copy.deepcopy(base)
  config.update_from_flattened_dict(dict(overrides))
  return config


def read_record(path: str) -> dict:
  """The JSON record a finished run left at ``path`` (an arm's ``run.json``, an SFT start's
  ``summary.json`` or ``config_sft.json``); a ConfigError naming the file when it cannot be
  parsed. Not treated as absent: a record is written whole (``paths.write_atomic``), so a
  broken one was damaged from outside, and rerunning over it would silently drop a finished
  run (its folder still holds the run's metrics and checkpoints, which a rerun resumes from
  rather than starting clean); deleting the folder is the user's call."""
  from dllm_rl.errors import ConfigError
  try:
    with open(path, encoding="utf-8") as fh:
      return json.load(fh)
  except (json.JSONDecodeError, UnicodeDecodeError) as err:
    raise ConfigError("--workdir", f"{path} is not a readable record ({type(err).__name__}:"
                      f" {err}); delete {os.path.dirname(path)} to rerun that run") from None


def claim_workdir(workdir: str, testbed: str) -> None:
  """Record ``testbed`` as DIR's testbed (``DIR/testbed.txt``); a ConfigError when DIR already
  holds another one (its SFT starts and arms would be mixed into this study). A DIR with SFT
  starts and no record is from before testbeds: the embedded default's."""
  from dllm_rl.errors import ConfigError
  path = os.path.join(workdir, "testbed.txt")
  held = testbeds.DEFAULT if os.path.isdir(os.path.join(workdir, "sft")) else None
  if os.path.exists(path):
    with open(path) as fh:
      held = fh.read().strip()
  if held is not None and held != testbed:
    raise ConfigError("testbed", f"{workdir} holds a study of testbed {held!r}, not"
                      f" {testbed!r}: use another --workdir")
  os.makedirs(workdir, exist_ok=True)
  with open(path, "w") as fh:
    fh.write(testbed + "\n")


def _run(config, workdir: str, quiet_unread=()) -> dict:
  from dllm_rl.train import modes as run
  os.makedirs(workdir, exist_ok=True)
  if _STUDY_CACHE:  # keep the study's cache (config.compilation_cache would replace it)
    config.compilation_cache = ""
  return run.run(config, workdir, quiet_unread=quiet_unread)


# The config groups that make an SFT start what it is (its model, data, task, training and
# the evaluations its summary reports); the rest (rl, log, checkpoint, mesh, ...) does not.
SFT_START_KEYS = ("seed", "model", "task", "data", "sft", "sampler", "eval", "lora", "train")


def check_sft_reusable(workdir: str, config: ml_collections.ConfigDict) -> None:
  """A ConfigError (key ``--workdir``) when the finished SFT start in ``workdir`` was trained
  with other settings of :data:`SFT_START_KEYS` than ``config`` (its ``config_sft.json``
  against this study's; keys only one side has, from another code version, are not
  compared): the study would otherwise build its arms on a start it did not ask for."""
  from dllm_rl.errors import ConfigError
  path = os.path.join(workdir, "config_sft.json")
  if not os.path.exists(path):
    return
  from dllm_rl.train.layout_errors import flat
  recorded = flat(read_record(path))
  wanted = flat(json.loads(config.to_json_best_effort()))
  differ = sorted(k for k in set(recorded) & set(wanted)
                  if k.split(".")[0] in SFT_START_KEYS and recorded[k] != wanted[k])
  if differ:
    shown = "; ".join(f"{k}: trained with {recorded[k]!r}, this study sets {wanted[k]!r}"
                      for k in differ[:6]) + ("; ..." if len(differ) > 6 else "")
    raise ConfigError("--workdir", f"{workdir} holds an SFT start trained with other settings"
                      f" ({shown}): use a fresh --workdir, or the --config overrides it"
                      " was trained with")


def sft_config(seed: int, overrides: dict,
               base: ml_collections.ConfigDict | None = None) -> ml_collections.ConfigDict:
  """The config of the seed's SFT start: ``base`` with the study-wide ``overrides``."""
  return make_config({**overrides, "mode": "sft", "seed": seed, "log.progress": False,
                      "log.tensorboard": False}, base)


def sft_start_dir(workdir: str, seed: int, shared: bool, sft_seed: int = 0) -> str:
  """The folder of the SFT start that ``seed``'s arms start from (when ``shared``, the one
  start of every seed: seed ``sft_seed``'s)."""
  return os.path.join(workdir, "sft", f"seed{sft_seed if shared else seed}")


def seed_range(seeds: int, first_seed: int = 0) -> range:
  """The seeds of a study: ``seeds`` of them from ``first_seed`` (default 0; a later first
  seed gives a fresh set, e.g. a confirmatory run judged apart from the seeds before it)."""
  from dllm_rl.errors import ConfigError
  if first_seed < 0:
    raise ConfigError("first_seed", f"must be >= 0, got {first_seed}")
  return range(first_seed, first_seed + seeds)


def check_sft_starts(workdir: str, seeds: int, overrides: dict, testbed: str,
                     base: ml_collections.ConfigDict | None = None, sft_seed: int = 0,
                     first_seed: int = 0) -> None:
  """:func:`check_sft_reusable` on every SFT start the study in DIR would reuse, finished or
  interrupted (its checkpoints: a rerun resumes it, and its record would state the new
  settings for steps trained with the old);
  ``studies.study`` calls it before anything trains. ``base``: the testbed's config unless
  given; ``sft_seed``: the seed of a shared start (:func:`check_sft_seed`); the seeds:
  :func:`seed_range`."""
  bed = testbeds.testbed(testbed)
  shared, base = bed.shared_sft, base if base is not None else bed.get_config()
  check_sft_seed(testbed, sft_seed)
  if shared:  # one start per DIR: the arms' folders do not name the start they ran from
    ours = sft_start_dir(workdir, 0, shared, sft_seed)
    starts = os.path.dirname(ours)
    others = sorted(f for f in (os.listdir(starts) if os.path.isdir(starts) else ())
                    if f != os.path.basename(ours))
    if others:
      from dllm_rl.errors import ConfigError
      raise ConfigError("sft_seed", f"{workdir} holds the SFT start sft/{others[0]}, which its"
                        f" arms start from; the start of seed {sft_seed} needs its own --workdir")
  for seed in ([sft_seed] if shared else seed_range(seeds, first_seed)):
    folder = sft_start_dir(workdir, seed, shared, sft_seed)
    interrupted = os.path.isdir(os.path.join(folder, "checkpoints", "sft"))  # resumes
    if interrupted or os.path.exists(os.path.join(folder, "summary.json")):
      check_sft_reusable(folder, sft_config(seed, overrides, base))


def check_sft_seed(testbed: str, sft_seed: int) -> None:
  """A ConfigError (key ``sft_seed``) unless ``sft_seed`` is 0 or ``testbed`` shares one SFT
  start across its seeds: elsewhere each seed trains its own start from its own seed."""
  from dllm_rl.errors import ConfigError
  if sft_seed < 0:
    raise ConfigError("sft_seed", f"must be >= 0, got {sft_seed}")
  if sft_seed and not testbeds.testbed(testbed).shared_sft:
    raise ConfigError("sft_seed", f"the testbed {testbed!r} trains one SFT start per seed"
                      " (from that seed); --sft_seed chooses the one start of a testbed whose"
                      " seeds share it: " + ", ".join(n for n in testbeds.TESTBEDS.names()
                                                     if testbeds.testbed(n).shared_sft))


def train_sft(seed: int, workdir: str, overrides: dict,
              base: ml_collections.ConfigDict | None = None) -> dict:
  """The seed's SFT checkpoint (trained once; reused when its summary exists and it was
  trained with this study's settings, :func:`check_sft_reusable`). Its ``wall_seconds``
  include a resumed warm-up's earlier processes (``sft_earlier_wall_seconds``)."""
  config = sft_config(seed, overrides, base)
  path = os.path.join(workdir, "summary.json")
  if os.path.exists(path):
    check_sft_reusable(workdir, config)
    summary = read_record(path)
  else:
    summary = _run(config, workdir)
  if "sft_earlier_wall_seconds" in summary:
    summary = {**summary, "wall_seconds": summary.get("wall_seconds", 0.0)
               + summary["sft_earlier_wall_seconds"]}
  return summary


def step_records(metrics_path: str) -> tuple[list[dict], list[dict], dict]:
  """Per-step RL records, the validation evaluations and the final test record
  from a run's metrics.jsonl."""
  from dllm_rl.infra.observability import read_metrics
  steps, evals, final = {}, [], {}
  for rec in read_metrics(metrics_path, phase="rl"):
    if "val_accuracy" in rec:
      evals.append({"step": rec["step"], "val_accuracy": rec["val_accuracy"]})
    if "test_accuracy" in rec:
      final = {k: v for k, v in rec.items() if k.startswith("test_")}
    if "reward_mean" in rec:
      steps[rec["step"]] = {"step": rec["step"], **{k: rec[k] for k in STEP_KEYS if k in rec}}
  return [steps[s] for s in sorted(steps)], evals, final


def arm_stats(records: list[dict], evals: list[dict], num_val: int) -> dict:
  """The arm's summary: start / final / best validation accuracy, collapse (below the start
  by more than 2 binomial standard errors on ``num_val`` prompts, and staying there), spikes."""
  start = next((e["val_accuracy"] for e in evals if e["step"] == 0), None)
  later = [e for e in evals if e["step"] > 0]
  grads = stats.step_grad_norms(records)
  margin = stats.binomial_margin(start, num_val) if start is not None else None
  collapsed_at = (stats.collapse_step([e["step"] for e in evals],
                                      [e["val_accuracy"] for e in evals], start, margin)
                  if start is not None else None)
  return {
      "collapse_margin": margin,
      "start_val_accuracy": start,
      "final_val_accuracy": later[-1]["val_accuracy"] if later else None,
      "best_val_accuracy": max((e["val_accuracy"] for e in later), default=None),
      "collapsed": collapsed_at is not None,
      "collapse_step": collapsed_at,
      "grad_norm_max": max(_numbers(grads), default=None),  # a NaN step: skipped, no norm
      "zero_grad_steps": sum(1 for g in grads if g == 0),  # no signal: all rewards equal
      "spike_ratio": stats.spike_ratio(grads),
      "grad_spikes": stats.count_spikes(grads),
      "abs_log_ratio": ratio_summary(records),
      "bypass_fraction_mean": (sum(r.get("bypass_fraction", 0.0) for r in records) / len(records)
                               if records else None),
  }


def arm_line(name: str, seed: int, arm_name: str, rec: dict, size: Size) -> str:
  """The study log's line of a finished arm: test accuracy, validation start → final,
  collapse, spikes, time. Validation runs at step 0 and every ``size.eval_every`` steps, so
  with ``--rl_steps`` below ``--eval_every`` none runs after the start: the line says so, and
  that collapse (judged on validation) could not be, instead of "→ None | collapsed False"."""
  s = rec["stats"]
  if s["final_val_accuracy"] is None:
    val = (f"val {s['start_val_accuracy']} at step 0, none after it (validation every"
           f" {size.eval_every} steps, {size.rl_steps} run) | collapsed n/a")
  else:
    val = (f"val {s['start_val_accuracy']} → {s['final_val_accuracy']}"
           f" | collapsed {s['collapsed']}")
  return (f"[study] {name} seed {seed} {arm_name}: test {rec['summary'].get('rl_accuracy'):.3f}"
          f" | {val} | spikes {s['grad_spikes']} | {rec['wall_seconds']:.0f}s")


def calibrated_beta_end(source: dict) -> float:
  """β_end = the calibrated β of the source arm's starting policy (w_β(p̄) = 1, p̄ its first
  rollout batch's training accuracy; that batch is the same for every arm of a seed). When
  p̄ is 0 or 1 the β is undefined; p̄ is then the add-one estimate (c + 1)/(n + 2)."""
  from dllm_rl.rl.advantages import calibrated_beta
  if source.get("calibrated_beta") is not None:
    return float(source["calibrated_beta"])
  n = source["rollouts"]
  c = round(source["base_train_accuracy"] * n)
  return float(calibrated_beta((c + 1) / (n + 2)))


def arm_run_overrides(seed: int, size: Size, overrides: dict, arm_overrides: dict) -> dict:
  """The overrides of one arm's RL run: the study's size, then the study-wide ``overrides``,
  then the arm's own."""
  return {"mode": "rl", "seed": seed, "rl.steps": size.rl_steps,
          "rl.eval_every": size.eval_every, "rl.log_every": 1,
          "checkpoint.save_every": size.rl_steps, "log.progress": False,
          "log.tensorboard": False, **overrides, **arm_overrides}


def check_reusable(path: str, recorded: dict, wanted: dict,
                   base: ml_collections.ConfigDict | None = None, skip: tuple = ()) -> None:
  """A ConfigError (key ``--workdir``) when the finished run at ``path`` ran with other
  settings than this study's (``recorded`` against ``wanted`` overrides; a key one side does
  not set has the ``base`` config's value): reusing it would mix, e.g., a ``--quick`` run or
  another ``--config`` override into the study. ``skip``: keys not compared."""
  from dllm_rl.config.overrides import value_at
  from dllm_rl.errors import ConfigError
  base = base if base is not None else testbeds.testbed(testbeds.DEFAULT).get_config()
  # as run.json holds them (JSON: tuples are lists)
  at = lambda d, k: json.loads(json.dumps(d[k] if k in d else value_at(base, k)))
  differ = sorted(k for k in (set(recorded) | set(wanted)) - set(skip)
                  if at(recorded, k) != at(wanted, k))
  if differ:
    shown = "; ".join(f"{k}: ran with {at(recorded, k)!r}, this study sets {at(wanted, k)!r}"
                      for k in differ)
    raise ConfigError("--workdir", f"{path} is a finished run with other settings ({shown}):"
                      " use a fresh --workdir, or the size and --config overrides it ran with")


def check_finished_runs(name: str, arms: list[Arm], workdir: str, seeds: int, size: Size,
                        overrides: dict, base: ml_collections.ConfigDict | None = None,
                        first_seed: int = 0) -> None:
  """:func:`check_reusable` on every finished run of the study in DIR; ``studies.study``
  calls it for every study of the command before anything trains (a calibrated arm's β_end,
  known only once its source arm has run, and the runs of a direct :func:`run_study` call
  are checked by :func:`run_arm`)."""
  for seed in seed_range(seeds, first_seed):
    for arm in arms:
      path = os.path.join(_arm_dir(workdir, name, seed, arm), "run.json")
      skip = ("rl.beta_end",) if arm.calibrate_from is not None else ()
      wanted = arm_run_overrides(seed, size, overrides, arm.overrides)
      if os.path.exists(path):
        recorded = read_record(path)["overrides"]
        check_reusable(path, recorded, wanted, base, skip=skip)
      else:
        check_interrupted(os.path.dirname(path), make_config(wanted, base), skip)


def check_interrupted(run_dir: str, wanted: ml_collections.ConfigDict, skip=()) -> None:
  """An interrupted run (RL checkpoints, no run.json) resumes: a ConfigError (key
  ``--workdir``) when the config it started with (its ``config_rl.json``) differs from
  ``wanted``, this study's, in any key but ``skip`` and ``compilation_cache`` (where compiled
  programs are kept: no result depends on it, and :func:`_run` blanks it while the study's
  cache is open): its finished record would state the new settings for steps that ran with
  the old (another lr, another length's schedule)."""
  from dllm_rl.errors import ConfigError
  from dllm_rl.train.layout_errors import changed_settings
  saved = os.path.join(run_dir, "config_rl.json")
  if not (os.path.isdir(os.path.join(run_dir, "checkpoints", "rl")) and os.path.exists(saved)):
    return
  with open(saved) as fh:
    text = fh.read()
  changes = changed_settings({"config": text}, wanted,
                             ignore=("mode", "compilation_cache", *skip))
  if changes:
    shown = "; ".join(f"{k}: started with {was!r}, this study sets {now!r}"
                      for k, was, now in changes[:8])
    raise ConfigError("--workdir", f"{run_dir} holds an interrupted run with other settings"
                      f" ({shown}): rerun with the settings it started with, or delete that"
                      " folder to run it afresh")


def copy_sft_start(sft_dir: str, workdir: str) -> None:
  """``sft_dir``'s SFT checkpoints into ``workdir`` (where it has none): the start RL resumes.
  Copied beside the target and renamed into place, so a copy cut short (a preemption) leaves
  no partial start that a rerun would take as complete; its leftover is replaced."""
  target = os.path.join(workdir, "checkpoints", "sft")
  if os.path.isdir(target):
    return
  partial = target + ".partial"
  shutil.rmtree(partial, ignore_errors=True)
  shutil.copytree(os.path.join(sft_dir, "checkpoints", "sft"), partial)
  os.rename(partial, target)


def run_arm(arm: Arm, seed: int, sft_dir: str, workdir: str, size: Size, overrides: dict,
            calibrated: dict, base: ml_collections.ConfigDict | None = None) -> dict:
  """One arm from the seed's SFT checkpoint; returns (and writes) its run record. A finished
  run (``run.json``) is reused when it ran with these overrides; one that ran with others
  (another size, ``--config`` override or arm definition) is a ConfigError naming them."""
  arm_overrides = dict(arm.overrides)
  if arm.calibrate_from is not None:
    arm_overrides["rl.beta_end"] = calibrated_beta_end(calibrated[arm.calibrate_from])
  run_overrides = arm_run_overrides(seed, size, overrides, arm_overrides)
  path = os.path.join(workdir, "run.json")
  if os.path.exists(path):  # finished: reuse it, with the summary statistics recomputed
    result = read_record(path)
    check_reusable(path, result["overrides"], run_overrides, base)
    result["stats"] = arm_stats(result["steps"], result["evals"],
                                make_config(result["overrides"], base).task.val_size)
    return result
  copy_sft_start(sft_dir, workdir)
  commit, machine = provenance.git_commit(), provenance.machine()  # the code that trains it
  t0 = time.monotonic()
  config = make_config(run_overrides, base)
  # the testbed's own settings serve the arms that read them (e.g. spg_block_len): no warning
  # for an arm that does not; the arm's and the user's overrides are still checked
  from dllm_rl.config.unread import set_keys
  quiet = set_keys(make_config({}, base)) - set(run_overrides)
  from dllm_rl.train.resilience import NonFiniteError
  try:
    summary = _run(config, workdir, quiet)
  except NonFiniteError as err:  # the study stops here: name the arm and how to go on
    raise NonFiniteError(
        f"arm {arm.name} seed {seed} diverged ({err}); the finished runs are kept: rerun the"
        " same command with --arms naming the other arms to go on without it") from err
  records, evals, final = step_records(os.path.join(workdir, "metrics.jsonl"))
  result = {"arm": arm.name, "description": arm.description, "seed": seed,
            "commit": commit, "machine": machine,
            "overrides": run_overrides, "summary": summary,
            # a resumed arm: its RL phase's time in the earlier processes too
            "wall_seconds": time.monotonic() - t0 + summary.get("rl_earlier_wall_seconds", 0.0),
            "stats": arm_stats(records, evals, config.task.val_size),
            "evals": evals, "final": final,
            "steps": records}
  from dllm_rl import paths
  paths.write_atomic(path, json.dumps(result))  # a stopped study never leaves half a record
  return result


def run_study(name: str, arms: list[Arm], workdir: str, seeds: int, size: Size,
              overrides: dict, log=print, testbed: str = testbeds.DEFAULT,
              base: ml_collections.ConfigDict | None = None,
              prefetch: bool | None = None, sft_seed: int = 0, first_seed: int = 0) -> dict:
  """Every arm × seed from ``base`` (the config of ``testbed``; default its registered
  config); returns the study record (also written to DIR/<name>.json by the caller).
  ``prefetch``: while the study's compilation cache is open (:func:`compilation_cache`), a
  background thread compiles the arms' RL programs ahead of the arm that trains
  (dllm_rl.study.prefetch; single-process runs only). None: on a GPU or TPU, where the host
  compiles while the device trains; off on CPU, where both compete for the same cores (the
  2-core ``--quick`` study took longer with it: 6 min 32 s against 4 min 40 s). ``sft_seed``:
  the seed of the one SFT start of a ``shared_sft`` testbed (default 0; its folder
  ``DIR/sft/seed<sft_seed>``), for the claims from another start. The seeds:
  :func:`seed_range` (``seeds`` of them from ``first_seed``)."""
  from dllm_rl.train.validate import validate
  seed_list = seed_range(seeds, first_seed)  # a ConfigError when first_seed < 0
  base = base if base is not None else testbeds.testbed(testbed).get_config()
  for arm in arms:  # every arm's run config is checked before anything trains or compiles
    validate(make_config(arm_run_overrides(0, size, overrides, arm.overrides), base))
  claim_workdir(workdir, testbed)  # studies.study did both already; a direct call had not
  check_sft_starts(workdir, seeds, overrides, testbed, base, sft_seed, first_seed)
  from dllm_rl.train.resilience import handle_signals
  with handle_signals():  # a stop request ends the study after the run in progress
    prefetcher = _prefetcher(name, arms, workdir, seed_list, size, overrides, log, base,
                             prefetch)
    try:
      result = _run_seeds(name, arms, workdir, seed_list, size, overrides, log, testbed, base,
                          prefetcher, sft_seed)
    except BaseException:  # a stop request or a failure: do not hold the exit for long
      if prefetcher is not None:
        prefetcher.close(timeout=10.0)
      raise
    if prefetcher is not None:
      prefetcher.close()
    return result


def _prefetcher(name: str, arms: list[Arm], workdir: str, seeds: range, size: Size,
                overrides: dict, log, base: ml_collections.ConfigDict,
                enabled: bool | None):
  """The started :class:`~dllm_rl.study.prefetch.Prefetcher` of the arms not yet run of the
  first seed that has any (the programs do not depend on the seed; an arm calibrated from
  another's result is left out: its β is known only then, and β being an input, its rl_step
  is that arm's; so is a run from an HF checkpoint, dllm_rl.train.precompile), or None:
  ``enabled`` False (or None on the CPU backend), no study compilation cache (nowhere to keep
  the programs), more than one process, or nothing to run."""
  if enabled is False or _STUDY_CACHE is None:
    return None
  for seed in seeds:
    todo = [a for a in arms
            if not os.path.exists(os.path.join(_arm_dir(workdir, name, seed, a), "run.json"))]
    if todo:
      break
  else:
    return None
  jobs = [(f"{name} {a.name}", make_config(arm_run_overrides(seed, size, overrides, a.overrides),
                                           base))
          for a in todo if a.calibrate_from is None]
  # an HF checkpoint's arms are not covered here: precompile.py
  jobs = [(label, c) for label, c in jobs if not c.model.hf_checkpoint]
  if not jobs:
    return None
  from dllm_rl.parallel.distributed import initialize
  if initialize(jobs[0][1].distributed)["process_count"] > 1:
    return None
  import jax
  if enabled is None and jax.default_backend() == "cpu":
    return None
  from dllm_rl.study.prefetch import Prefetcher, scratch_dir
  return Prefetcher(jobs, scratch_dir(workdir), log).start()


def _arm_dir(workdir: str, name: str, seed: int, arm: Arm) -> str:
  return arm_dir(workdir, name, seed, arm.name)


def arm_dir(workdir: str, study: str, seed: int, arm_name: str) -> str:
  """The run folder of arm ``arm_name`` of ``study`` at ``seed`` in the study DIR."""
  return os.path.join(workdir, study, f"seed{seed}", arm_name.replace("@", "_"))


def _stop_if_requested(name: str, seed: int, done: str) -> None:
  from dllm_rl.train.resilience import Preempted, stop_requested
  if stop_requested():
    raise Preempted("study", seed, f"stopped on request after {name} seed {seed}'s {done}"
                    " (every finished SFT start and arm is saved); rerun the same command to"
                    " resume: finished runs are reused")


def _run_seeds(name: str, arms: list[Arm], workdir: str, seeds: range, size: Size,
               overrides: dict, log, testbed: str, base: ml_collections.ConfigDict,
               prefetcher=None, sft_seed: int = 0) -> dict:
  shared = testbeds.testbed(testbed).shared_sft
  t0 = time.monotonic()
  runs, sfts = [], {}
  for seed in seeds:
    start_dir = sft_start_dir(workdir, seed, shared, sft_seed)  # shared by the studies of a DIR
    if shared and seed > seeds.start:  # one start for every seed: recorded (and timed) once
      sfts[seed] = {**sfts[seeds.start], "wall_seconds": 0.0, "shared_from_seed": seeds.start}
    else:
      sfts[seed] = train_sft(sft_seed if shared else seed, start_dir, overrides, base)
    log(f"[study] {name} seed {seed}: SFT test accuracy {sfts[seed].get('sft_accuracy')}"
        + (f" (the shared start: seed {sft_seed}'s)" if shared else ""))
    _stop_if_requested(name, seed, "SFT start")
    calibrated = {}
    for arm in arms:
      if prefetcher is not None and (waited := prefetcher.claim(f"{name} {arm.name}")) >= 1.0:
        log(f"[study] {name} seed {seed} {arm.name}: waited {waited:.0f} s for its background"
            " compile")
      rec = run_arm(arm, seed, start_dir, _arm_dir(workdir, name, seed, arm), size, overrides,
                    calibrated, base)
      r = make_config(rec["overrides"], base).rl
      calibrated[arm.name] = {"calibrated_beta": rec["summary"].get("calibrated_beta"),
                              "base_train_accuracy": rec["summary"].get("base_train_accuracy"),
                              "rollouts": r.batch_prompts * r.group_size}
      log(arm_line(name, seed, arm.name, rec, size))
      runs.append(rec)
      _stop_if_requested(name, seed, f"arm {arm.name}")
  return {"study": name, "testbed": testbed, "base_config": json.loads(base.to_json()),
          "arms": [{"name": a.name, "description": a.description,
                                   "overrides": a.overrides, "calibrate_from": a.calibrate_from,
                                   "group": a.group}
                                  for a in arms],
          "seeds": len(seeds), "first_seed": seeds.start, "shared_sft": shared,
          "sft_seed": sft_seed if shared else None,
          "size": {"rl_steps": size.rl_steps, "eval_every": size.eval_every},
          "overrides": overrides, "sft": {str(k): v for k, v in sfts.items()}, "runs": runs,
          "wall_seconds": time.monotonic() - t0}
