"""A finished phase's summary, kept beside its checkpoints: ``<workdir>/<phase>_summary.json``.

A phase ends with its final save, then a test evaluation (on a real model and test set, the
slowest part of a short phase). The summary of that evaluation is recorded here, with the
step of the checkpoint it evaluated and the config that made it. A rerun of the same workdir
(a pipeline resumed in RL after a preemption, ``mode=sft`` followed by ``mode=pipeline``, a
finished run started again) reads it back instead of restoring, re-evaluating and re-logging
the finished phase, when

* the recorded step is the phase's newest checkpoint (nothing was trained or deleted since),
* and the config equals the recorded one, apart from the keys that cannot change the phase's
  policy or its test evaluation (``Phase.unrelated_keys``: for SFT, ``mode``, ``rl`` and the
  ``estimator`` keys but ``attention_impl``) and the run's infrastructure
  (:data:`INFRASTRUCTURE_KEYS`: the mesh and processes it ran on, its checkpoint cadence,
  writers, profile and compilation cache; a pipeline requeued onto another slice or with a new
  coordinator does not evaluate its finished SFT phase again). Another mesh evaluates the
  same checkpoint with the same sampler and keys; its sums are only reduced in another order.

Anything else (no record, an unreadable one, another step, another config) runs the phase as
before: restore, train what is left, evaluate. Delete the file to force a re-evaluation.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Sequence

from dllm_rl import paths


# Top-level config sections that change neither a finished phase's checkpoint nor what its
# test evaluation computes: where and how the run ran, not what it trained or evaluated.
INFRASTRUCTURE_KEYS = ("mesh", "distributed", "checkpoint", "compilation_cache", "profile",
                       "log", "train")


def record_path(workdir: str, phase: str) -> str:
  """The phase's record: ``<workdir>/<phase>_summary.json``."""
  return paths.join(workdir, f"{phase}_summary.json")


def fingerprint(config, unrelated_keys: Sequence[str]) -> dict[str, Any]:
  """The config as a plain dict, without the ``unrelated_keys`` (dotted: ``estimator.name``)
  and the :data:`INFRASTRUCTURE_KEYS`."""
  return _without(json.loads(config.to_json()), (*unrelated_keys, *INFRASTRUCTURE_KEYS))


def _without(tree: Any, keys: Sequence[str]) -> Any:
  """``tree`` (a config as a plain dict, changed in place) without the dotted ``keys``."""
  for key in keys:
    *parents, last = key.split(".")
    node = tree
    for part in parents:
      node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
      node.pop(last, None)
  return tree


def write(workdir: str, phase: str, step: int, config, unrelated_keys: Sequence[str],
          summary: dict[str, Any]) -> None:
  """Record the finished phase's ``summary`` (after its test evaluation), for ``step``. The
  record only saves a rerun's work: a failed write is said on stderr, and the run goes on."""
  record = {"phase": phase, "step": int(step),
            "config": fingerprint(config, unrelated_keys), "summary": summary}
  path = record_path(workdir, phase)
  try:
    paths.write_atomic(path, json.dumps(record, indent=2) + "\n")
  except OSError as err:
    print(f"[{phase}] warning: {path}: not written ({type(err).__name__}: {err}); a rerun of"
          " this workdir evaluates the finished phase again", file=sys.stderr, flush=True)


def read(workdir: str, phase: str, newest_step: int | None, config,
         unrelated_keys: Sequence[str]) -> dict[str, Any] | None:
  """The recorded summary when it evaluated ``newest_step`` (the phase's newest checkpoint)
  under this config (``unrelated_keys`` aside); else None. An unreadable record is said on
  stderr and read as none."""
  if newest_step is None:
    return None
  path = paths.resolve(record_path(workdir, phase))
  if not path.exists():
    return None
  try:
    record = json.loads(path.read_text(encoding="utf-8"))
    step, recorded, summary = record["step"], record["config"], record["summary"]
  except (OSError, ValueError, KeyError, TypeError) as err:
    print(f"[{phase}] warning: {path}: unreadable ({type(err).__name__}: {err}); the phase's"
          " test evaluation is run again", file=sys.stderr, flush=True)
    return None
  # today's unrelated keys left out of the recorded config too: a record written when fewer
  # keys were unrelated (SFT's estimator keys) still matches
  recorded = _without(recorded, (*unrelated_keys, *INFRASTRUCTURE_KEYS))
  if step != newest_step or recorded != fingerprint(config, unrelated_keys):
    return None
  return summary
