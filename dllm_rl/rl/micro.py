"""Micro-batched likelihoods and exact gradient accumulation (``rl.micro_batch``).

An RL loss is a function of the estimators' per-draw log-probabilities
``logp_KBL`` (K draws × B·G sequences × L positions, dllm_rl.diffusion.estimators:
every estimator is draw → forward per draw → reduce). By the chain rule

    ∇_θ L = Σ_{k, b, i} (∂L/∂logp_kbi) ∇_θ logp_kbi(θ),

so the gradient is assembled from three passes, none of which holds more than
one micro-batch of activations:

1. a no-grad pass: ``logp_KBL`` for every draw and sequence, ``micro_batch``
   sequences and one draw per forward (the loss's weights — StableDRL's
   self-normalised ρ̂, the SPG EUBO's softmax over draws, GRPO's clip decisions,
   all stop-gradient or functions of ``logp_KBL`` — are fixed by it);
2. the loss and its cotangent ḡ = ∂L/∂logp_KBL, on [K, B·G, L] float32 arrays;
3. one backward pass per (micro-batch, draw) of Σ sg(ḡ) · logp(θ), the
   parameter gradients summed in float32.

The noise (``estimator.draw``) is drawn once for the whole batch, so the estimate,
the loss and the gradient equal the full-batch ones up to float rounding (tests:
``tests/rl/test_micro_batch.py``). The price is one extra forward per update.

Micro-batch j holds rows j, j + n, j + 2n, … (n micro-batches): with the batch
axis sharded in contiguous blocks over the data/fsdp devices, every micro-batch
keeps the same number of rows on every device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dllm_rl.diffusion.estimators import Estimator, score_draws


def split_rows(x, n: int):
  """[R, ...] → [n, R / n, ...]; micro-batch j holds rows j, j + n, j + 2n, …"""
  r = x.shape[0]
  if r % n:
    raise ValueError(f"{r} rows do not split into {n} micro-batches")
  return jnp.swapaxes(x.reshape((r // n, n) + x.shape[1:]), 0, 1)


def merge_rows(x):
  """Inverse of :func:`split_rows`: [n, m, ...] → [n·m, ...]."""
  n, m = x.shape[:2]
  return jnp.swapaxes(x, 0, 1).reshape((n * m,) + x.shape[2:])


def _split_draws(draws, n: int):
  """Draw arrays (a pytree of them) [K, R, ...] → [n, K, R / n, ...]."""
  return jax.tree.map(lambda a: jnp.moveaxis(split_rows(jnp.moveaxis(a, 1, 0), n), 2, 1), draws)


def _merge_draws(x_nKm):
  """[n, K, m, ...] → [K, n·m, ...]."""
  return jax.vmap(merge_rows, in_axes=1)(x_nKm)


def score_micro(estimator: Estimator, make_scorer, params, seqs, draws, cfg, n: int):
  """(logp_KBL, entropy_KBL) of every draw, ``n`` micro-batches of rows, one draw
  per forward; no gradient flows to ``params``."""
  params = jax.lax.stop_gradient(params)
  scorer = make_scorer(params)

  def one(xs):
    return score_draws(estimator, scorer, xs[0], xs[1], cfg)

  seqs_n = jax.tree.map(lambda a: split_rows(a, n), seqs)
  out = jax.lax.map(one, (seqs_n, _split_draws(draws, n)))
  return jax.tree.map(_merge_draws, out)


def accumulate_grads(estimator: Estimator, make_scorer, params, seqs, draws, cot_KBL, cfg,
                     n: int):
  """Σ over micro-batches and draws of ∇_θ Σ cot · logp(θ): the loss gradient given
  its cotangent ``cot_KBL`` = ∂L/∂logp_KBL (module docstring), float32 sums."""
  seqs_n = jax.tree.map(lambda a: split_rows(a, n), seqs)
  draws_n = _split_draws(draws, n)
  cot_nKm = _split_draws(cot_KBL, n)

  def draw_grad(p, seqs_m, draw_m, cot_mL):
    logp_mL, _ = estimator.forward(make_scorer(p), seqs_m, draw_m, cfg)
    return jnp.sum(jax.lax.stop_gradient(cot_mL) * logp_mL)

  def per_micro_batch(acc, xs):
    seqs_m, draws_Km, cot_KmL = xs

    def per_draw(acc, ys):
      g = jax.grad(draw_grad)(params, seqs_m, *ys)
      return jax.tree.map(lambda a, b: a + b.astype(jnp.float32), acc, g), None

    acc, _ = jax.lax.scan(per_draw, acc, (draws_Km, cot_KmL))
    return acc, None

  zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, jnp.float32), params)
  grads, _ = jax.lax.scan(per_micro_batch, zeros, (seqs_n, draws_n, cot_nKm))
  return jax.tree.map(lambda gr, p: gr.astype(p.dtype), grads, params)
