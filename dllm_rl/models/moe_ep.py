"""Expert parallelism: each token's rows travel to the devices that hold their experts.

Runs inside ``shard_map`` (dllm_rl.models.moe.routed_experts) on a mesh whose 'expert'
axis has ep > 1 devices: the tokens are split over the batch axes, 'expert' included, and
each device holds the weights of E_l = E/ep experts (device i: experts i·E_l … (i+1)·E_l−1,
never gathered over 'expert'). Per device, with T local tokens and R = T·K rows:

1. dispatch: the R (token, slot) rows are sorted by expert, which also groups them by the
   device owning the expert (experts are contiguous per device); each device learns how
   many rows every peer sends to each of its experts (an ``all_to_all`` of [ep, E_l]
   counts) and the rows are exchanged over 'expert';
2. compute: the received rows, each peer's already sorted by expert, run through the
   dropless grouped matmuls of dllm_rl.models.moe_local with one slot of weight 1 (rows
   come back exactly as a single device computes them);
3. return: the reverse exchange brings every row home, where it is unsorted and combined
   with its routing weight in float32.

Two exchanges, chosen at lowering by platform (``jax.lax.platform_dependent``, so that an
ahead-of-time compile for TPU from a CPU host takes the TPU path):

* TPU, GPU: ``jax.lax.ragged_all_to_all`` sends only the routed rows (R rows out).
* CPU (XLA:CPU has no ragged-all-to-all): ``jax.lax.all_to_all`` of an [ep, R, D] buffer
  whose slot per peer is the worst case, all R local rows to one peer. Exact and dropless,
  but ep× the rows on the wire and in both buffers; ragged_all_to_all removes that.

Either way the receive buffer holds ep·R rows, the dropless worst case (every peer's rows
on this device's experts), and the grouped matmuls run over it with the received group
sizes (rows past them join no group). XLA's cost analysis counts the whole buffer (the
planner's "XLA TF/dev" column grows with ep; its analytic FLOPs do not); whether the TPU
ragged dot skips the empty tail has not been measured, and a capacity bound on the buffer
(MaxText's capacity factor, not dropless) is the remedy if it does not. Gradients flow
through both exchanges (their transposes are the reverse exchanges) and through the
grouped matmuls' custom VJP.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dllm_rl.models.moe_local import grouped_experts

AXIS = "expert"
_HIGHEST = jax.lax.Precision.HIGHEST


def _exclusive_cumsum(x):
  return jnp.cumsum(x, axis=-1) - x


def _local_expert(ends, pos):
  """Local expert of each row position given the cumulative row ends of the experts
  (E_l = len(ends): past the last end, i.e. padding)."""
  return jnp.searchsorted(ends, pos, side="right").astype(jnp.int32)


def _padded_exchange(x_RD, send_P, recv_counts_PE, compute):
  """all_to_all with a worst-case slot of R rows per peer (CPU)."""
  r, d = x_RD.shape
  start_P = _exclusive_cumsum(send_P)
  pos_R = jnp.arange(r, dtype=jnp.int32)
  ok_PR = pos_R[None, :] < send_P[:, None]
  src_PR = jnp.clip(start_P[:, None] + pos_R[None, :], 0, r - 1)
  send_PRD = jnp.where(ok_PR[..., None], jnp.take(x_RD, src_PR, axis=0), 0)
  recv_PRD = jax.lax.all_to_all(send_PRD, AXIS, 0, 0, tiled=True)  # [q]: peer q's rows
  ends_PE = jnp.cumsum(recv_counts_PE, axis=-1)
  local_PR = jax.vmap(_local_expert, (0, None))(ends_PE, pos_R)
  ep = send_P.shape[0]
  y_PRD = compute(recv_PRD.reshape(ep * r, d), local_PR.reshape(-1)).reshape(ep, r, d)
  back_PRD = jax.lax.all_to_all(y_PRD, AXIS, 0, 0, tiled=True)  # [p]: my rows, from peer p
  dest_R = jnp.searchsorted(jnp.cumsum(send_P), pos_R, side="right")
  return back_PRD[dest_R, pos_R - start_P[dest_R]]


def _ragged_exchange(x_RD, send_P, recv_counts_PE, compute):
  """ragged_all_to_all: only the routed rows travel (TPU, GPU)."""
  r, d = x_RD.shape
  ep = send_P.shape[0]
  sent_QP = jax.lax.all_gather(send_P, AXIS)  # rows peer q sends to peer p
  me = jax.lax.axis_index(AXIS)
  in_off_P = _exclusive_cumsum(send_P)
  out_off_P = (jnp.cumsum(sent_QP, axis=0) - sent_QP)[me]  # where my rows land on each peer
  recv_P = sent_QP[:, me]
  recv_MD = jax.lax.ragged_all_to_all(x_RD, jnp.zeros((ep * r, d), x_RD.dtype), in_off_P,
                                      send_P, out_off_P, recv_P, axis_name=AXIS)
  n_local = recv_counts_PE.shape[1]
  seg_M = _local_expert(jnp.cumsum(recv_counts_PE.reshape(-1)), jnp.arange(ep * r))
  local_M = jnp.where(seg_M < ep * n_local, seg_M % n_local, n_local)
  y_MD = compute(recv_MD, local_M)
  home_off_P = jax.lax.all_to_all(in_off_P, AXIS, 0, 0, tiled=True)  # peer q's in_off[me]
  return jax.lax.ragged_all_to_all(y_MD, jnp.zeros((r, d), y_MD.dtype),
                                   _exclusive_cumsum(recv_P), recv_P, home_off_P, send_P,
                                   axis_name=AXIS)


def expert_parallel(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD,
                    dispatch: str = "auto") -> jax.Array:
  """float32 [T, D] = Σ_k w_k · expert_{idx_k}(x) for this device's tokens, its E_l
  experts' weights ``gate_EDF`` … local (E_l = E/ep); inside ``shard_map`` over 'expert'.
  ``dispatch``: the grouped matmuls' (``model.moe_dispatch``)."""
  t, k = idx_TK.shape
  n_local = gate_EDF.shape[0]
  ep = jax.lax.axis_size(AXIS)
  flat_R = idx_TK.reshape(-1)
  order_R = jnp.argsort(flat_R, stable=True)
  x_RD = jnp.take(x_TD, order_R // k, axis=0)
  counts_PE = jnp.bincount(flat_R, length=ep * n_local).astype(jnp.int32).reshape(ep, n_local)
  recv_counts_PE = jax.lax.all_to_all(counts_PE, AXIS, 0, 0, tiled=True)
  send_P = counts_PE.sum(-1)

  def compute(rows_MD, local_M):
    y = grouped_experts(rows_MD, local_M[:, None], jnp.ones((rows_MD.shape[0], 1), jnp.float32),
                        gate_EDF, up_EDF, down_EFD, dispatch)
    return y.astype(rows_MD.dtype)  # one slot of weight 1: exact in the activation dtype

  exchange = lambda fn: (lambda x: fn(x, send_P, recv_counts_PE, compute))
  y_RD = jax.lax.platform_dependent(x_RD, cpu=exchange(_padded_exchange),
                                    default=exchange(_ragged_exchange))
  y_TKD = jnp.zeros_like(y_RD).at[order_R].set(y_RD).reshape(t, k, -1)
  return jnp.einsum("tkd,tk->td", y_TKD.astype(jnp.float32), weight_TK, precision=_HIGHEST)


def local_experts_only(x_TD, idx_TK, weight_TK, gate_EDF, up_EDF, down_EFD,
                       dispatch: str = "auto") -> jax.Array:
  """The same sum when the tokens are replicated over 'expert' (a batch 'expert' does not
  divide): each device adds its own experts' share; the caller sums over 'expert'."""
  n_local = gate_EDF.shape[0]
  rel_TK = idx_TK - jax.lax.axis_index(AXIS) * n_local
  local_TK = jnp.where((rel_TK >= 0) & (rel_TK < n_local), rel_TK, n_local)
  return grouped_experts(x_TD, local_TK, weight_TK, gate_EDF, up_EDF, down_EFD, dispatch)
