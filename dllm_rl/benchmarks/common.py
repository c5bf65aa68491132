"""Shared by the benchmarks: the device's measured matmul peak (the denominator of FLOP/s and
MFU figures) and a fresh sharded RL step."""

from __future__ import annotations

import statistics
import time


def description(doc: str) -> str:
  """A module docstring's first paragraph on one line: its ``--help`` description (the first
  line alone cut a sentence that wraps, e.g. the sampler's "... on an")."""
  return " ".join(doc.split("\n\n")[0].split())


def matmul_peak(n: int = 1024, repeats: int = 7, dtype=None) -> float:
  """Median FLOP/s of a jitted n×n×n matmul (``dtype`` inputs, float32 accumulation;
  float32 by default) on the default device."""
  import jax
  import jax.numpy as jnp

  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype or jnp.float32)
  f = jax.jit(lambda x: jnp.dot(x, x, preferred_element_type=jnp.float32))
  jax.block_until_ready(f(a))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(f(a))
    times.append(time.perf_counter() - t0)
  return 2 * n ** 3 / statistics.median(times)


def measure(fn, args, repeats: int):
  """(median seconds, temp bytes or None, compile seconds, output) of jit(fn)(*args):
  compiled once, run once to warm up (its output is returned, for error checks without a
  second compile), then timed ``repeats`` times; temp from XLA's memory_analysis."""
  import jax
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  compile_s = time.perf_counter() - t0
  try:
    temp = compiled.memory_analysis().temp_size_in_bytes
  except Exception:  # noqa: BLE001 - backends without memory analysis
    temp = None
  out = jax.block_until_ready(compiled(*args))  # warm-up
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times), temp, compile_s, out


def fmt_mem(x) -> str:
  return "n/a" if x is None else f"{x / 2**20:.1f} MiB"


def sharded_rl_step(config, model_cfg, mesh, *, mask_id: int, eos_id: int):
  """(jitted rl_step, fresh sharded TrainState) with ``config``'s RL options for a freshly
  initialised ``model_cfg`` on ``mesh`` — what the RL loop builds, without data or weights."""
  import jax

  from dllm_rl.models import transformer
  from dllm_rl.parallel import shard
  from dllm_rl.rl.step import make_rl_step
  from dllm_rl.sampling.sampler import SamplerConfig
  from dllm_rl.train.rl_loop import rl_optimizer, step_config

  optimizer, schedule = rl_optimizer(config.rl)
  graphdef, params = transformer.init_params_sharded(model_cfg, jax.random.key(0), mesh)
  state, sharding = shard.init_state_sharded(params, optimizer, jax.random.key(1), mesh)
  cfg = step_config(config, SamplerConfig.from_config(config), mask_id, eos_id)
  return make_rl_step(graphdef, optimizer, schedule, cfg, mesh=mesh,
                      state_sharding=sharding), state


def check_flags(ap, args, *, positive=(), nonnegative=()) -> None:
  """``ap.error`` (exit 2, before anything compiles) naming the first flag of ``positive``
  with a value < 1 or of ``nonnegative`` with a value < 0 (every value of a list flag);
  flags are named as typed, ``d-model`` for ``args.d_model``."""
  for names, low in ((positive, 1), (nonnegative, 0)):
    for name in names:
      value = getattr(args, name.replace("-", "_"))
      for v in value if isinstance(value, list) else [value]:
        if v is not None and v < low:
          ap.error(f"--{name} must be >= {low}, got {v}")


def check_lengths(ap, args) -> None:
  """``ap.error`` naming the first ``--lengths`` value that is not a multiple of ``--block``."""
  for length in args.lengths:
    if length % args.block:
      ap.error(f"--lengths: {length} is not a multiple of --block {args.block}")


def check_pallas_backend(ap, impl: str, backend: str) -> None:
  """``ap.error`` for ``--impl pallas`` on CPU, where the kernel does not compile."""
  if impl == "pallas" and backend == "cpu":
    ap.error("--impl pallas compiles the kernel for a GPU or TPU; on CPU use auto or interpret")


def kernel_tiles(impl: str) -> tuple[int, int]:
  """(block_q, block_k) the staircase kernel ``impl`` uses on the current target
  (``staircase.default_block_sizes``), or the Mosaic GPU tiles where ``impl`` cannot be
  built there (``mosaic_gpu`` off a GPU): the benchmark then prints that method's error in
  its rows."""
  from dllm_rl.kernels import staircase as sc
  from dllm_rl.kernels.staircase_mgpu import TILE
  try:
    return sc.default_block_sizes(impl)
  except ValueError:
    return TILE, TILE


def check_model_sizes(ap, args) -> None:
  """``ap.error`` for a random model that cannot be built: ``--vocab`` below 3 (mask, EOS and
  a prompt token) or ``--d-model`` not a multiple of ``--heads``."""
  if args.vocab < 3:
    ap.error(f"--vocab must be >= 3 (mask, EOS and a prompt token), got {args.vocab}")
  if args.d_model % args.heads:
    ap.error(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
