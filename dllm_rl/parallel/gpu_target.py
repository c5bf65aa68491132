"""NVIDIA GPUs that JAX's CUDA plugin compiles for without the hardware.

``GPUS`` holds a few device facts per GPU; ``target_config_text`` writes them as the GPU target
config (XLA's ``GpuTargetConfigProto``, protobuf text) that
``jax.experimental.topologies.get_topology_desc(platform="cuda", ...)`` takes: the plugin then
builds compile-only devices and compiles for them with the real XLA GPU compiler. It needs
the plugin (``pip install "jax[cuda12]==<this jax>"``; no GPU) and ``JAX_PLATFORMS=cpu`` set
before JAX starts (the plugin then registers its topology without initialising CUDA).
Used by the planner (dllm_rl.parallel.topology: ``h100-N``) and benchmarks/gpu_compile.py.
"""

from __future__ import annotations

import importlib.util

# Device facts per GPU (NVIDIA's datasheets and the CUDA occupancy tables): compute capability,
# streaming multiprocessors (SMs), shared memory (per block without / with the opt-in, per SM),
# registers, thread limits, FP32 lanes per SM, memory, its bandwidth, boost clock, L2 cache,
# peak dense bf16 FLOP/s (SXM, no sparsity).
_H100 = dict(
    name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0), sms=132,
    smem_per_block=48 * 1024, smem_per_block_optin=227 * 1024, smem_per_sm=228 * 1024,
    registers_per_sm=65536, registers_per_block=65536, threads_per_block=1024,
    threads_per_sm=2048, threads_per_warp=32, fp32_lanes_per_sm=128,
    memory_bytes=80 * 10**9, memory_bandwidth=3.35e12, clock_ghz=1.98, l2_bytes=50 * 2**20,
    peak_bf16_flops=989e12)
GPUS = {
    "h100": _H100,  # H100 SXM
    "h200": {**_H100, "name": "NVIDIA H200", "memory_bytes": 141 * 10**9,
             "memory_bandwidth": 4.8e12},  # the same SM as the H100, more and faster HBM3e
}
PLUGINS = ("jax_plugins.xla_cuda12", "jax_cuda12_plugin")


def target_config_text(facts: dict) -> str:
  """The GPU target config (XLA's ``GpuTargetConfigProto`` in protobuf text format) of a GPU
  with ``facts`` (an entry of ``GPUS``): what the CUDA plugin compiles for without a device."""
  major, minor = facts["compute_capability"]
  info = [
      ("threads_per_block_limit", facts["threads_per_block"]),
      ("threads_per_warp", facts["threads_per_warp"]),
      ("shared_memory_per_block", facts["smem_per_block"]),
      ("shared_memory_per_core", facts["smem_per_sm"]),
      ("threads_per_core_limit", facts["threads_per_sm"]),
      ("core_count", facts["sms"]),
      ("fpus_per_core", facts["fp32_lanes_per_sm"]),
      ("block_dim_limit_x", 2**31 - 1),
      ("block_dim_limit_y", 65535),
      ("block_dim_limit_z", 65535),
      ("memory_bandwidth", int(facts["memory_bandwidth"])),
      ("l2_cache_size", facts["l2_bytes"]),
      ("clock_rate_ghz", facts["clock_ghz"]),
      ("device_memory_size", facts["memory_bytes"]),
      ("shared_memory_per_block_optin", facts["smem_per_block_optin"]),
      ("registers_per_core_limit", facts["registers_per_sm"]),
      ("registers_per_block_limit", facts["registers_per_block"]),
  ]
  lines = ["gpu_device_info {", *(f"  {k}: {v}" for k, v in info),
           f"  cuda_compute_capability {{ major: {major} minor: {minor} }}", "}",
           'platform_name: "CUDA"', f'device_description_str: "{facts["name"]}"']
  return "\n".join(lines) + "\n"


def setup_error(platforms: str | None, plugin_found: bool, jax_version: str) -> str | None:
  """Why this process cannot compile for an absent GPU, or None: the CUDA plugin must be
  installed (``plugin_found``) and JAX must not look for a GPU (``platforms``, the
  JAX_PLATFORMS value, must be cpu: the plugin then registers its compile-only topology
  without initialising CUDA)."""
  if not plugin_found:
    return (f"no CUDA plugin for JAX ({' / '.join(PLUGINS)} does not import): "
            f'pip install "jax[cuda12]=={jax_version}" (it needs no GPU), then run with '
            "JAX_PLATFORMS=cpu")
  if platforms != "cpu":
    return (f"JAX_PLATFORMS is {platforms!r}: run with JAX_PLATFORMS=cpu (the CUDA plugin "
            "then compiles for the target GPU without looking for one)")
  return None


def plugin_found() -> bool:
  """Whether JAX's CUDA plugin is installed (either of its module names)."""
  return any(importlib.util.find_spec(p.split(".")[0]) is not None
             and importlib.util.find_spec(p) is not None for p in PLUGINS)


def cuda_topology_desc(gpu: str, topology: str):
  """Compile-only ``gpu`` devices (a key of ``GPUS``) laid out as ``topology``
  ("<slices>x<hosts per slice>x<GPUs per host>", e.g. "1x1x8")."""
  from jax.experimental import topologies
  return topologies.get_topology_desc(platform="cuda", topology=topology,
                                      target_config=target_config_text(GPUS[gpu]))
