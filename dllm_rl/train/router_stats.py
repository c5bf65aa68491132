"""Router load statistics of a mixture-of-experts policy on a rollout batch (for the metrics).

Every ``rl.log_every`` steps the RL phase runs the policy once over the batch's
[prompt | completion] sequences under the sampler's attention mask and logs, per MoE
layer l, ``router_max_fraction_l{l}`` (the largest fraction of the valid tokens routed to
one expert; a token picks ``experts_per_token`` experts, so fractions sum to that) and
``router_imbalance_l{l}`` (the busiest expert's load over the mean load: 1 = perfectly
balanced, ``n_experts / experts_per_token`` = every token on the same experts), and
``router_imbalance_max`` over the layers (:func:`dllm_rl.models.moe.load_stats`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dllm_rl.kernels.block_mask import block_causal_mask
from dllm_rl.models import moe, transformer


@functools.partial(jax.jit, static_argnums=0,
                   static_argnames=("moe_layers", "block_size", "prompt_block_causal"))
def router_metrics(graphdef, params, prompt_BP, prompt_valid_BP, completion_BGL, *,
                   moe_layers: tuple[int, ...], block_size: int,
                   prompt_block_causal: bool) -> dict:
  """The module docstring's metrics (float32 scalars) for one rollout batch; ``moe_layers``:
  the indices of the MoE layers (``ModelConfig.is_moe_layer``), in order."""
  b, g, l = completion_BGL.shape
  prompt_NP = jnp.repeat(prompt_BP, g, axis=0)
  valid_NP = jnp.repeat(prompt_valid_BP, g, axis=0)
  tokens_NS = jnp.concatenate([prompt_NP, completion_BGL.reshape(b * g, l)], axis=1)
  valid_NS = jnp.concatenate([valid_NP, jnp.ones((b * g, l), bool)], axis=1)
  if block_size:
    mask = block_causal_mask(valid_NP, l, block_size, prompt_block_causal)
  else:
    mask = valid_NS[:, None, :]
  positions_NS = transformer.positions_from_valid(valid_NS)
  _, routings = transformer.apply_routing(graphdef, params, tokens_NS, positions_NS, mask)
  out, worst = {}, jnp.float32(0.0)
  n_experts = routings[0].logits_TE.shape[-1] if routings else 0
  for layer, r in zip(moe_layers, routings, strict=True):
    stats = moe.load_stats(r.idx_TK, n_experts, valid_NS.reshape(-1))
    out[f"router_max_fraction_l{layer}"] = stats["fraction_E"].max().astype(jnp.float32)
    out[f"router_imbalance_l{layer}"] = stats["imbalance"].astype(jnp.float32)
    worst = jnp.maximum(worst, out[f"router_imbalance_l{layer}"])
  out["router_imbalance_max"] = worst
  return out
