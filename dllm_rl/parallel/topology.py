"""Device topologies the planner compiles for, without the hardware.

* ``v4-N`` / ``v5p-N`` (N TensorCores, 2 per chip: ``v5p-64`` is 32 chips, ``v5p:2x4x4``),
  ``v5e-N`` / ``v6e-N`` (N chips), or an explicit ``v5p:2x4x4``: compile-only TPU devices
  from ``jax.experimental.topologies`` (needs libtpu: ``pip install "dllm-rl[tpu]"``, in a
  checkout ``pip install -r requirements-tpu.txt``; no TPU is touched).
* ``h100-N`` / ``h200-N`` (N GPUs, 8 per host: ``h100-16`` is 2 hosts): compile-only CUDA
  devices from JAX's CUDA plugin and a GPU target config (dllm_rl.parallel.gpu_target),
  compiled by the real XLA GPU compiler (needs ``pip install "jax[cuda12]==<this jax>"`` and
  ``JAX_PLATFORMS=cpu``, which ``python -m dllm_rl.plan`` sets; no GPU is touched).
* TPU multislice: ``slices`` > 1 copies of a TPU slice joined over the data-center network
  (``python -m dllm_rl.plan --topology=v5p-64 --slices=2``; ``jax.experimental.topologies``'
  ``num_slices``): each device carries its ``slice_index``, and the run's mesh spans the slices
  with its ``data`` axis (dllm_rl.parallel.mesh).
* ``cpu:N``: N simulated CPU devices (``--xla_force_host_platform_device_count``, set
  before JAX starts). The CPU compiler's buffer assignment stands in for a GPU's, so a
  ``cpu:N`` plan is an *estimate*, against ``device_memory_gib`` per device: prefer
  ``h100-N`` where the CUDA plugin installs.

Chip figures are the public specifications (HBM per chip, peak dense bf16 FLOP/s).
"""

from __future__ import annotations

import dataclasses
import math
import re

from dllm_rl.parallel import gpu_target

GIB = 1024 ** 3

# generation → (HBM bytes per chip, peak bf16 FLOP/s per chip, torus rank)
TPU_CHIPS = {
    "v4": (32 * GIB, 275e12, 3),
    "v5e": (16 * GIB, 197e12, 2),
    "v5p": (95 * GIB, 459e12, 3),
    "v6e": (32 * GIB, 918e12, 2),
}
_CORES_PER_CHIP = {"v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}  # what N counts in "v5p-N"
# cpu:N stands in for N GPUs of this size (an 80 GB H100; override on the command line).
CPU_DEFAULT_MEMORY_GIB = 80.0
CPU_DEFAULT_PEAK_TFLOPS = 989.0
GPUS_PER_HOST = 8  # h100-N with N > 8: N / 8 hosts of 8 (an HGX / DGX node)
# The most TPU slices of a multislice run (python -m dllm_rl.plan --slices, launch/tpu_pod.sh
# --slices, which keeps the same number): about 5x the largest multislice job made public (199
# v5e-256 slices, 50,944 chips, in 2023). A mistyped count (--slices 100000000) would otherwise
# build one device, or one slice name and gcloud session, per slice before anything failed.
MAX_SLICES = 1024


@dataclasses.dataclass(frozen=True)
class Topology:
  name: str
  devices: tuple
  hbm_bytes_per_device: int
  peak_flops_per_device: float
  estimate: bool  # True for cpu:N (not the target hardware's compiler)
  chips: int


def torus_shape(chips: int, rank: int) -> tuple[int, ...]:
  """The slice shape of ``chips`` chips (a power of 2), e.g. 32, rank 3 → (2, 4, 4);
  4, rank 3 → (2, 2, 1); 32, rank 2 → (4, 8)."""
  if chips < 1 or chips & (chips - 1):
    raise ValueError(f"{chips} chips: TPU slices have a power-of-2 number of chips")
  dims = [1] * rank
  while math.prod(dims) < chips:
    dims[dims.index(min(dims))] *= 2
  grown = sorted(d for d in dims if d > 1)
  return tuple(grown + [1] * (rank - len(grown)))


# The --topology names python -m dllm_rl.plan takes (its flag's help and its errors).
FORMS = "v4-N, v5e-N (or v5litepod-N), v5p-N, v6e-N, GEN:AxBxC, h100-N, h200-N or cpu:N"


def tpu_topology_name(name: str) -> tuple[str, str]:
  """(generation, libtpu topology name) for ``v5p-64`` or ``v5p:2x4x4``; ``v5litepod-N``
  (gcloud's accelerator type for v5e, what ``launch/tpu_pod.sh --accelerator-type`` takes)
  is ``v5e-N``."""
  m = re.fullmatch(r"(v4|v5e|v5p|v6e|v5litepod)([-:])([0-9x]+)", name)
  if not m:
    raise ValueError(f"topology {name!r}: expected {FORMS}")
  gen, sep, rest = m.groups()
  gen = "v5e" if gen == "v5litepod" else gen
  if sep == ":":
    return gen, f"{gen}:{rest}"
  cores = int(rest)
  per = _CORES_PER_CHIP[gen]
  if cores % per:
    raise ValueError(f"topology {name!r}: {gen}-N counts TensorCores, {per} per chip")
  try:
    shape = torus_shape(cores // per, TPU_CHIPS[gen][2])
  except ValueError as err:  # name what was asked for, not only the chip count
    raise ValueError(f"topology {name!r}: {err}") from None
  return gen, f"{gen}:{'x'.join(map(str, shape))}"


def cpu_device_count(name: str) -> int | None:
  """N for ``cpu:N``, else None (read before JAX starts, to simulate N devices)."""
  m = re.fullmatch(r"cpu:([0-9]+)", name)
  return int(m.group(1)) if m else None


def gpu_topology_name(name: str) -> tuple[str, str] | None:
  """(GPU, CUDA topology "<slices>x<hosts>x<GPUs per host>") for ``h100-N`` / ``h200-N``
  (N GPUs, ``GPUS_PER_HOST`` per host), else None: h100-8 → ("h100", "1x1x8"), h100-2 →
  ("h100", "1x1x2"), h200-16 → ("h200", "1x2x8")."""
  m = re.fullmatch(f"({'|'.join(gpu_target.GPUS)})-([0-9]+)", name)
  if not m:
    return None
  gpu, n = m.group(1), int(m.group(2))
  if n < 1 or (n > GPUS_PER_HOST and n % GPUS_PER_HOST):
    raise ValueError(f"topology {name!r}: {gpu}-N needs N from 1 to {GPUS_PER_HOST} (one "
                     f"host) or a multiple of {GPUS_PER_HOST} (hosts of {GPUS_PER_HOST})")
  per_host = min(n, GPUS_PER_HOST)
  return gpu, f"1x{n // per_host}x{per_host}"


def _gpu_topology(name: str, gpu: str, cuda_name: str, memory_gib, peak_tflops) -> Topology:
  """Compile-only CUDA devices of ``gpu`` laid out as ``cuda_name`` (gpu_topology_name)."""
  import jax

  error = gpu_target.setup_error(jax.config.jax_platforms, gpu_target.plugin_found(),
                                 jax.__version__)
  if error:
    raise ValueError(f"--topology={name}: {error}")
  try:
    devices = gpu_target.cuda_topology_desc(gpu, cuda_name).devices
  except (RuntimeError, ValueError, NotImplementedError) as err:
    raise ValueError(f"--topology={name} ({cuda_name}): the CUDA plugin could not describe "
                     f"it ({err}); JAX_PLATFORMS=cpu must be set before JAX starts (before "
                     "its first backend)") from err
  facts = gpu_target.GPUS[gpu]
  return Topology(name, tuple(devices),
                  int(memory_gib * GIB) if memory_gib else facts["memory_bytes"],
                  peak_tflops * 1e12 if peak_tflops else facts["peak_bf16_flops"],
                  estimate=False, chips=len(devices))


def compile_on_cpu(force: bool) -> None:
  """JAX_PLATFORMS=cpu unless it is set and not ``force``, for a process that compiles for
  devices it does not have (the planner): compile-only TPU devices need no TPU backend, and
  JAX's CUDA plugin (``force``: a GPU topology) registers its compile-only topology only when
  CUDA is not asked for (else it looks for a GPU). Call it before JAX starts a backend; JAX
  may be imported already (the config's checks), so its config is set too."""
  import os
  import sys
  if force or "JAX_PLATFORMS" not in os.environ:
    os.environ["JAX_PLATFORMS"] = "cpu"
    if "jax" in sys.modules:
      sys.modules["jax"].config.update("jax_platforms", "cpu")


def get_topology(name: str, *, device_memory_gib: float | None = None,
                 peak_tflops: float | None = None, slices: int = 1) -> Topology:
  """Compile-only devices and per-device budgets for a topology name (``slices`` of it:
  TPU only)."""
  import jax

  if slices < 1 or (slices > 1 and (cpu_device_count(name) is not None
                                    or gpu_topology_name(name) is not None)):
    raise ValueError(f"{slices} slices of {name!r}: multislice is a TPU topology's (slices >= 1)")
  if slices > MAX_SLICES:
    raise ValueError(f"{slices} slices of {name!r}: at most {MAX_SLICES} (MAX_SLICES)")

  n = cpu_device_count(name)
  if n is not None:
    devices = jax.devices("cpu")
    if len(devices) < n:
      raise ValueError(f"topology {name!r}: only {len(devices)} CPU devices exist; start the "
                       f"process with XLA_FLAGS=--xla_force_host_platform_device_count={n}")
    return Topology(name, tuple(devices[:n]),
                    int((device_memory_gib or CPU_DEFAULT_MEMORY_GIB) * GIB),
                    (peak_tflops or CPU_DEFAULT_PEAK_TFLOPS) * 1e12, estimate=True, chips=n)
  gpu = gpu_topology_name(name)
  if gpu is not None:
    return _gpu_topology(name, *gpu, device_memory_gib, peak_tflops)
  gen, tpu_name = tpu_topology_name(name)
  import os
  # Compile-only: let several processes load libtpu (its lockfile guards a real TPU).
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies
  try:
    extra = {"num_slices": slices} if slices > 1 else {}
    devices = topologies.get_topology_desc(platform="tpu", topology_name=tpu_name,
                                           **extra).devices
  except (RuntimeError, ValueError, NotImplementedError) as err:
    raise ValueError(f"topology {name!r} ({tpu_name}): libtpu could not describe it ({err});"
                     ' install it with `pip install "dllm-rl[tpu]"` (from a checkout:'
                     " `pip install -r requirements-tpu.txt`; no TPU needed)") from err
  hbm, flops, _ = TPU_CHIPS[gen]
  chips = slices * math.prod(int(d) for d in tpu_name.split(":")[1].split("x"))
  per_chip = len(devices) / chips  # devices per chip (cores exposed separately on some)
  hbm = device_memory_gib * GIB if device_memory_gib else hbm / per_chip
  label = f"{slices} × {name}" if slices > 1 else name
  return Topology(label, tuple(devices), int(hbm),
                  (peak_tflops * 1e12) if peak_tflops else flops / per_chip, estimate=False,
                  chips=chips)
