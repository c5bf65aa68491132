"""``eval`` mode: restore the latest checkpoint of the newest phase and report accuracy."""

from __future__ import annotations

import jax

from dllm_rl import paths
from dllm_rl.parallel.shard import init_state_sharded
from dllm_rl.train import evaluation
from dllm_rl.train.context import Context, init_params
from dllm_rl.train.optim import make_optimizer
from dllm_rl.train.phases import checkpoint_dir, open_checkpointer
from dllm_rl.train.rl_loop import rl_optimizer

PHASES = ("sft", "rl")  # newest last


def restore_latest(ctx: Context):
  """(phase, graphdef, state) of the latest checkpoint of the newest phase in the workdir."""
  for phase in reversed(PHASES):
    if paths.resolve(checkpoint_dir(ctx.workdir, phase)).is_dir():
      break
  else:
    raise FileNotFoundError(
        f"eval mode needs a checkpoint: none under {paths.join(ctx.workdir, 'checkpoints')}"
        " (run mode 'sft' with this --workdir first)")
  graphdef, params = init_params(ctx)
  optimizer = (rl_optimizer(ctx.config.rl) if phase == "rl" else make_optimizer(ctx.config.sft))[0]
  kl = phase == "rl" and ctx.config.rl.kl_coef > 0
  template, _ = init_state_sharded(params, optimizer, jax.random.key(0), ctx.mesh,
                                   ref_params=params if kl else None)
  with open_checkpointer(ctx, phase) as ckpt:
    state, _ = ckpt.restore(template)
  return phase, graphdef, state


def run_eval(ctx: Context) -> dict:
  phase, graphdef, state = restore_latest(ctx)
  result = evaluation.evaluate_policy(graphdef, state.params, ctx.decoding, ctx.test,
                                      ctx.eval_options)
  print(f"[eval] {phase} checkpoint step {int(state.step)}: test accuracy {result['accuracy']:.3f}"
        f", pass@k {result['pass_at_k']}", flush=True)
  return {"phase": phase, "step": int(state.step), "test_accuracy": result["accuracy"],
          "test_reward": result["reward"], "pass_at_k": result["pass_at_k"],
          "sample_accuracy": result["sample_accuracy"], "diversity": result["diversity"]}
