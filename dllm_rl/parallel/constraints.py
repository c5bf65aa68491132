"""Activation sharding constraints usable from model code (no model imports here), and
the mesh axes a per-shard kernel (``shard_map``) runs over."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
from jax.sharding import PartitionSpec

from dllm_rl.parallel.rules import batch_axes, batch_size_divisor


def _framework_mesh():
  """The abstract mesh being traced under if it has the framework's batch axes, else None."""
  get = getattr(jax.sharding, "get_abstract_mesh", None)
  mesh = get() if get is not None else None
  names = set(getattr(mesh, "axis_names", ()) or ())
  if mesh is None or not names or not {"data", "fsdp"} <= names:
    return None
  return mesh


def constrain_activations(x_BND: jax.Array) -> jax.Array:
  """Pin [B, N, D] activations to batch sharding at block boundaries when a mesh
  with the framework's axes is active (``jax.set_mesh``); a no-op otherwise."""
  mesh = _framework_mesh()
  if mesh is None or x_BND.shape[0] % batch_size_divisor(mesh):
    return x_BND
  return jax.lax.with_sharding_constraint(x_BND, PartitionSpec(batch_axes(mesh), None, None))


class ShardAxes(NamedTuple):
  """Where a per-shard kernel runs (see :func:`shard_axes`)."""

  mesh: object                    # the abstract mesh
  batch: tuple[str, ...] | None   # batch axes, None when the batch does not divide them
  tensor: str | None              # 'tensor' when > 1 and it divides every given width
  expert: str | None              # 'expert' when the mesh has it with size > 1


def shard_axes(b: int, tensor_widths: Sequence[int] = ()) -> ShardAxes | None:
  """The axes to run a per-shard kernel over, for a batch of ``b`` rows and widths that
  the 'tensor' axis must divide; None without a framework mesh of more than one device."""
  mesh = _framework_mesh()
  if mesh is None or mesh.size == 1:
    return None
  shape = dict(mesh.shape)
  batch = batch_axes(mesh) if b % batch_size_divisor(mesh) == 0 else None
  t = shape.get("tensor", 1)
  tensor = "tensor" if t > 1 and all(w % t == 0 for w in tensor_widths) else None
  expert = "expert" if shape.get("expert", 1) > 1 else None
  return ShardAxes(mesh, batch, tensor, expert)


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
