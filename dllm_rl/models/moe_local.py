"""The routed experts on one device: a dropless grouped-matmul dispatch.

``grouped_experts(x_TD, idx_TK, weight_TK, gate, up, down, dispatch)`` = Σ_k w_k ·
expert_{idx_k}(x) in float32: the T·K (token, slot) rows are sorted by expert, the three
SwiGLU matmuls run as grouped matmuls over the contiguous expert groups
(dllm_rl.kernels.grouped_matmul, ``model.moe_dispatch``: XLA's ragged dot on TPU, the tiled
grouped matmul on GPU and CPU), and the rows go back to their tokens. A row whose expert is
out of range (``idx >= E``, the experts held elsewhere under expert parallelism,
dllm_rl.models.moe_ep) joins no group and contributes exactly zero, to the output and to
every gradient.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import custom_batching

from dllm_rl.kernels import grouped_matmul as gmm

_HIGHEST = jax.lax.Precision.HIGHEST


def _experts_impl(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD, *, dispatch):
  """Σ_k w_k · expert_{idx_k}(x) for local tokens: sort the T·K (token, slot) rows by
  expert, three grouped matmuls over contiguous expert groups, unsort, combine in f32;
  rows with ``idx >= E`` sort last, outside every group, and are zeroed."""
  t, k = idx_TK.shape
  e = gate_EDF.shape[0]
  flat_R = idx_TK.reshape(-1)
  order_R = jnp.argsort(flat_R, stable=True)
  sizes_E = jnp.bincount(flat_R, length=e).astype(jnp.int32)
  x_RD = jnp.take(x_TD, order_R // k, axis=0)
  matmul = functools.partial(gmm.grouped_matmul, sizes_E=sizes_E, dispatch=dispatch)
  gate_RF = matmul(x_RD, gate_EDF)
  up_RF = matmul(x_RD, up_EDF)
  y_RD = matmul(jax.nn.silu(gate_RF) * up_RF, down_EFD)  # 0 on the ungrouped rows
  y_TKD = jnp.zeros_like(y_RD).at[order_R].set(y_RD).reshape(t, k, -1)
  return jnp.einsum("tkd,tk->td", y_TKD.astype(jnp.float32), weight_TK, precision=_HIGHEST)


# ``ragged_dot`` cannot be vmapped with unbatched weights (the samplers vmap the model over
# the G completions of a prompt), so the dispatch carries its own rules (for the tiled
# matmul too: folded lanes share its tiles, so less padding): under vmap the forward folds
# the mapped axis into the tokens (it is token-wise); the backward (a
# custom VJP, which recomputes the expert forward) maps over it. ``custom_vmap`` has no
# autodiff of its own, hence the custom VJP around both.

def _batched(axis_size, in_batched, args):
  return [a if b else jnp.broadcast_to(a, (axis_size, *a.shape)) for a, b in zip(args, in_batched)]


def grouped_experts(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD,
                    dispatch: str = "auto"):
  """float32 [T, D]: Σ_k ``weight_TK`` · expert_{``idx_TK``}(``x_TD``) (module docstring);
  vmappable with unbatched expert weights, differentiable in all but ``idx_TK``.
  ``dispatch``: ``model.moe_dispatch`` (dllm_rl.kernels.grouped_matmul)."""
  fn = _grouped_experts(gmm.resolve(dispatch))
  return fn(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD)


@functools.cache
def _grouped_experts(dispatch: str):
  """The custom-vmap / custom-VJP dispatch for one grouped-matmul implementation."""
  impl = functools.partial(_experts_impl, dispatch=dispatch)

  @custom_batching.custom_vmap
  def fwd(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD):
    return impl(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD)

  @fwd.def_vmap
  def fwd_vmap(axis_size, in_batched, x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD):
    tokens = _batched(axis_size, in_batched[:3], (x_TD, idx_TK, weight_TK))
    if any(in_batched[3:]):  # per-lane experts: one lane at a time
      args = tokens + _batched(axis_size, in_batched[3:], (gate_EDF, up_EDF, down_EFD))
      return jax.lax.map(lambda a: fwd(*a), tuple(args)), True
    x, idx, w = (a.reshape(-1, *a.shape[2:]) for a in tokens)
    y = fwd(x, idx, w, gate_EDF, up_EDF, down_EFD)
    return y.reshape(axis_size, -1, y.shape[-1]), True

  @custom_batching.custom_vmap
  def bwd(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD, ct_TD):
    fn = lambda x, w, g, u, d: impl(x, idx_TK, w, g, u, d)
    return jax.vjp(fn, x_TD, weight_TK, gate_EDF, up_EDF, down_EFD)[1](ct_TD)

  @bwd.def_vmap
  def bwd_vmap(axis_size, in_batched, *args):
    out = jax.lax.map(lambda a: bwd(*a), tuple(_batched(axis_size, in_batched, args)))
    return out, (True,) * 5

  @jax.custom_vjp
  def experts(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD):
    return fwd(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD)

  def vjp_fwd(*args):
    return fwd(*args), args

  def vjp_bwd(res, ct_TD):
    dx, dw, dg, du, dd = bwd(*res, ct_TD)
    return dx, None, dw, dg, du, dd

  experts.defvjp(vjp_fwd, vjp_bwd)
  return experts
