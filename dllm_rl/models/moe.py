"""Mixture-of-experts feed-forward of LLaDA2.0 / 2.1-mini (``LLaDA2MoeSparseMoeBlock``).

What the official code runs (tests/fixtures/llada2_moe_tiny/README.md, "Forward
semantics"), on the normed hidden state n of each token:

1. router logits ``n @ W_gate`` in float32, scores ``s = sigmoid(logits)``;
2. selection on the *biased* scores ``s + expert_bias``: the experts form ``n_groups``
   contiguous groups, a group scores the sum of its top-2 biased scores, the best
   ``topk_groups`` groups are kept and the ``top_k`` best experts among them chosen;
3. combine weights = the *unbiased* ``s`` at the chosen experts, normalised to sum 1
   (when top_k > 1), times ``routed_scaling``;
4. ``y = Σ_k w_k · expert_k(n) + shared(n)``: SwiGLU experts, the shared expert
   (width ``moe_hidden · n_shared_experts``) ungated and unscaled. No capacity limit,
   no token dropping, no jitter, no auxiliary loss.

Dispatch is dropless and touches only the chosen experts (dllm_rl.models.moe_local):
the (token, slot) pairs are sorted by expert, the three expert matmuls run as grouped
matmuls over the sorted rows (``model.moe_dispatch``, dllm_rl.kernels.grouped_matmul: XLA's
ragged dot on TPU, a tiled grouped matmul on GPU and CPU), then the rows go back to their
tokens and are combined with their weights in float32. On a mesh
(dllm_rl.parallel.rules) it runs in ``shard_map``: with ``mesh.expert`` = 1 per batch
shard (tokens never leave their device; the expert weights are gathered like FSDP
weights); with ``mesh.expert`` > 1 expert-parallel (dllm_rl.models.moe_ep: each device
keeps E/expert experts and the rows travel to them by all-to-all). The experts' hidden
width stays split over ``tensor``, with one ``psum`` of the combined output.

Expert weights are stacked, ``[E, D, F]`` / ``[E, F, D]``, on the logical axis
``"expert"``. The router sees its weights, its bias and its input in ``dtype`` upcast
to float32, as the official bf16 model does (its ``.to(bfloat16)`` also rounds the
bias); in float32 this is exactly the official float32 router. ``expert_bias`` is a
:class:`~dllm_rl.models.layers.FrozenParam`: read through ``stop_gradient`` and never
updated by the optimiser (the official bias moves by load balancing outside backprop).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from dllm_rl.models import layers, moe_ep
from dllm_rl.models.moe_local import grouped_experts
from dllm_rl.parallel.constraints import shard_axes

_HIGHEST = jax.lax.Precision.HIGHEST


class Routing(NamedTuple):
  """One MoE layer's router decisions for T tokens."""

  idx_TK: jax.Array      # int32 chosen experts, by descending biased score
  weight_TK: jax.Array   # float32 combine weights (sum = routed_scaling per token)
  logits_TE: jax.Array   # float32 router logits, before the sigmoid


def route(x_TD: jax.Array, w_gate_DE: jax.Array, bias_E: jax.Array, *, top_k: int,
          n_groups: int, topk_groups: int, scaling: float) -> Routing:
  """Group-limited top-k sigmoid routing with a selection-only bias (steps 1–3 above)."""
  logits_TE = jnp.dot(x_TD.astype(jnp.float32), w_gate_DE.astype(jnp.float32),
                      precision=_HIGHEST)
  scores_TE = jax.nn.sigmoid(logits_TE)
  biased_TE = scores_TE + jax.lax.stop_gradient(bias_E.astype(jnp.float32))
  t, e = biased_TE.shape
  if topk_groups < n_groups:
    grouped_TGX = biased_TE.reshape(t, n_groups, e // n_groups)
    group_TG = jax.lax.top_k(grouped_TGX, 2)[0].sum(-1)
    _, keep_TJ = jax.lax.top_k(group_TG, topk_groups)
    kept_TG = jax.nn.one_hot(keep_TJ, n_groups, dtype=jnp.bool_).any(axis=1)
    biased_TE = jnp.where(jnp.repeat(kept_TG, e // n_groups, axis=-1), biased_TE, -jnp.inf)
  _, idx_TK = jax.lax.top_k(jax.lax.stop_gradient(biased_TE), top_k)
  weight_TK = jnp.take_along_axis(scores_TE, idx_TK, axis=-1)
  if top_k > 1:
    weight_TK = weight_TK / (weight_TK.sum(-1, keepdims=True) + 1e-20)
  return Routing(idx_TK.astype(jnp.int32), weight_TK * scaling, logits_TE)


def routed_experts(x_BND, idx_BNK, weight_BNK, gate_EDF, up_EDF, down_EFD,
                   dispatch: str = "auto") -> jax.Array:
  """float32 [B, N, D] routed-expert output (step 4 without the shared expert); per
  batch shard, or expert-parallel, on a mesh with the framework's axes (module docstring).
  ``dispatch``: the grouped matmuls' (``model.moe_dispatch``)."""
  b, n, d = x_BND.shape
  k = idx_BNK.shape[-1]
  axes = shard_axes(b, (gate_EDF.shape[-1],))
  expert = axes is not None and axes.expert is not None
  if expert and gate_EDF.shape[0] % axes.mesh.shape["expert"]:
    raise ValueError(f"mesh.expert = {axes.mesh.shape['expert']} must divide the"
                     f" {gate_EDF.shape[0]} experts")
  experts, psum_axes = grouped_experts, ()
  if expert and axes.batch:  # tokens split over 'expert': rows travel by all-to-all
    experts = moe_ep.expert_parallel
  elif expert:  # tokens replicated over 'expert': each device adds its experts' share
    experts, psum_axes = moe_ep.local_experts_only, ("expert",)
  if axes is not None and axes.tensor is not None:  # the experts' width split over 'tensor'
    psum_axes += (axes.tensor,)

  def local(x, idx, w, g, u, dn):
    bl = x.shape[0]
    y = experts(x.reshape(bl * n, d), idx.reshape(bl * n, k), w.reshape(bl * n, k),
                g, u, dn, dispatch).reshape(bl, n, d)
    return jax.lax.psum(y, psum_axes) if psum_axes else y

  args = (x_BND, idx_BNK, weight_BNK, gate_EDF, up_EDF, down_EFD)
  if axes is None or not (axes.batch or axes.tensor or expert):
    return local(*args)
  tok, e, t = P(axes.batch, None, None), axes.expert, axes.tensor
  specs = (tok, tok, tok, P(e, None, t), P(e, None, t), P(e, t, None))
  return jax.shard_map(local, mesh=axes.mesh, in_specs=specs, out_specs=tok,
                       check_vma=False)(*args)


class MoE(nnx.Module):
  """Routed SwiGLU experts + shared expert (``n_shared_experts`` > 0), module docstring."""

  def __init__(self, cfg, rngs: nnx.Rngs):
    d, e, f, pdt, std = cfg.d_model, cfg.n_experts, cfg.moe_hidden, cfg.param_dtype, cfg.init_std
    self.cfg = cfg
    normal = lambda shape, s: s * jax.random.normal(rngs.params(), shape, pdt)
    self.router = nnx.Param(normal((d, e), std), logical_axes=("embed", "expert"))
    self.expert_bias = layers.FrozenParam(jnp.zeros((e,), pdt), logical_axes=("expert",))
    self.gate_proj = nnx.Param(normal((e, d, f), std), logical_axes=("expert", "embed", "mlp"))
    self.up_proj = nnx.Param(normal((e, d, f), std), logical_axes=("expert", "embed", "mlp"))
    self.down_proj = nnx.Param(normal((e, f, d), std / math.sqrt(2 * cfg.n_layers)),
                               logical_axes=("expert", "mlp", "embed"))
    if cfg.n_shared_experts:
      self.shared = layers.SwiGLU(cfg, rngs, hidden=f * cfg.n_shared_experts)

  def route(self, x_BND: jax.Array) -> Routing:
    """The router's decisions for the B·N tokens (flattened, row-major)."""
    cfg = self.cfg
    upcast = lambda v: v[...].astype(cfg.dtype).astype(jnp.float32)
    return route(x_BND.reshape(-1, x_BND.shape[-1]), upcast(self.router), upcast(self.expert_bias),
                 top_k=cfg.experts_per_token, n_groups=cfg.n_expert_groups,
                 topk_groups=cfg.topk_groups, scaling=cfg.routed_scaling)

  def __call__(self, x_BND: jax.Array) -> jax.Array:
    return self.forward(x_BND)[0]

  def forward(self, x_BND: jax.Array) -> tuple[jax.Array, Routing]:
    """(output [B, N, D] in ``x``'s dtype, the routing used)."""
    dt, (b, n, _) = self.cfg.dtype, x_BND.shape
    r = self.route(x_BND)
    y = routed_experts(x_BND, r.idx_TK.reshape(b, n, -1), r.weight_TK.reshape(b, n, -1),
                       self.gate_proj[...].astype(dt), self.up_proj[...].astype(dt),
                       self.down_proj[...].astype(dt), self.cfg.moe_dispatch).astype(x_BND.dtype)
    if self.cfg.n_shared_experts:
      y = y + self.shared(x_BND)
    return y, r


def load_stats(idx_TK: jax.Array, n_experts: int, valid_T: jax.Array | None = None) -> dict:
  """Router load of one layer over a batch (for logging): ``fraction_E`` = fraction of
  the (valid) tokens routed to each expert (sums to top_k), ``max_load`` / ``mean_load``
  = the largest / mean expert count in tokens, ``imbalance`` = max / mean (1 = perfect
  balance; ``n_experts / top_k`` = all tokens on the same experts)."""
  onehot_TKE = jax.nn.one_hot(idx_TK, n_experts, dtype=jnp.float32)
  if valid_T is not None:
    onehot_TKE = onehot_TKE * valid_T.astype(jnp.float32)[:, None, None]
  count_E = onehot_TKE.sum((0, 1))
  tokens = onehot_TKE.sum() / idx_TK.shape[1]
  mean = count_E.mean()
  return {"fraction_E": count_E / jnp.maximum(tokens, 1.0), "max_load": count_E.max(),
          "mean_load": mean, "imbalance": count_E.max() / jnp.maximum(mean, 1e-9)}
