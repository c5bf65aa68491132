"""Benchmark: the tiny RL step on 1 vs N simulated devices, and checkpoint save/restore.

    python -m dllm_rl.benchmarks.scale_out [--devices 8] [--steps 10]

Forces N simulated host devices (XLA_FLAGS, set before JAX is imported), then
times the jitted RL step (StableDRL, ELBO, μ = 2, 8 prompts × 16 completions,
the tiny_cpu model) on a 1-device mesh and on an N-device data-parallel mesh,
and an Orbax save (async: until committed) and restore of the RL train state.
Prints measured figures; asserts nothing. On a 2-core CPU the simulated
devices share the cores, so N devices measure partitioning overhead, not speed-up.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from dllm_rl.benchmarks.common import check_flags, description


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(prog="python -m dllm_rl.benchmarks.scale_out",
                               description=description(__doc__))
  ap.add_argument("--devices", type=int, default=8)
  ap.add_argument("--steps", type=int, default=10)
  args = ap.parse_args(argv)
  check_flags(ap, args, positive=("devices", "steps"))
  from dllm_rl.config.defaults import get_config  # imports no JAX: XLA_FLAGS still apply
  prompts = get_config().rl.batch_prompts
  if prompts % args.devices:
    ap.error(f"--devices {args.devices} must divide the step's {prompts} prompts (the"
             " data-parallel mesh splits them)")
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={args.devices}")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

  import jax
  import numpy as np

  from dllm_rl.benchmarks.common import sharded_rl_step
  from dllm_rl.infra.checkpoint import Checkpointer
  from dllm_rl.parallel import shard
  from dllm_rl.parallel.mesh import make_mesh
  from dllm_rl.rl.step import RolloutBatch
  from dllm_rl.tasks import CharTokenizer
  from dllm_rl.train.context import model_config

  config = get_config()
  tok = CharTokenizer()
  mcfg = model_config(config, tok.vocab_size)
  r = config.rl
  b, g, p, l = r.batch_prompts, r.group_size, config.data.prompt_len, config.data.completion_len
  rng = np.random.default_rng(0)
  rewards = rng.integers(0, 2, (b, g)).astype(np.float32)
  batch = RolloutBatch(rng.integers(3, tok.vocab_size, (b, p)).astype(np.int32),
                       np.ones((b, p), bool),
                       rng.integers(3, tok.vocab_size, (b, g, l)).astype(np.int32),
                       np.broadcast_to(np.arange(l), (b, g, l)).astype(np.int32), rewards,
                       rewards > 0)


  print(f"jax {jax.__version__}, {jax.device_count()} {jax.default_backend()} devices, "
        f"{os.cpu_count()} CPU cores; model {mcfg.d_model}d × {mcfg.n_layers} layers; "
        f"batch {b}×{g}×{l}, μ = {r.inner_steps}")
  for shape in [(1, 1, 1), (args.devices, 1, 1)]:
    mesh = make_mesh(dict(zip(("data", "fsdp", "tensor"), shape)))
    step, state = sharded_rl_step(config, mcfg, mesh, mask_id=tok.mask_id, eos_id=tok.eos_id)
    dev_batch = shard.put_global(mesh, batch)
    t0 = time.perf_counter()
    state, m = step(state, dev_batch, jax.random.key(0))
    jax.block_until_ready(state.step)
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(args.steps):
      state, m = step(state, dev_batch, jax.random.key(i + 1))
    jax.block_until_ready(state.step)
    per_step = (time.perf_counter() - t0) / args.steps
    print(f"mesh data×fsdp×tensor={shape}: RL step {1e3 * per_step:.1f} ms "
          f"(first call incl. compile {compile_s:.1f} s)")
    with tempfile.TemporaryDirectory() as d:
      with Checkpointer(d, keep=2, async_save=True) as ckpt:
        timings = []
        for save_step in (1, 2):  # the first save includes Orbax's one-time set-up
          t0 = time.perf_counter()
          ckpt.save(save_step, state, {"data_position": 0})
          t_return = time.perf_counter() - t0
          ckpt.wait()
          timings.append((t_return, time.perf_counter() - t0))
        t0 = time.perf_counter()
        restored, _ = ckpt.restore(state)
        jax.block_until_ready(restored.params)
        t_restore = time.perf_counter() - t0
    size = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(state.params))
    saves = "; ".join(f"save {i + 1} returns in {1e3 * a:.0f} ms, committed in {1e3 * b:.0f} ms"
                      for i, (a, b) in enumerate(timings))
    print(f"  checkpoint ({size / 1e6:.2f} MB of params, plus Adam moments): {saves};"
          f" restore {1e3 * t_restore:.0f} ms")


if __name__ == "__main__":
  main(sys.argv[1:])
