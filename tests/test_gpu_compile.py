"""python -m dllm_rl.benchmarks.gpu_compile: the GPU target config written from device facts,
the ptxas / Mosaic GPU dump parsers, the missing-plugin error, the rows and exit status, and
(where JAX's CUDA plugin is installed) a real compile for an absent H200."""

import os
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

from dllm_rl.benchmarks import gpu_compile as gc
from dllm_rl.parallel import gpu_target as gt
from tests.helpers import fresh_jax_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PTXAS_SPILLS = """\
ptxas warning : Registers are spilled to local memory in function 'k_mosaic_gpu_kernel', \
568 bytes spill stores, 572 bytes spill loads
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for k_mosaic_gpu_kernel
    464 bytes stack frame, 568 bytes spill stores, 572 bytes spill loads
ptxas info    : Used 255 registers, used 2 barriers, 464 bytes cumulative stack size, 1 bytes smem
ptxas info    : Compile time = 223.713 ms
"""
PTXAS_CLEAN = """\
ptxas info    : Compiling entry function 'k_mosaic_gpu_kernel' for 'sm_90a'
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 150 registers, used 2 barriers
"""
RESOURCES = ("Resources(smem_scratch_bytes=109568, tmem_scratch_cols=0, barrier_counts="
             "Counter({Barrier(arrival_count=1, num_barriers=7): 1}))")


@pytest.mark.parametrize("gpu, memory, bandwidth, name", [
    ("h100", 80 * 10**9, 3350000000000, "NVIDIA H100 80GB HBM3"),
    ("h200", 141 * 10**9, 4800000000000, "NVIDIA H200"),
])
def test_target_config_text_carries_the_device_facts(gpu, memory, bandwidth, name):
  """No Python class of XLA's GpuTargetConfigProto ships with jaxlib or the plugin, so the text
  is checked here as protobuf text (one field per line, balanced braces); the real compile test
  below has the CUDA plugin parse it."""
  text = gt.target_config_text(gt.GPUS[gpu])
  for fact in ("cuda_compute_capability { major: 9 minor: 0 }", "core_count: 132",
               "shared_memory_per_block_optin: 232448", "shared_memory_per_core: 233472",
               "registers_per_core_limit: 65536", "registers_per_block_limit: 65536",
               "clock_rate_ghz: 1.98", "l2_cache_size: 52428800",
               f"device_memory_size: {memory}", f"memory_bandwidth: {bandwidth}",
               f'device_description_str: "{name}"', 'platform_name: "CUDA"'):
    assert fact in text, (fact, text)
  depth = 0
  for line in text.splitlines():
    depth += line.count("{") - line.count("}")
    assert depth >= 0 and (line.strip() in ("}",) or ": " in line or line.endswith("{")), line
  assert depth == 0


def test_parse_ptxas_reads_registers_spills_and_static_smem():
  assert gc.parse_ptxas(PTXAS_SPILLS) == dict(registers=255, spill_stores=568, spill_loads=572,
                                              smem_static=1, arch="sm_90a")
  assert gc.parse_ptxas(PTXAS_CLEAN) == dict(registers=150, spill_stores=0, spill_loads=0,
                                             smem_static=0, arch="sm_90a")
  with pytest.raises(ValueError, match="no 'Used N registers'"):
    gc.parse_ptxas("ptxas fatal : Unresolved extern function")
  assert gc.parse_scratch(RESOURCES) == 109568


def test_new_kernel_dumps_reads_each_new_kernel_once_in_dump_order(tmp_path):
  (tmp_path / "staircase_dkdv_10.ptxas").write_text(PTXAS_SPILLS)
  (tmp_path / "staircase_dkdv_10.resources.txt").write_text(RESOURCES)
  (tmp_path / "staircase_fwd_2.ptxas").write_text(PTXAS_CLEAN)  # no resources: JAX 0.10
  (tmp_path / "staircase_dq_3.ptxas").write_text("ptxas fatal : failed")
  (tmp_path / "staircase_fwd_2.ptx").write_text("// not a ptxas dump")
  seen = set()
  kernels = gc.new_kernel_dumps(str(tmp_path), seen)
  assert [(name, res and res["registers"], res and res["smem"]) for name, res in kernels] == [
      ("staircase_fwd", 150, None), ("staircase_dq", None, None),
      ("staircase_dkdv", 255, 109568 + 1)]
  assert gc.new_kernel_dumps(str(tmp_path), seen) == []


def test_setup_error_names_the_install_and_the_platform():
  missing = gt.setup_error("cpu", False, "0.10.2")
  assert 'pip install "jax[cuda12]==0.10.2"' in missing and "JAX_PLATFORMS=cpu" in missing
  assert "JAX_PLATFORMS=cpu" in gt.setup_error("cuda,cpu", True, "0.10.2")
  assert "JAX_PLATFORMS is None" in gt.setup_error(None, True, "0.10.2")
  assert gt.setup_error("cpu", True, "0.10.2") is None


def test_no_plugin_is_a_usage_error_before_anything_compiles(monkeypatch, capsys):
  monkeypatch.setattr(gc, "plugin_found", lambda: False)
  monkeypatch.setattr(gc, "gpu_mesh", lambda gpu: pytest.fail("made a GPU topology"))
  with pytest.raises(SystemExit) as exit_:
    gc.main(["--gpu", "h200"])
  assert exit_.value.code == 2
  err = " ".join(capsys.readouterr().err.split())
  assert f'pip install "jax[cuda12]=={jax.__version__}"' in err and "JAX_PLATFORMS=cpu" in err


def test_a_failing_combination_is_printed_and_the_others_still_compile(monkeypatch, capsys,
                                                                       tmp_path):
  """Stand-ins for the compile: tiles 96 fail; a Mosaic GPU compile writes a kernel's ptxas
  dump where MOSAIC_GPU_DUMP_TO says; a Triton program holds two Triton calls."""
  for key in (*gc._DUMP_ENV, "MOSAIC_GPU_DUMP_TO"):
    monkeypatch.setenv(key, "")  # main sets them; restored afterwards
  device = types.SimpleNamespace(device_kind="NVIDIA H200")
  monkeypatch.setattr(gc, "plugin_found", lambda: True)
  monkeypatch.setattr(gc, "gpu_mesh", lambda gpu: types.SimpleNamespace(
      devices=np.array([device])))
  monkeypatch.setattr(gc, "programs", lambda impl, d, tiles: [
      ("fwd", (impl, tiles, 0), ()), ("fwd+bwd", (impl, tiles, 1), ())])

  def compile_for(mesh, fn, *avals):
    impl, tiles, i = fn
    if tiles == 96:
      raise ValueError("block_q=96 must be a multiple of 64\nsecond line")
    if impl == "mosaic_gpu":
      dump = os.environ["MOSAIC_GPU_DUMP_TO"]
      with open(os.path.join(dump, f"staircase_dq_{i}.ptxas"), "w") as fh:
        fh.write(PTXAS_SPILLS)
    calls = '__gpu$xla.gpu.triton"\n' * 2 if impl == "pallas" else ""
    return types.SimpleNamespace(as_text=lambda: calls)

  monkeypatch.setattr(gc, "compile_for", compile_for)
  assert gc.main(["--gpu", "h200", "--head-dims", "64", "--tiles", "96", "64",
                  "--dump-dir", str(tmp_path)]) == 1
  rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:-1]]
  assert rows == [
      ["pallas", "64", "96", "fwd", "-", "-", "-", "-", "FAILED", "ValueError:", "block_q=96",
       "must", "be", "a", "multiple", "of", "64"],
      ["pallas", "64", "96", "fwd+bwd", "-", "-", "-", "-", "FAILED", "ValueError:",
       "block_q=96", "must", "be", "a", "multiple", "of", "64"],
      ["pallas", "64", "64", "fwd", "2", "Triton", "kernel(s)", "-", "-", "-", "ok"],
      ["pallas", "64", "64", "fwd+bwd", "2", "Triton", "kernel(s)", "-", "-", "-", "ok"],
      ["mosaic_gpu", "64", "96", "fwd", "-", "-", "-", "-", "FAILED", "ValueError:",
       "block_q=96", "must", "be", "a", "multiple", "of", "64"],
      ["mosaic_gpu", "64", "96", "fwd+bwd", "-", "-", "-", "-", "FAILED", "ValueError:",
       "block_q=96", "must", "be", "a", "multiple", "of", "64"],
      ["mosaic_gpu", "64", "64", "fwd", "staircase_dq", "255", "568/572", "-", "ok"],
      ["mosaic_gpu", "64", "64", "fwd+bwd", "staircase_dq", "255", "568/572", "-", "ok"]]


@pytest.mark.slow  # a subprocess: ~11 s of GPU compiles
@pytest.mark.skipif(not gc.plugin_found(), reason="JAX's CUDA plugin is not installed: "
                    'pip install "jax[cuda12]==<this jax version>" (no GPU needed)')
def test_compiles_the_kernels_for_an_absent_h200(tmp_path):
  """The real thing, in a fresh process (JAX_PLATFORMS=cpu, no compilation cache: a cached
  executable writes no kernel dumps): tiles 96 fail to build for both kernels, 64 compile,
  and the Mosaic GPU kernels' ptxas register counts for sm_90a are read from the dumps."""
  env = fresh_jax_env(JAX_PLATFORMS="cpu")
  run = subprocess.run(
      [sys.executable, "-m", "dllm_rl.benchmarks.gpu_compile", "--gpu", "h200",
       "--head-dims", "64", "--tiles", "96", "64", "--dump-dir", str(tmp_path)],
      env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
  out = run.stdout
  assert run.returncode == 1 and "compile-only NVIDIA H200 (h200, cc 9.0)" in out, (out,
                                                                                   run.stderr)
  rows = [line.split() for line in out.splitlines()[2:-1]]
  assert [r[3] for r in rows if r[2] == "96" and r[-1] != "ok"] == ["fwd", "fwd+bwd"] * 2
  assert [r[4] for r in rows if r[:3] == ["pallas", "64", "64"]] == ["1", "3"]
  mosaic = {r[4]: int(r[5]) for r in rows if r[:3] == ["mosaic_gpu", "64", "64"]}
  assert set(mosaic) >= {"staircase_fwd", "staircase_dq", "staircase_dkdv"}, out
  assert all(0 < regs <= 255 for regs in mosaic.values()), mosaic
  (dump,) = os.listdir(tmp_path)
  ptxas = [f for f in os.listdir(tmp_path / dump) if f.endswith(".ptxas")]
  assert all(gc.parse_ptxas((tmp_path / dump / f).read_text())["arch"] == "sm_90a"
             for f in ptxas) and ptxas


_MOE_SCRIPT = """
import types
import jax, jax.numpy as jnp
from dllm_rl.benchmarks.gpu_compile import gpu_mesh, compile_for
from dllm_rl.kernels import grouped_matmul as gmm
x, w = (jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((4096, 256), (64, 256, 256)))
sizes = jax.ShapeDtypeStruct((64,), jnp.int32)
real_devices = jax.devices
for d in ("ragged_dot", "tiled", "auto", "mosaic_gpu"):
  loss = lambda x, w, s, d=d: gmm.grouped_matmul(x, w, s, d).astype(jnp.float32).sum()
  # JAX's Mosaic GPU weight-gradient kernel reads the SM count off jax.devices()[0]: 132
  jax.devices = lambda *a: [types.SimpleNamespace(core_count=132, platform="gpu")]
  try:
    c = compile_for(gpu_mesh("h100"), jax.grad(loss, argnums=(0, 1)), x, w, sizes)
  finally:
    jax.devices = real_devices
  print(d, c.memory_analysis().temp_size_in_bytes, c.as_text().count("mosaic_gpu"))
"""


@pytest.mark.skipif(not gc.plugin_found(), reason="JAX's CUDA plugin is not installed: "
                    'pip install "jax[cuda12]==<this jax version>" (no GPU needed)')
def test_moe_dispatch_compiled_for_an_absent_h100():
  """XLA's GPU compiler expands ragged_dot into a dense dot over every expert ([E, R, ·]
  buffers: 268 MB of temp here, 4096 rows over 64 experts, D = F = 256, bf16, gradients of x
  and w); the tiled dispatch compiles for sm_90 in under a fourth of that (54 MB, its float32
  weight-gradient sums included), and "auto" picks it for the GPU target (the mesh's devices,
  in this CPU process). "mosaic_gpu" compiles JAX's Mosaic GPU kernels (forward, dx, dw) for
  sm_90 and needs no gathered weights (2 MB)."""
  env = fresh_jax_env(JAX_PLATFORMS="cpu")
  run = subprocess.run([sys.executable, "-c", _MOE_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
  assert run.returncode == 0, run.stderr[-3000:]
  rows = {name: (int(n), int(k)) for name, n, k in (line.split() for line in
                                                     run.stdout.splitlines())}
  temp = {name: n for name, (n, _) in rows.items()}
  assert temp["ragged_dot"] >= 64 * 4096 * 256 * 4  # one f32 [E, R, D] buffer at least
  assert temp["auto"] == temp["tiled"] and temp["tiled"] * 4 < temp["ragged_dot"], temp
  assert rows["mosaic_gpu"][1] > 0 and rows["tiled"][1] == 0, rows  # Mosaic GPU custom calls
  assert temp["mosaic_gpu"] * 4 < temp["tiled"], temp


_TOPK_SCRIPT = """
import jax, jax.numpy as jnp
from jax.experimental import topologies
from jax.sharding import NamedSharding, PartitionSpec as P
from dllm_rl.parallel.gpu_target import cuda_topology_desc
from dllm_rl.parallel.topk import top_k
mesh = topologies.make_mesh(cuda_topology_desc("h100", "1x1x8"), (8,), ("b",))
sh = NamedSharding(mesh, P("b", None, None))
x = jax.ShapeDtypeStruct((64, 32, 4096), jnp.float32, sharding=sh)
for name, op in (("lax", jax.lax.top_k), ("ours", top_k)):
  # G = 4 lanes of a [B, L, V] batch, as the samplers vmap their groups
  fn = lambda x, op=op: jax.vmap(lambda k: op(x * k, 50)[0][..., -1])(jnp.arange(1.0, 5.0))
  out = NamedSharding(mesh, P(None, "b", None))
  with jax.set_mesh(mesh):
    c = jax.jit(fn, out_shardings=out).trace(x).lower().compile()
  print(name, "all-gather" in c.as_text(), c.memory_analysis().temp_size_in_bytes)
"""


@pytest.mark.skipif(not gc.plugin_found(), reason="JAX's CUDA plugin is not installed: "
                    'pip install "jax[cuda12]==<this jax version>" (no GPU needed)')
def test_top_k_under_vmap_stays_partitioned_for_absent_h100s():
  """XLA's GPU compiler all-gathers the sharded batch of a vmapped lax.top_k ([G, B, L, V]
  reshaped to [G·B·L, V]); dllm_rl.parallel.topk.top_k compiles without an all-gather, in
  less temp memory (8 compile-only H100s, B split over them)."""
  env = fresh_jax_env(JAX_PLATFORMS="cpu")
  run = subprocess.run([sys.executable, "-c", _TOPK_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
  assert run.returncode == 0, run.stderr[-3000:]
  got = {name: (gathers == "True", int(temp)) for name, gathers, temp in
         (line.split() for line in run.stdout.splitlines())}
  assert got["lax"][0] and not got["ours"][0], got
  assert got["ours"][1] < got["lax"][1], got
