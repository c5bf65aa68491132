"""TPU multislice (dllm_rl.parallel.mesh, topology): on compile-only devices of 2 × v5p-8
(libtpu, no TPU), the mesh's ``data`` axis alone spans the slices — every other axis stays
within one slice's chips, in their ring order — a ``data`` that cannot span them is a named
error (``mesh_utils`` asserts on such devices, and the old fallback reshaped them, FSDP across
the slices), and the planner compiles a run's program for them."""

import dataclasses

import numpy as np
import pytest

from dllm_rl.parallel import mesh as mesh_lib
from dllm_rl.parallel import topology
from tests.test_plan import _config, needs_libtpu


@pytest.fixture(scope="module")
def two_slices():
  return topology.get_topology("v5p-8", slices=2)


def _slice_of(mesh):
  return np.vectorize(lambda d: d.slice_index)(mesh.devices)


@needs_libtpu
@pytest.mark.parametrize("sizes,shape", [
    ({"data": 2, "fsdp": -1, "tensor": 1}, (2, 4, 1, 1)),
    ({"data": -1, "fsdp": 2, "tensor": 1}, (4, 2, 1, 1)),
    ({"data": 4, "fsdp": 1, "expert": 1, "tensor": 2}, (4, 1, 1, 2)),
])
def test_the_data_axis_alone_spans_the_slices(two_slices, sizes, shape):
  assert two_slices.chips == 8 and two_slices.name == "2 × v5p-8"
  assert mesh_lib.slice_count(two_slices.devices) == 2
  mesh = mesh_lib.make_mesh(sizes, devices=two_slices.devices)
  assert mesh.devices.shape == shape
  slice_of = _slice_of(mesh)
  per_slice = shape[0] // 2
  for i in range(shape[0]):  # one slice per block of data rows; fsdp/expert/tensor inside it
    assert (slice_of[i] == i // per_slice).all(), slice_of
  from jax.experimental import mesh_utils
  ids = np.vectorize(lambda d: d.id)
  for s in range(2):  # within a slice, the chips' own ring order (a plain reshape is not)
    own = [d for d in two_slices.devices if d.slice_index == s]
    block = mesh.devices[s * per_slice:(s + 1) * per_slice]
    want = mesh_utils.create_device_mesh((per_slice, *shape[1:]), devices=own)
    assert (ids(block) == ids(want)).all(), (ids(block), ids(want))


@needs_libtpu
def test_a_data_axis_that_cannot_span_the_slices_is_named(two_slices):
  with pytest.raises(ValueError, match=r"mesh.data = 1: a job of 2 TPU slices needs mesh.data"
                                       r" to be a multiple of 2"):
    mesh_lib.make_mesh({"data": 1, "fsdp": -1, "tensor": 1}, devices=two_slices.devices)
  with pytest.raises(ValueError, match="unequal sizes"):
    mesh_lib.make_mesh({"data": 2, "fsdp": -1, "tensor": 1}, devices=two_slices.devices[:6])


@needs_libtpu
def test_a_shape_without_a_ring_order_falls_back_within_each_slice():
  """2 × v5p-32 (2x2x4 chips each): data 2 × fsdp 2 × expert 2 × tensor 4 has no ring order in
  a slice (``mesh_utils`` raises NotImplementedError, which the hybrid mesh let through): each
  slice then gets the grid one slice of its own devices gets, as a single slice falls back."""
  devices = topology.get_topology("v5p-32", slices=2).devices
  mesh = mesh_lib.make_mesh({"data": 2, "fsdp": 2, "expert": 2, "tensor": 4}, devices=devices)
  assert mesh.devices.shape == (2, 2, 2, 4)
  ids = np.vectorize(lambda d: d.id)
  for s in range(2):
    own = [d for d in devices if d.slice_index == s]
    alone = mesh_lib.make_mesh({"data": 1, "fsdp": 2, "expert": 2, "tensor": 4}, devices=own)
    assert (_slice_of(mesh)[s] == s).all()
    assert (ids(mesh.devices[s]) == ids(alone.devices[0])).all()


@dataclasses.dataclass(frozen=True)
class _Device:
  """What make_mesh and mesh_utils read of a device."""
  id: int
  platform: str
  slice_index: int
  device_kind: str = "NVIDIA H100 80GB HBM3"


def test_gpu_hosts_are_not_slices():
  """XLA gives GPU (and CPU) devices a ``slice_index`` per host: a job of two GPU nodes is not
  a multislice one, and its mesh is the config's (``data = 1``, FSDP over every GPU), not a
  'TPU slices' error."""
  import jax
  nodes = [_Device(i, "gpu", i // 4) for i in range(8)]
  assert mesh_lib.slice_count(nodes) == 1 and mesh_lib.slice_count(jax.devices()) == 1
  mesh = mesh_lib.make_mesh({"data": 1, "fsdp": -1, "tensor": 1}, devices=nodes)
  assert mesh.devices.shape == (1, 8, 1, 1)
  assert [d.id for d in mesh.devices.flat] == list(range(8))
  assert mesh_lib.slice_count([_Device(i, "tpu", i // 4) for i in range(8)]) == 2


def test_one_slice_is_unchanged():
  import jax
  assert mesh_lib.slice_count(jax.devices()) == 1
  mesh = mesh_lib.make_mesh({"data": 1, "fsdp": -1, "tensor": 1})
  assert mesh.devices.shape == (1, len(jax.devices()), 1, 1)


def test_multislice_is_a_tpu_topology_s():
  for name in ("cpu:2", "h100-8"):
    with pytest.raises(ValueError, match="multislice is a TPU topology's"):
      topology.get_topology(name, slices=2)
  with pytest.raises(ValueError, match="slices >= 1"):
    topology.get_topology("v5p-8", slices=0)
  with pytest.raises(ValueError, match=f"at most {topology.MAX_SLICES} .MAX_SLICES."):
    topology.get_topology("v5p-8", slices=topology.MAX_SLICES + 1)  # before libtpu is asked


@needs_libtpu
@pytest.mark.slow  # one TPU compile (~5 s on the 2-core CPU)
def test_the_planner_compiles_a_run_for_two_slices(two_slices):
  """The tiny config's SFT step compiles for 2 × v5p-8 (data 2 × fsdp 4)."""
  from dllm_rl.planning import planner
  config = _config()
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, -1, 1
  out, problems = planner.plan(config, two_slices, ["sft_step"])
  assert not problems and out["chips"] == 8 and out["topology"] == "2 × v5p-8"
  assert out["programs"]["sft_step"]["peak_bytes_per_device"] > 0
