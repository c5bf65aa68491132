"""Benchmark: compile the staircase attention kernels for a GPU this host does not have.

    JAX_PLATFORMS=cpu python -m dllm_rl.benchmarks.gpu_compile [--gpu h100|h200]
        [--impl pallas mosaic_gpu] [--head-dims 64 128] [--tiles 64 128] [--dump-dir DIR]

Needs JAX's CUDA plugin (``pip install "jax[cuda12]==<this jax version>"``), no GPU: the plugin
builds a compile-only device from a GPU target config, written from a few device facts per
GPU (``GPUS`` in dllm_rl.parallel.gpu_target), and compiles for it; ``JAX_PLATFORMS=cpu`` keeps
the plugin from looking for a GPU. For each ``--impl`` ("pallas": Triton, "mosaic_gpu"),
``--head-dims`` value and ``--tiles`` value (block_q = block_k; default: each kernel's own
tiles) it compiles the forward and the forward+backward (``jax.grad``) of ``staircase_attention`` at
a small fixed layout (B 1, H 4, K 2, prompt 64, block 32, completion 96: N 256, bfloat16, 3
front-padded keys, prompt_block_causal), the whole pipeline included (Mosaic GPU: MLIR to PTX and
ptxas for sm_90a; Triton: XLA's Triton compile). One row per (impl, head dim, tiles, program,
kernel): "ok" or the first line of the error. Mosaic GPU kernels add ptxas's registers per thread,
spill store/load bytes and the shared memory per block (Mosaic GPU's scratch plus ptxas's static
bytes), read from the kernel's dumps (``MOSAIC_GPU_DUMP_TO``); Triton rows give the program's Triton
kernel count. A failing combination prints its error and the others still compile. Nothing runs:
speed, run-time behaviour (TMA, kernel load, races) and numerics are not checked.

Exit status: 0 when everything compiled, 1 when something failed (2: a bad flag, or no CUDA
plugin / JAX_PLATFORMS is not cpu, before anything compiles).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

from dllm_rl.benchmarks.common import check_flags, description, kernel_tiles
from dllm_rl.parallel.gpu_target import GPUS, cuda_topology_desc, plugin_found, setup_error

LAYOUT = dict(batch=1, heads=4, kv_heads=2, prompt=64, completion=96, block=32, front_pad=3)
IMPLS = ("pallas", "mosaic_gpu")
# Mosaic GPU's kernel dumps (its C++ reads these at each compile). With MOSAIC_GPU_DUMP_TO it
# also tries SASS, which needs nvdisasm: JAX's CUDA wheels lack it, so each kernel prints
# "nvdisasm invocation failed" to stderr (harmless; "0" does not turn it off).
_DUMP_ENV = {"MOSAIC_GPU_DUMP_PTX": "1", "MOSAIC_GPU_DUMP_PTXAS": "1"}


def parse_ptxas(text: str) -> dict:
  """Registers, spill bytes and static shared memory of the one kernel in ``ptxas -v``
  output ``text``; ValueError where it has no "Used N registers" line."""
  used = re.search(r"Used (\d+) registers(.*)", text)
  if used is None:
    raise ValueError(f"no 'Used N registers' line in the ptxas output: {text[:200]!r}")
  spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
  static = re.search(r"(\d+) bytes smem", used.group(2))
  arch = re.search(r"for '(sm_\w+)'", text)
  return dict(registers=int(used.group(1)),
              spill_stores=int(spill.group(1)) if spill else 0,
              spill_loads=int(spill.group(2)) if spill else 0,
              smem_static=int(static.group(1)) if static else 0,
              arch=arch.group(1) if arch else "?")


def parse_scratch(text: str) -> int:
  """Mosaic GPU's shared-memory scratch bytes from a kernel's ``.resources.txt`` dump."""
  found = re.search(r"smem_scratch_bytes=(\d+)", text)
  if found is None:
    raise ValueError(f"no smem_scratch_bytes in the resources dump: {text[:200]!r}")
  return int(found.group(1))


def new_kernel_dumps(dump_dir: str, seen: set[str]) -> list[tuple[str, dict | None]]:
  """(kernel name, resources) of each Mosaic GPU kernel whose ``.ptxas`` dump in ``dump_dir``
  is not in ``seen`` (which this adds it to), in dump order. Resources: ``parse_ptxas``'s plus
  ``smem``, the shared memory per block (scratch + static; None where Mosaic GPU writes no
  ``.resources.txt``: JAX 0.10); None where the ptxas dump has no register count."""
  found = []
  for f in os.listdir(dump_dir):
    m = re.fullmatch(r"(.+)_(\d+)\.ptxas", f)
    if m and f not in seen:
      found.append((int(m.group(2)), m.group(1), f))
  kernels = []
  for _, name, f in sorted(found):
    seen.add(f)
    with open(os.path.join(dump_dir, f)) as fh:
      try:
        res = parse_ptxas(fh.read())
      except ValueError:  # e.g. ptxas failed: the compile's error says why
        kernels.append((name, None))
        continue
    scratch = os.path.join(dump_dir, f[:-len(".ptxas")] + ".resources.txt")
    res["smem"] = None
    if os.path.exists(scratch):
      with open(scratch) as fh:
        res["smem"] = parse_scratch(fh.read()) + res["smem_static"]
    kernels.append((name, res))
  return kernels


def gpu_mesh(gpu: str):
  """A one-device mesh ("x") of a compile-only ``gpu`` (a key of ``GPUS``)."""
  from jax.experimental import topologies
  return topologies.make_mesh(cuda_topology_desc(gpu, "1x1x1"), (1,), ("x",))


def compile_for(mesh, fn, *avals):
  """``jax.jit(fn)`` compiled for ``mesh``'s devices with arguments shaped like ``avals``
  (under ``jax.set_mesh``: Pallas and the kernels read the target from the abstract mesh)."""
  import jax
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep) for a in avals]
  with jax.set_mesh(mesh):
    return jax.jit(fn).trace(*args).lower().compile()


def programs(impl: str, head_dim: int, tiles: int):
  """(name, function, argument avals) of the forward and forward+backward programs."""
  import jax
  import jax.numpy as jnp

  from dllm_rl.kernels import staircase as sc
  lay = LAYOUT
  n = lay["prompt"] + 2 * lay["completion"]
  valid_BN = jnp.arange(n)[None, :] >= lay["front_pad"]

  def attn(q, k, v):
    return sc.staircase_attention(
        q, k, v, prompt_len=lay["prompt"], block_size=lay["block"], key_valid_BN=valid_BN,
        prompt_block_causal=True, impl=impl, block_q=tiles, block_k=tiles)

  loss = lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32))
  q = jax.ShapeDtypeStruct((lay["batch"], n, lay["heads"], head_dim), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((lay["batch"], n, lay["kv_heads"], head_dim), jnp.bfloat16)
  return [("fwd", attn, (q, kv, kv)), ("fwd+bwd", jax.grad(loss, argnums=(0, 1, 2)), (q, kv, kv))]


def _first_line(err: Exception) -> str:
  text = str(err).strip().splitlines()
  return f"{type(err).__name__}: {text[0] if text else ''}"[:200]


def compile_rows(mesh, impl: str, head_dim: int, tiles: int, dump_dir: str, seen: set[str]):
  """Compiles ``programs(impl, head_dim, tiles)``; yields (program, kernel, status, resources
  or None) rows: one per Mosaic GPU kernel of a compiled program, else one per program
  (status "ok" or "FAILED <error's first line>")."""
  for name, fn, avals in programs(impl, head_dim, tiles):
    try:
      text = compile_for(mesh, fn, *avals).as_text()
    except Exception as err:  # noqa: BLE001 - printed; the other combinations still compile
      new_kernel_dumps(dump_dir, seen)  # a failed compile's dumps are not the next one's
      yield name, "-", f"FAILED {_first_line(err)}", None
      continue
    kernels = new_kernel_dumps(dump_dir, seen)
    if impl == "mosaic_gpu" and kernels:
      for kernel, res in kernels:
        yield name, kernel, "ok", res
    else:
      calls = text.count("__gpu$xla.gpu.triton")
      yield name, f"{calls} Triton kernel(s)" if impl == "pallas" else "-", "ok", None


def _row(impl, d, tiles, program, kernel, status, res) -> str:
  dash = "-"
  cells = (f"{res['registers']:>5} {res['spill_stores']:>5}/{res['spill_loads']:<5} "
           f"{dash if res['smem'] is None else res['smem']:>7}" if res
           else f"{dash:>5} {dash:>11} {dash:>7}")
  return f"{impl:<11} {d:>4} {tiles:>5}  {program:<8} {kernel:<20} {cells}  {status}"


def _own_tiles(mesh, impl: str) -> int:
  """The kernel's default block_q for ``mesh``'s GPU (``common.kernel_tiles``)."""
  import jax
  with jax.set_mesh(mesh):
    return kernel_tiles(impl)[0]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m dllm_rl.benchmarks.gpu_compile",
                               description=description(__doc__))
  ap.add_argument("--gpu", default="h100", choices=sorted(GPUS))
  ap.add_argument("--impl", nargs="+", default=list(IMPLS), choices=IMPLS)
  ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
  ap.add_argument("--tiles", type=int, nargs="+", default=None,
                  help="block_q = block_k values (default: each kernel's own)")
  ap.add_argument("--dump-dir", default=None,
                  help="folder for the Mosaic GPU kernel dumps (PTX, ptxas -v; default: a "
                  "temporary folder); each run writes a fresh folder in it")
  args = ap.parse_args(argv)
  check_flags(ap, args, positive=("head-dims", "tiles"))
  import jax
  error = setup_error(jax.config.jax_platforms, plugin_found(), jax.__version__)
  if error:
    ap.error(error)

  if args.dump_dir:  # a fresh folder in it: the kernels' dump names restart in each process
    os.makedirs(args.dump_dir, exist_ok=True)
  dump_dir = tempfile.mkdtemp(prefix=f"gpu_compile_{args.gpu}_", dir=args.dump_dir)
  os.environ.update(_DUMP_ENV, MOSAIC_GPU_DUMP_TO=dump_dir)
  mesh = gpu_mesh(args.gpu)
  device = mesh.devices.flat[0]
  lay = LAYOUT
  print(f"jax {jax.__version__}; compile-only {device.device_kind} ({args.gpu}, cc "
        f"{'.'.join(map(str, GPUS[args.gpu]['compute_capability']))}); B={lay['batch']} "
        f"H={lay['heads']} K={lay['kv_heads']} P={lay['prompt']} L={lay['completion']} "
        f"block={lay['block']} bfloat16; Mosaic GPU dumps in {dump_dir}")
  print(f"{'impl':<11} {'D':>4} {'tiles':>5}  {'program':<8} {'kernel':<20} {'regs':>5} "
        f"{'spill st/ld':>11} {'smem B':>7}  status")
  failed = 0
  seen: set[str] = set()
  for impl in args.impl:
    for d in args.head_dims:
      for tiles in args.tiles or [_own_tiles(mesh, impl)]:
        for row in compile_rows(mesh, impl, d, tiles, dump_dir, seen):
          failed += row[2].startswith("FAILED")
          print(_row(impl, d, tiles, *row), flush=True)
  print(f"{failed} failed" if failed else "all compiled")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
