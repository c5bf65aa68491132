"""Benchmark: model FLOP utilisation of the jitted RL step on one accelerator.

    python -m dllm_rl.benchmarks.rl_step_mfu [--d-model 2048 --layers 16 --heads 16
        --mlp 5632 --vocab 32768] [--prompts 2 --group 8 --prompt 256 --gen 256]
        [--dtype bfloat16] [--steps 5]

A random LLaDA-architecture model (~1B parameters by default) and one synthetic rollout
batch (random prompts and completions, binary rewards), the StableDRL step with the ELBO
estimator (μ = 2 inner updates, one Monte-Carlo draw) as the default config builds it.
Reports the median step time after compilation, the step's model FLOPs (analytic,
dllm_rl/train/flops.py: every forward of the μ updates and of ℓ̂_old, the convention of the
runs' own ``mfu``), this device's measured matmul peak (median of jitted --peak-n³ matmuls in
--dtype, 8192 by default) and their ratio (MFU). XLA's cost analysis of the compiled step is
printed beside it, not used: it counts a loop body once (the μ inner updates are a
``lax.scan``), so it is a lower bound. Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from dllm_rl.benchmarks.common import (check_flags, check_model_sizes, description,
                                      matmul_peak, sharded_rl_step)


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(prog="python -m dllm_rl.benchmarks.rl_step_mfu",
                               description=description(__doc__))
  ap.add_argument("--d-model", type=int, default=2048)
  ap.add_argument("--layers", type=int, default=16)
  ap.add_argument("--heads", type=int, default=16)
  ap.add_argument("--mlp", type=int, default=5632)
  ap.add_argument("--vocab", type=int, default=32768)
  ap.add_argument("--prompts", type=int, default=2)
  ap.add_argument("--group", type=int, default=8)
  ap.add_argument("--prompt", type=int, default=256)
  ap.add_argument("--gen", type=int, default=256)
  ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--peak-n", type=int, default=8192, help="matmul size of the peak measurement")
  args = ap.parse_args(argv)
  check_flags(ap, args, positive=("d-model", "layers", "heads", "mlp", "prompts", "group",
                                  "prompt", "gen", "steps", "peak-n"))
  check_model_sizes(ap, args)

  import jax
  import jax.numpy as jnp
  import numpy as np

  from dllm_rl.config.defaults import get_config
  from dllm_rl.models import transformer as T
  from dllm_rl.parallel import shard
  from dllm_rl.parallel.mesh import make_mesh
  from dllm_rl.rl.step import RolloutBatch
  from dllm_rl.train.flops import rl_step_flops

  config = get_config()
  config.unlock()
  config.data.prompt_len, config.data.completion_len = args.prompt, args.gen
  config.rl.batch_prompts, config.rl.group_size = args.prompts, args.group
  dt = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[args.dtype]
  mcfg = T.ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers,
                       n_heads=args.heads, n_kv_heads=args.heads,
                       head_dim=args.d_model // args.heads, mlp_hidden=args.mlp, dtype=dt)

  b, g, p, l = args.prompts, args.group, args.prompt, args.gen
  rng = np.random.default_rng(0)
  rewards = rng.integers(0, 2, (b, g)).astype(np.float32)
  batch = RolloutBatch(rng.integers(0, args.vocab - 2, (b, p)).astype(np.int32),
                       np.ones((b, p), bool),
                       rng.integers(0, args.vocab - 2, (b, g, l)).astype(np.int32),
                       np.broadcast_to(np.arange(l) % config.sampler.steps,
                                       (b, g, l)).astype(np.int32), rewards, rewards > 0)
  mesh = make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
  step, state = sharded_rl_step(config, mcfg, mesh, mask_id=args.vocab - 1, eos_id=args.vocab - 2)
  dev_batch = shard.put_global(mesh, batch)
  t0 = time.perf_counter()
  compiled = step.lower(state, dev_batch, jax.random.key(0)).compile()
  compile_s = time.perf_counter() - t0
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  flops = float(cost.get("flops", float("nan")))
  state, _ = compiled(state, dev_batch, jax.random.key(0))
  jax.block_until_ready(state.step)
  times = []
  for i in range(args.steps):
    t0 = time.perf_counter()
    state, _ = compiled(state, dev_batch, jax.random.key(i + 1))
    jax.block_until_ready(state.step)
    times.append(time.perf_counter() - t0)
  step_s = statistics.median(times)
  peak = matmul_peak(args.peak_n, repeats=5, dtype=dt)
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; model "
        f"{T.count_params(state.params) / 1e9:.3g}B params ({args.dtype}); batch {b}×{g}, "
        f"P={p}, L={l}, μ = {config.rl.inner_steps}")
  print(summary(step_s, compile_s, rl_step_flops(config, mcfg), flops, peak, args.dtype))


def summary(step_s: float, compile_s: float, model_flops: float, xla_flops: float,
            peak: float, dtype: str) -> str:
  """The result line: MFU = ``model_flops`` / ``step_s`` / ``peak`` (FLOP/s)."""
  rate = model_flops / step_s
  return (f"RL step: {step_s * 1e3:.1f} ms (compile {compile_s:.0f} s); model FLOPs/step "
          f"{model_flops / 1e12:.3g} TFLOP (analytic) → {rate / 1e12:.3g} TFLOP/s; XLA's count "
          f"{xla_flops / 1e12:.3g} TFLOP (a lower bound: a loop body counted once); measured "
          f"{dtype} matmul peak {peak / 1e12:.3g} TFLOP/s; MFU {rate / peak:.1%}")


if __name__ == "__main__":
  main(sys.argv[1:])
