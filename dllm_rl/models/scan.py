"""The layer stack of the transformer: unrolled, or one ``lax.scan`` over the layers,
each optionally rematerialised (``model.scan_layers``, ``model.remat``), as MaxText does.

Parameters keep their per-layer layout (``blocks/i/...``: HF import/export, sharding
rules and checkpoints are unchanged). With ``scan_layers`` the per-layer parameters are
cast to the compute dtype and stacked along a new leading axis inside the traced
forward (one copy of the layer weights in ``dtype``; gradients flow back through the
stack), and a single block body is compiled instead of ``n_layers`` copies. Every
layer casts its weights to ``dtype`` before use, so the pre-cast changes no value:
scan and unrolled give the same logits.

Layers need not all be alike (LLaDA2 MoE: dense layers, then MoE layers): each run
of consecutive layers with the same structure (equal graphdefs) is one scan.

Remat policies (``jax.checkpoint``; what the backward pass keeps from the forward):

* ``none``    keep every activation (no recomputation);
* ``full``    keep only each layer's input, recompute the layer in the backward pass;
* ``minimal`` keep matmul outputs without batch dimensions (the projections), recompute
              the rest (attention scores, norms, activations);
* ``dots``    keep every matmul output.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
from flax import nnx

from dllm_rl.parallel.constraints import constrain_activations

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
}


def _layer_fn(graphdef, remat: str, in_scan: bool):
  """(layer params, x, cos, sin, mask) → x after one block, rematerialised per policy."""

  def layer(state, x, cos, sin, mask):
    return constrain_activations(nnx.merge(graphdef, state)(x, cos, sin, mask))

  if remat not in REMAT_POLICIES:
    raise ValueError(f"model.remat={remat!r}: must be one of {sorted(REMAT_POLICIES)}")
  if remat == "none":
    return layer
  # Inside a scan, CSE cannot merge the recomputation into the forward: no barrier needed.
  return jax.checkpoint(layer, policy=REMAT_POLICIES[remat], prevent_cse=not in_scan)


def run_blocks(blocks, x_BND, cos_BNQ, sin_BNQ, mask_BNM, *, scan_layers: bool, remat: str,
               dtype):
  """``x`` through every block of ``blocks`` (an nnx.List of Blocks)."""
  if not scan_layers and remat == "none":
    for block in blocks:
      x_BND = constrain_activations(block(x_BND, cos_BNQ, sin_BNQ, mask_BNM))
    return x_BND
  splits = [nnx.split(block) for block in blocks]
  if not scan_layers:
    for graphdef, state in splits:
      x_BND = _layer_fn(graphdef, remat, in_scan=False)(state, x_BND, cos_BNQ, sin_BNQ, mask_BNM)
    return x_BND
  for graphdef, run in itertools.groupby(splits, key=lambda split: split[0]):
    x_BND = _scan_run(graphdef, [state for _, state in run], x_BND, cos_BNQ, sin_BNQ, mask_BNM,
                      remat=remat, dtype=dtype)
  return x_BND


def _scan_run(graphdef, states, x_BND, cos_BNQ, sin_BNQ, mask_BNM, *, remat: str, dtype):
  """One ``lax.scan`` over layers of one structure (``states`` stacked in ``dtype``)."""
  layer = _layer_fn(graphdef, remat, in_scan=True)
  stacked = jax.tree.map(lambda *xs: jnp.stack([a.astype(dtype) for a in xs]), *states)

  def body(x, state):
    return layer(state, x, cos_BNQ, sin_BNQ, mask_BNM), None

  x_BND, _ = jax.lax.scan(body, x_BND, stacked)
  return x_BND
