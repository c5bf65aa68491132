"""``eval`` mode: evaluate one set of weights on the test split and write its results.

Which weights (``config.eval.phase``, ``config.eval.checkpoint_step``; checked before any
weight is read or anything compiles):

* ``auto`` (default): the newest phase with a checkpoint in ``--workdir`` (RL, else SFT); with
  no checkpoint at all, the weights of ``model.hf_checkpoint`` (the pre-RL baseline), with a
  note on stderr naming the empty ``checkpoints`` folder (a mistyped ``--workdir``);
* ``sft`` | ``rl``: that phase's checkpoints;
* ``base``: the weights of ``model.hf_checkpoint``, whatever the workdir holds.

``checkpoint_step``: -1 = the phase's newest; a step that is not saved is a ConfigError listing
the saved ones. Steps are the phase loop's (:mod:`dllm_rl.train.run_checkpoints`): SFT steps,
RL rollout batches. Only the parameters are restored (no optimizer state).

Outputs (primary process; ``<label>`` = ``base`` | ``sft<k>`` | ``rl<k>``), beside the
training run's files and never replacing its ``summary.json``:

* ``eval_<task>_<label>.json``: the report (test accuracy, reward, pass@k, sample accuracy,
  diversity, distinct correct answers per prompt, malformed fraction, which weights, the two
  paths);
* ``eval_<task>_<label>.generations.jsonl``: one line per test prompt with its greedy
  completion: ``index``, ``prompt`` (decoded, as the model saw it), ``answer`` (the
  reference), ``completion``, ``parsed``, ``reward``, ``correct``.

Evaluating the same label again rewrites that label's two files.
"""

from __future__ import annotations

import json
import sys
import time

from dllm_rl import paths
from dllm_rl.errors import ConfigError
from dllm_rl.infra.checkpoint import CheckpointError
from dllm_rl.models import transformer
from dllm_rl.parallel.distributed import is_primary
from dllm_rl.train import evaluation, layout_errors, lora_checkpoint, run_checkpoints
from dllm_rl.train.context import Context, frozen_base, init_params
from dllm_rl.train.run_checkpoints import CheckpointRef, NoCheckpoint

BASE = "base"
_KEYS = {"phase": "eval.phase", "step": "eval.checkpoint_step"}


def resolve_target(config, workdir: str) -> CheckpointRef | None:
  """The checkpoint ``mode=eval`` evaluates, or None for ``model.hf_checkpoint``'s weights
  (``base``). A phase without checkpoints, or a step not saved: ConfigError naming
  ``eval.phase`` / ``eval.checkpoint_step``; no checkpoint and no HF model: ConfigError naming
  ``model.hf_checkpoint``."""
  e = config.eval
  if e.phase == BASE:
    return None
  try:
    ref = run_checkpoints.find_checkpoint(workdir, e.phase, e.checkpoint_step)
  except NoCheckpoint as err:
    raise ConfigError(_KEYS[err.what], str(err)) from err
  if ref is not None:
    return ref
  where = paths.join(workdir, "checkpoints")
  if e.checkpoint_step != run_checkpoints.LATEST:
    raise ConfigError("eval.checkpoint_step", f"no checkpoint under {where}: there is no step"
                      f" {e.checkpoint_step} to evaluate")
  if config.model.hf_checkpoint:
    return None
  raise ConfigError(
      "model.hf_checkpoint", f"eval mode needs a checkpoint or an HF model: no checkpoint"
      f" under {where} and no model.hf_checkpoint (set it to evaluate a pretrained model, or"
      " run mode 'sft' with this --workdir first)")


def label(ref: CheckpointRef | None) -> str:
  """``base`` | ``sft<k>`` | ``rl<k>``: the name of the evaluated weights in file names."""
  return BASE if ref is None else ref.label


def result_paths(workdir: str, task: str, ref: CheckpointRef | None) -> tuple[str, str]:
  """(the report JSON, the generations JSONL) of one evaluation."""
  stem = f"eval_{task}_{label(ref)}"
  return paths.join(workdir, f"{stem}.json"), paths.join(workdir, f"{stem}.generations.jsonl")


def load_policy(ctx: Context, ref: CheckpointRef | None):
  """(ref, graphdef, params): the checkpoint's parameters only, or the HF model's (``ref``
  None). A damaged newest step falls back to the one before when the newest was asked for
  (``eval.checkpoint_step`` -1; run_checkpoints.read_readable), so ``ref`` may be older than
  asked; a damaged step asked for by number is a ConfigError naming ``eval.checkpoint_step``.
  A checkpoint this config does not fit (other sizes, another ``lora.rank``): a ConfigError
  naming the keys it was trained with (dllm_rl.train.layout_errors)."""
  if ref is None:
    return (None, *init_params(ctx))
  graphdef, _ = transformer.abstract_model(ctx.model_cfg)
  latest = ctx.config.eval.checkpoint_step == run_checkpoints.LATEST
  try:
    ref, params = run_checkpoints.restore_params(ref, ctx.model_cfg, ctx.mesh,
                                                 base=lambda: frozen_base(ctx),
                                                 fall_back=latest, config=ctx.config)
  except CheckpointError as err:
    if latest:
      raise  # nothing readable: as training (exit 1)
    raise ConfigError("eval.checkpoint_step", str(err)) from None
  return ref, graphdef, params


# What makes the evaluated policy and its prompts: the model (architecture, dtypes, RoPE),
# its LoRA adapters (alpha and targets change the function, not the saved shapes), the task
# and how its prompts are written.
POLICY_KEYS = ("model", "lora", "task.name", "task.options.prompt_preset",
               "task.options.prompt_template", "data.system_prompt")
# Keys in those sections that change how the policy is computed (memory, compilation), never
# what it computes: another value is no other policy.
COMPUTE_KEYS = ("model.scan_layers", "model.remat", "model.logits_chunk", "model.moe_dispatch")


def policy_keys(config) -> tuple[str, ...]:
  """:data:`POLICY_KEYS` for ``config``: the ``model`` section's keys but
  :data:`COMPUTE_KEYS`, and no ``lora`` keys without LoRA (``lora.rank`` 0 here and, since
  the shapes fit, in the checkpoint: ``lora.alpha`` / ``targets`` are then never read)."""
  model = tuple(f"model.{key}" for key in config.model if f"model.{key}" not in COMPUTE_KEYS)
  rest = tuple(k for k in POLICY_KEYS if k != "model" and (k != "lora" or config.lora.rank))
  return model + rest


def trained_otherwise(ref: CheckpointRef, config, base_folder: str | None = None) -> list[str]:
  """One line when the config the checkpoint ``ref`` was trained with differs from this
  evaluation's in a :func:`policy_keys` key, naming each (a LoRA run evaluated at another
  ``lora.alpha``, another task than it learned): the evaluation runs, on a policy or task
  the training run did not have; keys whose shapes differ are errors already
  (layout_errors). [] when they agree or the meta holds no config. ``base_folder``: the local
  folder of this evaluation's ``model.hf_checkpoint``; a LoRA base found there with the
  weights the adapters were trained on (lora_checkpoint.same_base: a moved folder) is no
  other policy, so its other path is not said (the path it was trained at may be gone)."""
  meta = run_checkpoints.meta_for_notes(ref)
  keys = policy_keys(config)
  if config.lora.rank and lora_checkpoint.same_base(meta, base_folder):
    keys = tuple(k for k in keys if k != "model.hf_checkpoint")
  return layout_errors.trained_with_other(
      meta, config, keys,
      f"{ref.directory}/{ref.step} was trained with other settings than this evaluation's",
      "training run's", "evaluate it as trained")


def _describe(ctx: Context, ref: CheckpointRef | None) -> str:
  if ref is None:
    return f"base model {ctx.hf_checkpoint}"
  unit = " (rollout batches)" if ref.phase == "rl" else ""
  return f"{ref.phase} checkpoint step {ref.step}{unit}"


def run_eval(ctx: Context) -> dict:
  t0 = time.monotonic()
  config = ctx.config
  ref = resolve_target(config, ctx.workdir)  # before any weight is read or compiled
  if ref is None and config.eval.phase != BASE and is_primary():
    print(f"[eval] note: no checkpoint under {paths.join(ctx.workdir, 'checkpoints')}:"
          f" evaluating the base model {ctx.hf_checkpoint} (--config.eval.phase=base says so"
          " without this note; check --workdir if a trained run was meant)",
          file=sys.stderr, flush=True)
  ref, graphdef, params = load_policy(ctx, ref)
  # every process reads the meta: opening a checkpoint manager is a collective (Orbax syncs
  # all processes), so a read in process 0 alone waits for the others forever
  notes = trained_otherwise(ref, config, ctx.hf_checkpoint) if ref is not None else []
  if is_primary():
    for line in notes:
      print(f"[eval] warning: {line}", file=sys.stderr, flush=True)
  result = evaluation.evaluate_policy(graphdef, params, ctx.decoding, ctx.test, ctx.eval_options)
  report_path, generations_path = result_paths(ctx.workdir, config.task.name, ref)
  report = {
      "phase": BASE if ref is None else ref.phase,
      "step": None if ref is None else ref.step,  # SFT steps; RL rollout batches
      "step_label": label(ref),
      "weights": ctx.hf_checkpoint if ref is None else paths.join(ref.directory, str(ref.step)),
      "task": config.task.name, "test_size": len(ctx.test.examples),
      "test_accuracy": result["accuracy"], "test_reward": result["reward"],
      "pass_at_k": result["pass_at_k"], "sample_accuracy": result["sample_accuracy"],
      "diversity": result["diversity"], "distinct_correct": result["distinct_correct"],
      "malformed_fraction": result["malformed_fraction"], "results": report_path,
      "generations": generations_path,
      "eval_seconds": time.monotonic() - t0}
  if is_primary():
    records = evaluation.generation_records(ctx.tokenizer, ctx.test, result["graded"])
    paths.resolve(generations_path).write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    paths.resolve(report_path).write_text(json.dumps(report, indent=2) + "\n")
  print(f"[eval] {_describe(ctx, ref)}: test accuracy {result['accuracy']:.3f}"
        f", pass@k {result['pass_at_k']} ({report_path})", flush=True)
  return report
