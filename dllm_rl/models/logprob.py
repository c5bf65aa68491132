"""LM head, log-softmax, target log-probability and entropy over the vocabulary,
in chunks of rows with a hand-written VJP (issue 10: "chunked vocabulary").

For hidden states h (the final norm's output) and the head W [D, V]:

    z_i = h_i W,   lse_i = log Σ_v e^{z_iv},   log p_i(y_i) = z_{i,y_i} − lse_i,
    H_i = lse_i − Σ_v p_iv z_iv                              (predictive entropy, nats)

with cotangents (ḡ, ē) of (log p_i(y_i), H_i):

    ∂/∂z_iv = ḡ_i (1[v = y_i] − p_iv) − ē_i p_iv (z_iv − Σ_u p_iu z_iu)
            (log p_iv + H_i = z_iv − Σ_u p_iu z_iu, computed in that form),
    ∂/∂h_i = (∂/∂z_i) Wᵀ,   ∂/∂W = Σ_i h_iᵀ (∂/∂z_i).

The rows are processed ``chunk`` at a time (a ``lax.scan`` over chunks of the
sequence axis), forward and backward: no more than one [B, chunk, V] float32
slab of logits (and its softmax) is live per chunk, instead of the full
[B, L, V] logits and the several float32 copies autodiff of a log-softmax keeps
for the backward pass. The backward pass recomputes each chunk's logits from h
and W (saving only h and the log-normaliser [B, L]) and
accumulates ∂/∂W in float32. Matmuls run in h's dtype with float32 accumulation,
as the model's head does; everything returned is float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _chunks(x, chunk: int):
  """[B, L, ...] (L a multiple of chunk) → [L / chunk, B, chunk, ...]."""
  b, l = x.shape[:2]
  return jnp.moveaxis(x.reshape((b, l // chunk, chunk) + x.shape[2:]), 1, 0)


def _unchunks(x):
  """Inverse of :func:`_chunks`."""
  n, b, c = x.shape[:3]
  return jnp.moveaxis(x, 0, 1).reshape((b, n * c) + x.shape[3:])


def _logits(h_BCD, head_DV):
  return jnp.einsum("bcd,dv->bcv", h_BCD, head_DV.astype(h_BCD.dtype),
                    preferred_element_type=jnp.float32)


def _stats(h_BCD, head_DV, y_BC):
  z = _logits(h_BCD, head_DV)
  lse = jax.nn.logsumexp(z, axis=-1)
  p = jnp.exp(z - lse[..., None])
  ent = lse - jnp.sum(p * z, axis=-1)
  z_y = _at_targets(z, y_BC)
  return z_y - lse, ent, lse


def _pad(h_BLD, y_BL, chunk: int):
  l = h_BLD.shape[1]
  pad = -l % chunk
  if pad:
    h_BLD = jnp.pad(h_BLD, ((0, 0), (0, pad), (0, 0)))
    y_BL = jnp.pad(y_BL, ((0, 0), (0, pad)))
  return h_BLD, y_BL


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _logp_entropy(h_BLD, head_DV, y_BL, chunk: int):
  return _forward(h_BLD, head_DV, y_BL, chunk)[0]


def _forward(h_BLD, head_DV, y_BL, chunk):
  def body(_, xs):
    return None, _stats(xs[0], head_DV, xs[1])

  _, (logp, ent, lse) = jax.lax.scan(body, None, (_chunks(h_BLD, chunk), _chunks(y_BL, chunk)))
  logp_BL, ent_BL, lse_BL = _unchunks(logp), _unchunks(ent), _unchunks(lse)
  return (logp_BL, ent_BL), (h_BLD, head_DV, y_BL, lse_BL)


def _bwd(chunk, res, cotangents):
  h_BLD, head_DV, y_BL, lse_BL = res
  g_BL, e_BL = (c.astype(jnp.float32) for c in cotangents)

  def body(dhead_DV, xs):
    h_BCD, y_BC, lse_BC, g_BC, e_BC = xs
    z = _logits(h_BCD, head_DV)
    p = jnp.exp(z - lse_BC[..., None])
    p = p / jnp.sum(p, axis=-1, keepdims=True)  # removes the saved lse's rounding (a common scale)
    # log p_v + H = z_v − Σ_u p_u z_u: centred logits (no lse cancellation).
    centred = z - jnp.sum(p * z, axis=-1, keepdims=True)
    onehot = jax.nn.one_hot(y_BC, z.shape[-1], dtype=jnp.float32)
    dz = g_BC[..., None] * (onehot - p) - e_BC[..., None] * p * centred
    dz = dz.astype(h_BCD.dtype)
    dh_BCD = jnp.einsum("bcv,dv->bcd", dz, head_DV.astype(h_BCD.dtype),
                        preferred_element_type=jnp.float32).astype(h_BCD.dtype)
    dhead_DV = dhead_DV + jnp.einsum("bcd,bcv->dv", h_BCD, dz, preferred_element_type=jnp.float32)
    return dhead_DV, dh_BCD

  xs = tuple(_chunks(a, chunk) for a in (h_BLD, y_BL, lse_BL, g_BL, e_BL))
  dhead_DV, dh = jax.lax.scan(body, jnp.zeros(head_DV.shape, jnp.float32), xs)
  return _unchunks(dh), dhead_DV.astype(head_DV.dtype), None


_logp_entropy.defvjp(_forward, _bwd)


def logp_entropy(h_BLD: jax.Array, head_DV: jax.Array, targets_BL: jax.Array,
                 chunk: int = 0) -> tuple[jax.Array, jax.Array]:
  """(log p(targets) [B, L], entropy [B, L]), float32, from hidden states and the head.

  ``chunk``: rows of the sequence axis per step (0 or ≥ L: one chunk); L need not
  be a multiple (the last chunk is padded, the padding dropped). Differentiable in
  ``h_BLD`` and ``head_DV`` (module docstring), not in the integer targets.
  """
  l = h_BLD.shape[1]
  chunk = l if chunk <= 0 else min(chunk, l)
  h_pad, y_pad = _pad(h_BLD, targets_BL.astype(jnp.int32), chunk)
  logp_BL, ent_BL = _logp_entropy(h_pad, head_DV, y_pad, chunk)
  return logp_BL[:, :l], ent_BL[:, :l]


def _at_targets(logp_BLV, targets_BL):
  return jnp.take_along_axis(logp_BLV, targets_BL[..., None], axis=-1)[..., 0]


def token_log_probs(logits_BLV: jax.Array, targets_BL: jax.Array) -> jax.Array:
  """log softmax(logits)[target] in float32, from full logits."""
  return _at_targets(jax.nn.log_softmax(logits_BLV.astype(jnp.float32), axis=-1), targets_BL)


def logp_entropy_reference(logits_BLV: jax.Array, targets_BL: jax.Array):
  """:func:`logp_entropy` from full logits by plain autodiff-able ops (tests, probes,
  reference paths): one log-softmax for both outputs."""
  logp = jax.nn.log_softmax(logits_BLV.astype(jnp.float32), axis=-1)
  return _at_targets(logp, targets_BL), -jnp.sum(jnp.exp(logp) * logp, axis=-1)
