"""The one table mapping logical axis names to mesh axes, and PartitionSpec helpers.

Parameters carry ``logical_axes`` metadata (see dllm_rl.models.transformer).
FSDP shards the model width ('embed') over 'fsdp'; tensor parallelism shards
heads, MLP width and vocabulary over 'tensor'. The batch is sharded over
('data', 'fsdp', 'expert'). A dimension that a mesh axis does not divide is
replicated over that axis instead (e.g. 2 KV heads on a tensor axis of 4).

Expert parallelism follows MaxText's design (its ``expert`` mesh axis): the
'expert' mesh axis is one more batch axis for every layer (each device holds its
own tokens, as with data/fsdp) and one more FSDP axis for the non-expert weights
('embed' over ('fsdp', 'expert')), while the MoE expert weights ``[E, D, F]`` split
their expert dimension over ('expert', 'fsdp'): each group of 'expert' devices owns
E/expert experts that never leave it, stored FSDP-style over 'fsdp' inside the group
(E/(expert·fsdp) experts per device, gathered over 'fsdp' only, like any FSDP weight).
Tokens travel to their experts by an all-to-all over 'expert'
(dllm_rl.models.moe_ep). With ``mesh.expert = 1`` (the default) the axis is left out
of every spec (:data:`OPTIONAL_AXES`): the layout is exactly that of a mesh without
it, experts split over 'fsdp' and gathered for a per-batch-shard dispatch.
"""

from __future__ import annotations

from typing import Sequence

from jax.sharding import Mesh, PartitionSpec

LOGICAL_RULES: dict[str, str | tuple[str, ...] | None] = {
    "vocab": "tensor",
    "embed": ("fsdp", "expert"),
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
    "expert": ("expert", "fsdp"),
    # LoRA adapters (dllm_rl.models.lora): A [in, r] and B [r, out] carry their base weight's
    # axes; the rank axis takes 'fsdp' where those left it unused (e.g. the MLP's A [mlp, r]
    # on an FSDP-only mesh), so no adapter is whole on every device. Assigned last (_LAST).
    "lora_rank": ("fsdp", "expert"),
    "batch": ("data", "fsdp", "expert"),
    "length": None,
}

BATCH_AXES = ("data", "fsdp", "expert")

# Logical axes that get their mesh axes after every other dimension of the array has taken
# its own (a fallback, never a competitor of the base weight's layout).
_LAST = ("lora_rank",)

# Mesh axes a spec leaves out where the mesh lacks them or has them of size 1, so that
# configs without expert parallelism keep the specs they had before the axis existed.
OPTIONAL_AXES = ("expert",)


def present_axes(mesh, axes: Sequence[str]) -> tuple[str, ...]:
  """``axes`` without the optional ones ``mesh`` (concrete or abstract) lacks or has of
  size 1."""
  shape = dict(mesh.shape)
  return tuple(a for a in axes if a not in OPTIONAL_AXES or shape.get(a, 1) > 1)


def batch_axes(mesh) -> tuple[str, ...]:
  """The mesh axes the batch dimension is sharded over on ``mesh``."""
  return present_axes(mesh, BATCH_AXES)


def batch_size_divisor(mesh) -> int:
  """The product of the batch axes' sizes: global batches must be multiples of it."""
  size = 1
  for a in batch_axes(mesh):
    size *= dict(mesh.shape)[a]
  return size


def _axis_size(mesh: Mesh, axes) -> int:
  if axes is None:
    return 1
  axes = (axes,) if isinstance(axes, str) else axes
  size = 1
  for a in axes:
    size *= mesh.shape[a]
  return size


def logical_to_spec(logical: Sequence[str | None], shape: Sequence[int] | None = None,
                    mesh: Mesh | None = None) -> PartitionSpec:
  """PartitionSpec for logical axis names; with ``shape`` and ``mesh``, a dimension is
  sharded over the longest prefix of its mapped mesh axes that divides it (replicated
  if none does). A mesh axis is used at most once (by the first dimension naming it; the
  fallback axes of :data:`_LAST` come after the others).
  Optional mesh axes (:data:`OPTIONAL_AXES`) are left out unless ``mesh`` has them with
  size > 1; a single remaining axis is written as its name."""
  used: set[str] = set()
  out: list = [None] * len(logical)
  for i in sorted(range(len(logical)), key=lambda i: logical[i] in _LAST):
    name = logical[i]
    if name is not None and name not in LOGICAL_RULES:
      raise KeyError(f"logical axis {name!r} has no sharding rule; known: {sorted(LOGICAL_RULES)}")
    axes = LOGICAL_RULES.get(name) if name is not None else None
    names = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    names = tuple(a for a in names if a not in OPTIONAL_AXES) if mesh is None else \
        present_axes(mesh, names)
    names = tuple(a for a in names if a not in used)
    if shape is not None and mesh is not None:
      while names and shape[i] % _axis_size(mesh, names):
        names = names[:-1]  # the longest prefix of the mapped axes that divides the dimension
    used.update(names)
    out[i] = None if not names else names[0] if len(names) == 1 else names
  return PartitionSpec(*out)
