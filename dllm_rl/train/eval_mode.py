"""``eval`` mode: restore the latest checkpoint of the newest phase and report accuracy."""

from __future__ import annotations

import dataclasses
import os

import jax

from dllm_rl import evaluation
from dllm_rl.setup import Context, init_params
from dllm_rl.train.optim import make_optimizer
from dllm_rl.train.sft_loop import checkpoint_dir, open_checkpointer
from dllm_rl.train.sft_step import init_train_state

PHASES = ("sft",)  # newest last


def run_eval(ctx: Context) -> dict:
  for phase in reversed(PHASES):
    if os.path.isdir(checkpoint_dir(ctx.workdir, phase)):
      break
  else:
    raise FileNotFoundError(
        f"eval mode needs a checkpoint: none under {os.path.join(ctx.workdir, 'checkpoints')}"
        " (run mode 'sft' with this --workdir first)")
  graphdef, params = init_params(ctx)
  optimizer, _ = make_optimizer(ctx.config.sft)
  template = init_train_state(params, optimizer, jax.random.key(0))
  with open_checkpointer(ctx, phase) as ckpt:
    state, _ = ckpt.restore(template)
  result = evaluation.greedy_accuracy(
      graphdef, state.params, task=ctx.task, tokenizer=ctx.tokenizer,
      examples=ctx.test_examples, arrays=ctx.test_arrays,
      cfg=dataclasses.replace(ctx.sampler_cfg, temperature=0.0),
      batch_size=ctx.config.eval.batch_size)
  print(f"[eval] {phase} checkpoint step {int(state.step)}: test accuracy {result['accuracy']:.3f}",
        flush=True)
  return {"phase": phase, "step": int(state.step), "test_accuracy": result["accuracy"],
          "test_reward": result["reward"]}
