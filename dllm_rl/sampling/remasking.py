"""Remasking (confidence) policies, registered by name.

Each policy maps (float32 logits_BLV, proposed tokens x0_BL, key) to a float32
confidence_BL; the sampler commits the most confident masked positions of the
current block. Higher = commit earlier.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dllm_rl.parallel.topk import top_k
from dllm_rl.registry import Registry

REMASKING: Registry = Registry("remasking policy", key="sampler.remasking")


def confidence(name: str, logits_BLV, x0_BL, key):
  """The registered policy ``name``'s (``sampler.remasking``) confidence_BL, checked to be
  float32 of ``x0_BL``'s shape when traced: a policy that returns one row per position ([L])
  or per sequence ([B]) would otherwise be broadcast over the batch silently, or fail as a
  broadcasting error that names no policy; integer confidences (a rounded score) tie where
  the scores differed and are compared with the float ``sampler.threshold`` as they are."""
  conf_BL = REMASKING.get(name)(logits_BLV, x0_BL, key)
  if jnp.shape(conf_BL) != jnp.shape(x0_BL) or jnp.result_type(conf_BL) != jnp.float32:
    raise TypeError(f"sampler.remasking={name!r} (registered in REMASKING,"
                    f" dllm_rl/sampling/remasking.py) returned {jnp.result_type(conf_BL)} of"
                    f" shape {jnp.shape(conf_BL)}; a policy returns one float32 confidence per"
                    f" position, x0_BL's shape {jnp.shape(x0_BL)}")
  return conf_BL


@REMASKING.register("low_confidence")
def low_confidence(logits_BLV, x0_BL, key):
  """LLaDA: probability of the proposed token under softmax(logits)."""
  del key
  probs = jax.nn.softmax(logits_BLV, axis=-1)
  return jnp.take_along_axis(probs, x0_BL[..., None], axis=-1)[..., 0]


@REMASKING.register("random")
def random(logits_BLV, x0_BL, key):
  """LLaDA 'random' remasking: uniform confidences."""
  del logits_BLV
  return jax.random.uniform(key, x0_BL.shape, jnp.float32)


@REMASKING.register("margin")
def margin(logits_BLV, x0_BL, key):
  """Top-1 minus top-2 probability (margin-based unmasking)."""
  del x0_BL, key
  top2 = top_k(jax.nn.softmax(logits_BLV, axis=-1), 2)[0]  # partitioned under vmap
  return top2[..., 0] - top2[..., 1]


@REMASKING.register("entropy")
def entropy(logits_BLV, x0_BL, key):
  """Negative entropy of the predictive distribution (low entropy = confident)."""
  del x0_BL, key
  probs = jax.nn.softmax(logits_BLV, axis=-1)
  return -jnp.sum(jax.scipy.special.entr(probs), axis=-1)  # entr(0) = 0: -inf logits are safe
