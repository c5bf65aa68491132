"""Mode dispatch: ``run(config, workdir)`` validates, builds the context, runs the mode.

Modes are registered by name; ``config.mode`` is checked against this registry
during validation.
"""

from __future__ import annotations

import json
import os
import time

from dllm_rl.registry import Registry

MODES: Registry = Registry("mode")


@MODES.register("sft")
def _sft(ctx) -> dict:
  from dllm_rl.train.sft_loop import run_sft
  return run_sft(ctx)


@MODES.register("eval")
def _eval(ctx) -> dict:
  from dllm_rl.train.eval_mode import run_eval
  return run_eval(ctx)


def run(config, workdir: str) -> dict:
  """Run ``config.mode``; write ``workdir/summary.json`` and return the summary."""
  from dllm_rl.config import validate
  from dllm_rl.setup import build_context

  t0 = time.time()
  validate(config)
  ctx = build_context(config, workdir)
  summary = {"mode": config.mode, **MODES.get(config.mode)(ctx)}
  summary["wall_seconds"] = time.time() - t0
  with open(os.path.join(workdir, "summary.json"), "w") as fh:
    json.dump(summary, fh, indent=2)
  return summary
