"""The one table mapping logical axis names to mesh axes, and PartitionSpec helpers.

Parameters carry ``logical_axes`` metadata (see dllm_rl.models.transformer).
FSDP shards the model width ('embed') over 'fsdp'; tensor parallelism shards
heads, MLP width and vocabulary over 'tensor'. The batch is sharded over
('data', 'fsdp'). A dimension that a mesh axis does not divide is replicated
over that axis instead (e.g. 2 KV heads on a tensor axis of 4).

MoE expert weights ``[E, D, F]`` shard their expert axis over 'fsdp' (there is no
separate 'expert' mesh axis): a mesh axis is used once per array, so the expert
dimension takes 'fsdp' ahead of 'embed' and each device stores E/fsdp whole experts
(F split over 'tensor'). The dispatch runs per batch shard (dllm_rl.models.moe), so
this is expert-sharded storage with FSDP-style gathering, not all-to-all expert
parallelism.
"""

from __future__ import annotations

from typing import Sequence

from jax.sharding import Mesh, PartitionSpec

LOGICAL_RULES: dict[str, str | tuple[str, ...] | None] = {
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "norm": None,
    "expert": "fsdp",
    "lora_rank": None,  # LoRA adapters: the rank axis is replicated (dllm_rl.models.lora)
    "batch": ("data", "fsdp"),
    "length": None,
}

BATCH_AXES = ("data", "fsdp")


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
  """PartitionSpec for logical axis names; with ``shape`` and ``mesh``, dimensions the
  mapped mesh axes do not divide are replicated. A mesh axis is used at most once."""
  used: set[str] = set()
  out = []
  for i, name in enumerate(logical):
    if name is not None and name not in LOGICAL_RULES:
      raise KeyError(f"logical axis {name!r} has no sharding rule; known: {sorted(LOGICAL_RULES)}")
    axes = LOGICAL_RULES.get(name) if name is not None else None
    names = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    if any(a in used for a in names):
      axes, names = None, ()
    if names and shape is not None and mesh is not None and shape[i] % _axis_size(mesh, names):
      axes, names = None, ()
    used.update(names)
    out.append(axes)
  return PartitionSpec(*out)
