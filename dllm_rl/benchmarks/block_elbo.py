"""Benchmark: the block-diffusion ELBO in one staircase pass vs one forward per block.

    python -m dllm_rl.benchmarks.block_elbo [--lengths 256 1024 4096] [--block 32]

A small block-diffusion model (d=64, 2 layers, 4 heads, 2 KV heads), B=1,
P=64; one Monte-Carlo draw. Times (after compilation) the one-pass estimator
(`block_elbo`, staircase attention with the dense reference on CPU or the
Pallas kernel on GPU/TPU) against `block_elbo_loop` (L / block forwards with a
dense block-causal mask) and prints their max difference. Lengths whose loop
would exceed --budget seconds are skipped and said so. Asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time

from dllm_rl.benchmarks.common import (check_flags, check_lengths, check_pallas_backend,
                                      description)


def _time(fn, *args, repeats: int):
  import jax
  jax.block_until_ready(fn(*args))  # compile
  t0 = time.perf_counter()
  for _ in range(repeats):
    out = fn(*args)
  jax.block_until_ready(out)
  return (time.perf_counter() - t0) / repeats, out


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(prog="python -m dllm_rl.benchmarks.block_elbo",
                               description=description(__doc__))
  ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
  ap.add_argument("--block", type=int, default=32)
  ap.add_argument("--prompt", type=int, default=64)
  ap.add_argument("--impl", default="auto", choices=["auto", "pallas", "interpret", "reference"])
  ap.add_argument("--budget", type=float, default=120.0, help="skip lengths predicted slower")
  args = ap.parse_args(argv)
  check_flags(ap, args, positive=("lengths", "block"), nonnegative=("prompt",))
  check_lengths(ap, args)

  import jax
  import jax.numpy as jnp
  import numpy as np
  check_pallas_backend(ap, args.impl, jax.default_backend())

  from dllm_rl.diffusion.block import block_elbo, block_elbo_loop
  from dllm_rl.diffusion.estimators import EstimatorConfig
  from dllm_rl.models import transformer as T
  from dllm_rl.types import SequenceBatch

  cfg = T.ModelConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                      head_dim=16, mlp_hidden=176)
  graphdef, params = T.init_model(cfg, jax.random.key(0))
  logits_fn = lambda *a: T.apply(graphdef, params, *a)
  est = EstimatorConfig(block_size=args.block, attention_impl=args.impl)
  print(f"jax {jax.__version__}, {jax.default_backend()}; P={args.prompt} block={args.block} "
        f"model d=64 × 2 layers; staircase impl {args.impl!r}")
  print(f"{'L':>6} {'one pass ms':>12} {'per-block loop ms':>18} {'speed-up':>9} {'max |Δ|':>9}")
  per_token_loop = None
  for l in args.lengths:
    k = jax.random.split(jax.random.key(l), 2)
    seqs = SequenceBatch(jax.random.randint(k[0], (1, args.prompt), 3, 128),
                         jnp.ones((1, args.prompt), bool),
                         jax.random.randint(k[1], (1, l), 3, 128), jnp.ones((1, l), bool))
    one = jax.jit(lambda s, key: block_elbo(logits_fn, s, key, est, 2).token_BL)
    t_one, a = _time(one, seqs, jax.random.key(1), repeats=3)
    predicted = None if per_token_loop is None else per_token_loop * (l / args.block) ** 2
    if predicted is not None and predicted > args.budget:
      print(f"{l:>6} {1e3 * t_one:>12.1f} {'skipped (~%.0f s)' % predicted:>18}")
      continue
    loop = jax.jit(lambda s, key: block_elbo_loop(logits_fn, s, key, est, 2).token_BL)
    t_loop, b = _time(loop, seqs, jax.random.key(1), repeats=1)
    per_token_loop = t_loop / (l / args.block) ** 2
    diff = float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
    print(f"{l:>6} {1e3 * t_one:>12.1f} {1e3 * t_loop:>18.1f} {t_loop / t_one:>8.1f}× {diff:>9.1e}")


if __name__ == "__main__":
  main(sys.argv[1:])
