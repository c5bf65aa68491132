"""The pure, jitted SFT step: ``sft_step(state, batch, key) -> (state, metrics)``."""

from __future__ import annotations

from typing import Callable

import jax
import optax

from dllm_rl.diffusion.block import block_sft_loss
from dllm_rl.diffusion.sft import sft_loss
from dllm_rl.models import lora
from dllm_rl.parallel.constraints import jit_sharded
from dllm_rl.parallel.shard import replicated
from dllm_rl.types import SequenceBatch, TrainState


ESTIMATOR_KEYS = ("attention_impl",)  # the only estimator.* keys SFT reads (step_options)


def step_options(config) -> dict:
  """The static SFT-step options a run's config sets (shared by the SFT loop and the
  planner, so that the planned program is the one that runs)."""
  return dict(t_eps=config.sft.t_eps, block_size=config.model.block_size,
              attention_impl=config.estimator.attention_impl,
              prompt_block_causal=config.model.prompt_block_causal,
              logits_chunk=config.model.logits_chunk)


def make_sft_step(graphdef, optimizer: optax.GradientTransformation, schedule: optax.Schedule,
                  *, mask_id: int, t_eps: float, mesh=None, state_sharding=None,
                  block_size: int = 0, attention_impl: str = "auto",
                  prompt_block_causal: bool = False, logits_chunk: int = 0) -> Callable:
  """Build the jitted step (state donated). Metrics: loss, grad_norm (pre-clip), lr.

  ``block_size > 0``: a block-diffusion model, trained with the per-block
  objective in one staircase pass (dllm_rl.diffusion.block). With a ``mesh``,
  the new state keeps ``state_sharding`` and the metrics are replicated; the
  batch arrives sharded over the batch axes. ``logits_chunk``: rows per vocabulary
  slab of the chunked log-softmax (``model.logits_chunk``; 0 = the whole completion)."""

  def sft_step(state: TrainState, batch: SequenceBatch, key: jax.Array):
    def loss_fn(params):
      params = lora.freeze_base(params)  # LoRA: gradients reach the adapters only
      if block_size:
        return block_sft_loss(graphdef, params, batch, key, mask_id=mask_id, t_eps=t_eps,
                              block_size=block_size, attention_impl=attention_impl,
                              prompt_block_causal=prompt_block_causal,
                              logits_chunk=logits_chunk)
      return sft_loss(graphdef, params, batch, key, mask_id=mask_id, t_eps=t_eps,
                      logits_chunk=logits_chunk)

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads), lr=schedule(state.step))
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics

  out = None if mesh is None else (state_sharding, replicated(mesh))
  return jit_sharded(sft_step, mesh, out_shardings=out, donate_argnums=0)
