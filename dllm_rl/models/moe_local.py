"""The routed experts on one device: a dropless grouped-matmul dispatch.

``grouped_experts(x_TD, idx_TK, weight_TK, gate, up, down)`` = Σ_k w_k · expert_{idx_k}(x)
in float32: the T·K (token, slot) rows are sorted by expert, the three SwiGLU matmuls run
as grouped matmuls (``jax.lax.ragged_dot``) over the contiguous expert groups, and the
rows go back to their tokens. A row whose expert is out of range (``idx >= E``, the
experts held elsewhere under expert parallelism, dllm_rl.models.moe_ep) joins no group
and contributes exactly zero. On TPU ``ragged_dot`` lowers to XLA's ragged-dot instruction
(only the routed rows are multiplied); on CPU jax lowers it to its reference, a dense dot over
every group with masked rows (E× the FLOPs: tests only), and XLA's GPU compiler (jax 0.11.2,
compiled for an absent H100) expands it the same way, with [E, rows, D] masks far beyond a
GPU's memory at LLaDA2-mini size (README "Model-zoo plans"): no GPU dispatch yet.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import custom_batching

_HIGHEST = jax.lax.Precision.HIGHEST


def _experts_impl(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD):
  """Σ_k w_k · expert_{idx_k}(x) for local tokens: sort the T·K (token, slot) rows by
  expert, three grouped matmuls over contiguous expert groups, unsort, combine in f32;
  rows with ``idx >= E`` sort last, outside every group, and are zeroed."""
  t, k = idx_TK.shape
  e = gate_EDF.shape[0]
  flat_R = idx_TK.reshape(-1)
  order_R = jnp.argsort(flat_R, stable=True)
  sizes_E = jnp.bincount(flat_R, length=e).astype(jnp.int32)
  x_RD = jnp.take(x_TD, order_R // k, axis=0)
  gate_RF = jax.lax.ragged_dot(x_RD, gate_EDF, sizes_E)
  up_RF = jax.lax.ragged_dot(x_RD, up_EDF, sizes_E)
  y_RD = jax.lax.ragged_dot(jax.nn.silu(gate_RF) * up_RF, down_EFD, sizes_E)
  y_TKD = jnp.zeros_like(y_RD).at[order_R].set(y_RD).reshape(t, k, -1)
  y_TKD = jnp.where((idx_TK < e)[..., None], y_TKD, 0)  # ragged_dot leaves ungrouped rows unset
  return jnp.einsum("tkd,tk->td", y_TKD.astype(jnp.float32), weight_TK, precision=_HIGHEST)


# ``ragged_dot`` cannot be vmapped with unbatched weights (the samplers vmap the model over
# the G completions of a prompt), so the dispatch carries its own rules: under vmap the
# forward folds the mapped axis into the tokens (it is token-wise); the backward (a
# custom VJP, which recomputes the expert forward) maps over it. ``custom_vmap`` has no
# autodiff of its own, hence the custom VJP around both.

def _batched(axis_size, in_batched, args):
  return [a if b else jnp.broadcast_to(a, (axis_size, *a.shape)) for a, b in zip(args, in_batched)]


@custom_batching.custom_vmap
def _experts_fwd(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD):
  return _experts_impl(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD)


@_experts_fwd.def_vmap
def _experts_fwd_vmap(axis_size, in_batched, x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD):
  tokens = _batched(axis_size, in_batched[:3], (x_TD, idx_TK, weight_TK))
  if any(in_batched[3:]):  # per-lane experts: one lane at a time
    args = tokens + _batched(axis_size, in_batched[3:], (gate_EDF, up_EDF, down_EFD))
    return jax.lax.map(lambda a: _experts_fwd(*a), tuple(args)), True
  x, idx, w = (a.reshape(-1, *a.shape[2:]) for a in tokens)
  y = _experts_fwd(x, idx, w, gate_EDF, up_EDF, down_EFD)
  return y.reshape(axis_size, -1, y.shape[-1]), True


@custom_batching.custom_vmap
def _experts_bwd(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD, ct_TD):
  fn = lambda x, w, g, u, d: _experts_impl(x, idx_TK, w, g, u, d)
  return jax.vjp(fn, x_TD, weight_TK, gate_EDF, up_EDF, down_EFD)[1](ct_TD)


@_experts_bwd.def_vmap
def _experts_bwd_vmap(axis_size, in_batched, *args):
  out = jax.lax.map(lambda a: _experts_bwd(*a), tuple(_batched(axis_size, in_batched, args)))
  return out, (True,) * 5


@jax.custom_vjp
def grouped_experts(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD):
  """float32 [T, D]: Σ_k ``weight_TK`` · expert_{``idx_TK``}(``x_TD``) (module docstring);
  vmappable with unbatched expert weights, differentiable in all but ``idx_TK``."""
  return _experts_fwd(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD)


def _experts_vjp_fwd(*args):
  return _experts_fwd(*args), args


def _experts_vjp_bwd(res, ct_TD):
  dx, dw, dg, du, dd = _experts_bwd(*res, ct_TD)
  return dx, None, dw, dg, du, dd


grouped_experts.defvjp(_experts_vjp_fwd, _experts_vjp_bwd)
