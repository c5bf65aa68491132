"""How long a study takes on a testbed, from the analytic model FLOPs (``dllm_rl/train/flops.py``).

Used to size the GPU profile (``--testbed=gpu``), which cannot run here: the FLOPs of an SFT
start and of one arm (rollout sampling, the RL updates, the greedy validation passes and the
final test with its pass@k samples), and the seconds they take at an assumed fraction of a
device's peak (the MFU, an assumption until measured). Samplers are counted at their full
schedule (every block, as without ``stop_at_eos``): an upper bound.

``python -m dllm_rl.study.sizing [TESTBED] [--quick]`` prints the estimate;
``--measured=DIR`` adds the projection from a study directory's recorded wall times
(:func:`measured`: what one H200 took for the profile's SFT start and each arm, docs/gpu.md).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import statistics
import sys

from dllm_rl.study.runner import arm_dir

H200_BF16_PEAK = 989e12  # NVIDIA H200 SXM, dense bfloat16 tensor-core peak, FLOP/s
ASSUMED_MFU = 0.25       # an assumption (20–30% at ~100M parameters), not a measurement


def _model(config):
  """``config.model`` at the character tokenizer's vocabulary (the generated tasks')."""
  from dllm_rl.tasks.tokenizer import CharTokenizer
  from dllm_rl.train.context import model_config
  return model_config(config, CharTokenizer().vocab_size)


def param_count(config) -> int:
  """Parameters of ``config.model`` (embedding, layers, norms, head), shapes only."""
  from dllm_rl.models.transformer import abstract_model, count_params
  return count_params(abstract_model(_model(config))[1])


def study_flops(config, rl_steps: int, eval_every: int, arms: int, seeds: int) -> dict:
  """Model FLOPs of a study of ``arms`` arms × ``seeds`` seeds on ``config``: the SFT start
  (``sft.steps`` at most; it may stop early at its target), each arm, and the total."""
  from dllm_rl.sampling.configs import sampler_config
  from dllm_rl.train import flops
  m, c = _model(config), config
  s = sampler_config(c)
  p = c.data.prompt_len
  rollout = flops.sampler_flops(m, s, c.rl.batch_prompts * c.rl.group_size, p)
  update = flops.rl_step_flops(c, m)
  greedy_per_prompt = flops.sampler_flops(m, s, 1, p)
  evals = rl_steps // eval_every + 1 if eval_every else 1  # validation at 0, every N, the end
  arm = (rl_steps * (rollout + update)
         + evals * c.task.val_size * greedy_per_prompt
         + c.task.test_size * (1 + c.eval.num_samples) * greedy_per_prompt)
  sft_evals = c.sft.steps // c.sft.eval_every + 1 if c.sft.eval_every else 1
  sft = (c.sft.steps * flops.sft_step_flops(c, m)
         + sft_evals * c.task.val_size * greedy_per_prompt
         + c.task.test_size * (1 + c.eval.num_samples) * greedy_per_prompt)
  return {"sft": sft, "arm": arm, "rl_step": rollout + update,
          "total": seeds * (sft + arms * arm)}


def arm_count(config, studies: list[str], group: str | None = "main",
              default_lr_only: bool = False) -> int:
  """How many arms ``studies`` run over ``config`` (only those of ``group``; None = every;
  ``default_lr_only``: without the lr grid's other values, as launch/gpu_lease.sh runs)."""
  from dllm_rl.study import arms as arms_lib
  lr = float(config.rl.lr)
  return sum(1 for name in studies for a in arms_lib.STUDIES.get(name)(config)
             if (group is None or a.group == group)
             and not (default_lr_only and float(a.overrides.get("rl.lr", lr)) != lr))


@dataclasses.dataclass(frozen=True)
class Estimate:
  params: int
  flops: dict
  seconds: float          # total at ``mfu`` of ``peak``
  peak: float
  mfu: float


def estimate(testbed: str, studies: list[str], quick: bool, group: str | None = "main",
             peak: float = H200_BF16_PEAK, mfu: float = ASSUMED_MFU) -> Estimate:
  """The FLOPs and seconds of ``studies`` on ``testbed`` (only the arms of ``group``; None =
  every arm) at the testbed's full or quick size."""
  from dllm_rl.config import testbeds
  from dllm_rl.study import arms as arms_lib
  config = testbeds.testbed(testbed).get_config()
  size = arms_lib.size(testbed, quick)
  f = study_flops(config, size.rl_steps, size.eval_every, arm_count(config, studies, group),
                  size.seeds)
  return Estimate(param_count(config), f, f["total"] / (peak * mfu), peak, mfu)


@dataclasses.dataclass(frozen=True)
class Measured:
  """Recorded wall seconds of a study directory: its SFT start(s) and every arm run;
  ``compile_seconds``: for each arm run whose metrics.jsonl is there and that a background
  compile could serve (not calibrated from another arm), how much longer its first RL step
  took after its step-0 validation than the quickest such first step of the directory (an
  arm whose programs were all in the cache): its compile time."""
  sft_seconds: list[float]
  arm_seconds: list[float]
  compile_seconds: list[float] = dataclasses.field(default_factory=list)

  def project(self, arms: int, seeds: int = 1, *, background_compiles: bool = False) -> float:
    """Seconds for ``arms`` arms × ``seeds`` seeds at the recorded means (the first arm's
    compile included in the mean: the runs recorded are mostly cache hits).
    ``background_compiles``: less the mean compile time per arm (dllm_rl.study.prefetch
    compiles it while an earlier run trains): an estimate, assuming it is all hidden."""
    arm = statistics.fmean(self.arm_seconds)
    if background_compiles and self.compile_seconds:
      arm -= sum(self.compile_seconds) / len(self.arm_seconds)
    return seeds * (statistics.fmean(self.sft_seconds) + arms * arm)


def first_step_delay(metrics_path: str) -> float | None:
  """Seconds from a run's step-0 validation line to its first RL step's line (its
  metrics.jsonl ``time`` fields): the first step's rollout and update, compiles included;
  None when either line is missing."""
  from dllm_rl.infra.observability import read_metrics
  t0 = t1 = None
  for rec in read_metrics(metrics_path, phase="rl"):
    if t0 is None and rec.get("step") == 0 and "val_accuracy" in rec:
      t0 = rec["time"]
    elif t0 is not None and "reward_mean" in rec:
      t1 = rec["time"]
      break
  return None if t0 is None or t1 is None else t1 - t0


def measured(study_dir: str) -> Measured:
  """The wall seconds that ``study_dir``'s ``<study>.json`` files record: each seed's SFT start
  (``wall_seconds`` of its summary: start-up, steps, evaluations, test) once, and every arm
  run. A directory without study JSON, or whose JSON records no SFT start or no run, is an
  error naming it."""
  sft, arms, delays = {}, [], []
  paths = sorted(glob.glob(os.path.join(study_dir, "*.json")))
  for path in paths:
    with open(path) as fh:
      study = json.load(fh)
    if not isinstance(study, dict) or "runs" not in study:
      continue
    for seed, summary in (study.get("sft") or {}).items():
      if summary.get("wall_seconds") is not None:
        sft[seed] = summary["wall_seconds"]
    arms += [r["wall_seconds"] for r in study["runs"] if r.get("wall_seconds") is not None]
    calibrated = {a["name"] for a in study.get("arms", []) if a.get("calibrate_from")}
    for r in study["runs"]:
      path = os.path.join(arm_dir(study_dir, study["study"], r.get("seed", 0), r.get("arm", "")),
                          "metrics.jsonl")
      if r.get("arm") not in calibrated and os.path.exists(path):
        delays.append(first_step_delay(path))
  if not sft or not arms:
    raise ValueError(f"--measured={study_dir}: no study JSON there records"
                     f" {'an SFT start' if not sft else 'an arm run'} with its wall_seconds"
                     f" (looked at {len(paths)} *.json)")
  delays = [d for d in delays if d is not None]
  return Measured(list(sft.values()), arms, [d - min(delays) for d in delays])


USAGE = "usage: python -m dllm_rl.study.sizing [TESTBED] [--quick] [--measured=DIR]"


def main(argv: list[str]) -> int:
  """Print the estimates; 0, or 2 with one line on stderr for an unknown flag or testbed, more
  than one testbed, or a ``--measured`` folder that is missing or lacks the study JSON it
  reads."""
  if {"-h", "--help"} & set(argv):
    print(__doc__.strip())
    return 0
  from dllm_rl.config import testbeds
  names = [a for a in argv if not a.startswith("-")]
  flags = [a for a in argv if a.startswith("-")]
  bad = [a for a in flags if a != "--quick" and not a.startswith("--measured=")]
  if bad or len(names) > 1:
    print(f"sizing: {bad[0] if bad else ' '.join(names)}: not understood; {USAGE}",
          file=sys.stderr)
    return 2
  testbed, quick = (names or ["gpu"])[0], "--quick" in argv
  if testbed not in testbeds.TESTBEDS:
    print(f"sizing: {testbeds.TESTBEDS.unknown_message(testbed)}", file=sys.stderr)
    return 2
  missing = [a for a in flags if a.startswith("--measured=") and not os.path.isdir(a[11:])]
  if missing:
    print(f"sizing: {missing[0]}: no such folder", file=sys.stderr)
    return 2
  try:
    _print(testbed, quick, argv)
  except ValueError as e:  # a --measured folder without the study JSON it needs
    print(f"sizing: {e}", file=sys.stderr)
    return 2
  return 0


def _print(testbed: str, quick: bool, argv: list[str]) -> None:
  for studies in (["stability", "steprs"], ["stability", "steprs", "baselines"]):
    for group in ("main", None):
      e = estimate(testbed, studies, quick, group)
      print(f"{testbed} {'quick' if quick else 'full'} {'+'.join(studies)}"
            f" ({group or 'all'} arms): {e.params / 1e6:.1f}M params, SFT"
            f" {e.flops['sft'] / 1e15:.2f} PFLOP, arm {e.flops['arm'] / 1e15:.2f} PFLOP, total"
            f" {e.flops['total'] / 1e15:.1f} PFLOP = {e.seconds / 60:.1f} min at"
            f" {e.mfu:.0%} of {e.peak / 1e12:.0f} TFLOP/s")
  for arg in argv:
    if arg.startswith("--measured="):
      from dllm_rl.config import testbeds
      study_dir = arg.split("=", 1)[1]
      m = measured(study_dir)
      config = testbeds.testbed(testbed).get_config()
      n = arm_count(config, ["stability", "steprs"])
      n_lr = arm_count(config, ["stability", "steprs"], default_lr_only=True)
      print(f"measured in {study_dir}: SFT start {statistics.fmean(m.sft_seconds):.0f} s,"
            f" {len(m.arm_seconds)} arm runs {min(m.arm_seconds):.0f}–{max(m.arm_seconds):.0f} s"
            f" (mean {statistics.fmean(m.arm_seconds):.0f} s): the {n} main arms of"
            f" stability + steprs (1 seed) take {m.project(n) / 60:.1f} min, the {n_lr} at the"
            f" default lr (launch/gpu_lease.sh) {m.project(n_lr) / 60:.1f} min")
      if m.compile_seconds:
        print(f"  compiles in those runs (first step after the step-0 validation, beyond the"
              f" quickest such step): {sum(m.compile_seconds):.0f} s over"
              f" {len(m.compile_seconds)} runs; if background compiles (--prefetch) hid them"
              f" all, {m.project(n, background_compiles=True) / 60:.1f} and"
              f" {m.project(n_lr, background_compiles=True) / 60:.1f} min (an estimate, not a"
              f" measurement)")


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
