"""Device mesh from config: axes ('data', 'fsdp', 'expert', 'tensor'), sizes may be -1 (fill)."""

from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

AXES = ("data", "fsdp", "expert", "tensor")


def resolve_shape(sizes: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Replace at most one -1 by what fills ``num_devices``; the product must match."""
  sizes = [int(s) for s in sizes]
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"sizes must be positive or -1 (fill), got {dict(zip(AXES, sizes))}")
  if sizes.count(-1) > 1:
    raise ValueError(f"at most one axis may be -1, got {dict(zip(AXES, sizes))}")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f"{dict(zip(AXES, sizes))} cannot fill {num_devices} devices (the"
                       f" other axes' product, {known}, does not divide it)")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(f"{dict(zip(AXES, sizes))} needs {math.prod(sizes)} devices,"
                     f" {num_devices} are available")
  return tuple(sizes)


def make_mesh(mesh_cfg, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A Mesh over ``devices`` (default: all global devices) with axes data × fsdp × expert ×
  tensor; ``expert`` may be left out of ``mesh_cfg`` (size 1).

  A fully specified shape smaller than the device count uses the first devices
  (single process only: debugging and tests)."""
  devices = list(jax.devices() if devices is None else devices)
  sizes = (mesh_cfg["data"], mesh_cfg["fsdp"], mesh_cfg.get("expert", 1), mesh_cfg["tensor"])
  if -1 not in sizes and 0 < math.prod(sizes) < len(devices) and jax.process_count() == 1:
    devices = devices[:math.prod(sizes)]
  shape = resolve_shape(sizes, len(devices))
  try:
    from jax.experimental import mesh_utils
    grid = mesh_utils.create_device_mesh(shape, devices=devices)
  except (ValueError, NotImplementedError, AssertionError):
    grid = np.asarray(devices).reshape(shape)
  return Mesh(grid, AXES)
