"""Activation sharding constraints usable from model code (no model imports here)."""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec

from dllm_rl.parallel.rules import BATCH_AXES


def constrain_activations(x_BND: jax.Array) -> jax.Array:
  """Pin [B, N, D] activations to batch sharding at block boundaries when a mesh
  with the framework's axes is active (``jax.set_mesh``); a no-op otherwise."""
  get = getattr(jax.sharding, "get_abstract_mesh", None)
  mesh = get() if get is not None else None
  if mesh is None or not set(BATCH_AXES) <= set(getattr(mesh, "axis_names", ()) or ()):
    return x_BND
  size = mesh.shape["data"] * mesh.shape["fsdp"]
  if x_BND.shape[0] % size:
    return x_BND
  return jax.lax.with_sharding_constraint(x_BND, PartitionSpec(BATCH_AXES, None, None))


def under_mesh(fn, mesh):
  """Wrap ``fn`` so that it traces under ``mesh``'s abstract mesh (activating
  :func:`constrain_activations`); identity when ``mesh`` is None."""
  if mesh is None:
    return fn

  def wrapped(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return fn(*args, **kwargs)

  return wrapped


def jit_sharded(fn, mesh, *, out_shardings=None, donate_argnums=()):
  """``jax.jit`` with explicit output shardings on a mesh (inputs keep the
  shardings they were placed with); plain jit when ``mesh`` is None."""
  if mesh is None:
    return jax.jit(fn, donate_argnums=donate_argnums)
  return jax.jit(under_mesh(fn, mesh), out_shardings=out_shardings, donate_argnums=donate_argnums)
