"""Forward process of masked diffusion (LLaDA / MDLM), independent of the model.

Each eligible completion token is replaced by the mask id independently with
probability t; prompts and ineligible (padding) positions are never masked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sample_t(key: jax.Array, batch: int, eps: float) -> jax.Array:
  """Masking rates t ~ U(eps, 1] per sequence (LLaDA: (1 − eps)·u + eps), float32 [B]."""
  u = jax.random.uniform(key, (batch,), jnp.float32)
  return (1.0 - eps) * u + eps


def forward_mask(key: jax.Array, tokens_BL: jax.Array, eligible_BL: jax.Array,
                 t_B: jax.Array, mask_id: int):
  """Mask each eligible token with probability t_B[b].

  Returns (noisy_BL, masked_BL): the noised tokens and where masks were placed
  (always a subset of ``eligible_BL``).
  """
  u = jax.random.uniform(key, tokens_BL.shape, jnp.float32)
  masked_BL = (u < t_B[:, None]) & eligible_BL
  return jnp.where(masked_BL, mask_id, tokens_BL), masked_BL
