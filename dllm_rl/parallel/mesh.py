"""Device mesh from config: axes ('data', 'fsdp', 'expert', 'tensor'), sizes may be -1 (fill).

TPU multislice (devices of several slices, each with its ``slice_index``): the slices talk over
the data-center network (DCN), far slower than the chips' own links (ICI), so the ``data`` axis
alone spans them — each slice holds ``data / slices`` of it and the whole of ``fsdp``,
``expert`` and ``tensor``, whose all-gathers and all-to-alls run every layer — and only the
gradient all-reduce crosses DCN (``mesh_utils.create_hybrid_device_mesh``). ``data`` must then be
a multiple of the slice count: a ValueError says so (``mesh.data = 1`` with ``fsdp = -1``, the
8B configs' layout, would shard every weight over DCN)."""

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
  slices = slice_count(devices)
  if (-1 not in sizes and 0 < math.prod(sizes) < len(devices) and jax.process_count() == 1
      and slices == 1):
    devices = devices[:math.prod(sizes)]
  shape = resolve_shape(sizes, len(devices))
  if slices > 1:
    return Mesh(_multislice_grid(shape, devices, slices), AXES)
  try:
    from jax.experimental import mesh_utils
    grid = mesh_utils.create_device_mesh(shape, devices=devices)
  except (ValueError, NotImplementedError, AssertionError):
    grid = np.asarray(devices).reshape(shape)
  return Mesh(grid, AXES)


def slice_count(devices: Sequence[jax.Device]) -> int:
  """How many TPU slices ``devices`` come from (1 unless a multislice job's)."""
  return len({getattr(d, "slice_index", 0) for d in devices})


def _multislice_grid(shape: tuple[int, ...], devices, slices: int) -> np.ndarray:
  """``data`` split into ``slices`` × ``data / slices`` (DCN × ICI), every other axis within a
  slice (module docstring)."""
  data = shape[0]
  if data % slices:
    raise ValueError(f"mesh.data = {data}: a job of {slices} TPU slices needs mesh.data to be a"
                     f" multiple of {slices} (the data axis alone spans the slices, over the"
                     f" data-center network; fsdp, expert and tensor stay within a slice), e.g."
                     f" mesh.data = {slices} with mesh.fsdp = -1")
  per_slice = len(devices) // slices
  if any(sum(getattr(d, "slice_index", 0) == s for d in devices) != per_slice
         for s in {getattr(d, "slice_index", 0) for d in devices}):
    raise ValueError(f"{len(devices)} devices over {slices} slices of unequal sizes")
  from jax.experimental import mesh_utils
  return mesh_utils.create_hybrid_device_mesh((data // slices, *shape[1:]),
                                              (slices, 1, 1, 1), devices=devices)
