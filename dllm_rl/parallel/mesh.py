"""Device mesh from config: axes ('data', 'fsdp', 'expert', 'tensor'), sizes may be -1 (fill).

TPU multislice (TPU devices of several slices, each with its ``slice_index``): the slices talk
over the data-center network (DCN), far slower than the chips' own links (ICI), so the ``data``
axis alone spans them — each slice holds ``data / slices`` of it and the whole of ``fsdp``,
``expert`` and ``tensor``, whose all-gathers and all-to-alls run every layer — and only the
gradient all-reduce crosses DCN (the layout of ``mesh_utils.create_hybrid_device_mesh``).
``data`` must then be a multiple of the slice count: a ValueError says so (``mesh.data = 1``
with ``fsdp = -1``, the 8B configs' layout, would shard every weight over DCN). GPU and CPU
devices' ``slice_index`` (one per host) is no slice: see :func:`slice_count`."""

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
  return Mesh(_slice_grid(shape, devices), AXES)


def slice_count(devices: Sequence[jax.Device]) -> int:
  """How many TPU slices ``devices`` come from (1 unless a multislice job's).

  Only TPU devices count: XLA's GPU and CPU clients give every device a ``slice_index`` too,
  one per host (its boot id), so a job of several GPU nodes is not a multislice one (its mesh
  stays the one the config asks for, e.g. FSDP over every GPU of the job)."""
  return len({d.slice_index for d in devices
              if getattr(d, "platform", None) == "tpu" and hasattr(d, "slice_index")} or {0})


def _slice_grid(shape: tuple[int, ...], devices) -> np.ndarray:
  """``devices`` (one slice's, or one process's) as an array of ``shape``: in the chips' ring
  order where ``mesh_utils`` finds one for ``shape``, else in the given order."""
  try:
    from jax.experimental import mesh_utils
    return mesh_utils.create_device_mesh(shape, devices=devices)
  except (ValueError, NotImplementedError, AssertionError):
    return np.asarray(devices).reshape(shape)


def _multislice_grid(shape: tuple[int, ...], devices, slices: int) -> np.ndarray:
  """``data`` split into ``slices`` × ``data / slices`` (DCN × ICI), every other axis within a
  slice (module docstring): each slice's grid (:func:`_slice_grid`) stacked along ``data`` in
  slice order, as ``mesh_utils.create_hybrid_device_mesh`` with DCN shape (slices, 1, 1, 1)
  builds it, but with the same fallback as one slice where no ring order fits the shape."""
  data = shape[0]
  if data % slices:
    raise ValueError(f"mesh.data = {data}: a job of {slices} TPU slices needs mesh.data to be a"
                     f" multiple of {slices} (the data axis alone spans the slices, over the"
                     f" data-center network; fsdp, expert and tensor stay within a slice), e.g."
                     f" mesh.data = {slices} with mesh.fsdp = -1")
  by_slice: dict[int, list] = {}
  for d in devices:
    by_slice.setdefault(d.slice_index, []).append(d)
  if len({len(own) for own in by_slice.values()}) > 1:
    raise ValueError(f"{len(devices)} devices over {slices} slices of unequal sizes")
  per_slice = (data // slices, *shape[1:])
  return np.concatenate([_slice_grid(per_slice, by_slice[s]) for s in sorted(by_slice)])
