"""Benchmark: staircase attention kernel vs the dense-mask reference.

    python -m dllm_rl.benchmarks.staircase [--lengths 256 1024 4096] [--impl auto ...]

Layout [prompt P | clean L | noisy L] (P = 128, block 32, B = 1, H = 8 query /
2 key-value heads, head_dim 64 by default). For each completion length L prints
the fraction of (query tile, key tile) pairs the kernel skips and the fraction
of (query, key) pairs the mask allows, then the median time of the jitted
forward and forward+backward, and the compiled temp memory (XLA
memory_analysis, n/a where the backend gives none), the compile seconds (forward,
forward+backward) and the forward's max |error| against the dense reference in float32 on
the same inputs, for: each ``--impl`` kernel (``--impl pallas mosaic_gpu`` times the Triton
and the Mosaic GPU kernels side by side on a GPU), the jnp reference with a dense [N, N] mask
and, on GPU/TPU, jax.nn.dot_product_attention with the same dense mask. A method that fails
(e.g. ``mosaic_gpu`` where this JAX or device cannot build it) prints its error and the
others still run. On CPU the kernel runs in the Pallas interpreter
(correct but slow, its times say nothing about compiled speed); lengths
predicted to take longer than --max-interpret-s there are skipped, as are
dense runs whose [B, H, N, N] float32 scores would not fit in half the RAM.
Prints measured figures only; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from dllm_rl.benchmarks.common import (
    check_flags,
    check_lengths,
    check_pallas_backend,
    description,
    fmt_mem,
    kernel_tiles,
    measure,
)


def _mask_density(p: int, l: int, bs: int) -> float:
  """Fraction of the N×N (query, key) pairs the staircase mask allows."""
  allowed = p * p
  for b in range(l // bs):
    allowed += bs * (p + (b + 1) * bs)  # clean block b
    allowed += bs * (p + b * bs + bs)  # noisy block b
  return allowed / (p + 2 * l) ** 2


def _kernel_impl(impl: str, backend: str) -> str:
  """The ``staircase_attention`` impl a ``--impl`` value runs ("auto": the interpreter on
  CPU, the compiled Pallas kernel elsewhere)."""
  return ("interpret" if backend == "cpu" else "pallas") if impl == "auto" else impl


def _max_error(out, ref) -> str:
  import jax.numpy as jnp
  return "n/a" if ref is None else f"{float(jnp.abs(out.astype(jnp.float32) - ref).max()):.2e}"


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(prog="python -m dllm_rl.benchmarks.staircase",
                               description=description(__doc__))
  ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
  ap.add_argument("--impl", nargs="+", default=["auto"],
                  choices=["auto", "pallas", "mosaic_gpu", "interpret"],
                  help="kernel(s) to time, each beside the references")
  ap.add_argument("--prompt", type=int, default=128)
  ap.add_argument("--block", type=int, default=32)
  ap.add_argument("--batch", type=int, default=1)
  ap.add_argument("--heads", type=int, default=8)
  ap.add_argument("--kv-heads", type=int, default=2)
  ap.add_argument("--head-dim", type=int, default=64)
  ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
  ap.add_argument("--block-q", type=int, default=None)
  ap.add_argument("--block-k", type=int, default=None)
  ap.add_argument("--repeats", type=int, default=None)
  ap.add_argument("--max-interpret-s", type=float, default=60.0)
  args = ap.parse_args(argv)
  check_flags(ap, args, positive=("lengths", "block", "batch", "heads", "kv-heads", "head-dim",
                                  "block-q", "block-k", "repeats"), nonnegative=("prompt",))
  check_lengths(ap, args)
  if args.heads % args.kv_heads:
    ap.error(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")

  import jax
  import jax.numpy as jnp

  from dllm_rl.kernels import staircase as sc

  backend = jax.default_backend()
  for impl in args.impl:
    check_pallas_backend(ap, impl, backend)
  kernels = list(dict.fromkeys(_kernel_impl(impl, backend) for impl in args.impl))
  interpret = "interpret" in kernels
  tiles = {}
  for impl in kernels:
    bq, bk = kernel_tiles(impl)
    tiles[impl] = args.block_q or bq, args.block_k or bk
  bq, bk = tiles[kernels[0]]
  dtype = jnp.dtype(args.dtype if args.dtype != "auto" else
                    ("float32" if backend == "cpu" else "bfloat16"))
  repeats = args.repeats or (1 if interpret else 20)
  ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  b, p, bs, h, kh, qd = (args.batch, args.prompt, args.block, args.heads, args.kv_heads,
                         args.head_dim)
  print(f"jax {jax.__version__}, backend {backend} ({jax.devices()[0].device_kind}); "
        f"B={b} P={p} block={bs} H={h} K={kh} Q={qd} "
        f"{dtype.name}; tiles {bq}×{bk} (the skip fractions'); kernels {', '.join(kernels)}"
        f"{' (INTERPRET mode on CPU: times are not kernel speed)' if interpret else ''}")
  print(f"{'L':>6} {'N':>6}  {'method':<24} {'fwd ms':>10} {'fwd+bwd ms':>11} "
        f"{'temp fwd':>11} {'temp f+b':>11} {'compile s':>11} {'max|err|':>9}")

  prev = {}  # impl -> (interpret wall seconds, ~visited tile pairs) of the last length
  for l in args.lengths:
    n = p + 2 * l
    skip = sc.tile_skip_fraction(p, l, bs, bq, bk)
    visited = (1 - skip) * n * n / (bq * bk)  # interpret time scales with it
    print(f"{l:>6} {n:>6}  tiles skipped {skip:.3f}; mask allows {_mask_density(p, l, bs):.3f}"
          " of (query, key) pairs")
    ks = jax.random.split(jax.random.key(l), 4)
    q = jax.random.normal(ks[0], (b, n, h, qd), dtype)
    k = jax.random.normal(ks[1], (b, n, kh, qd), dtype)
    v = jax.random.normal(ks[2], (b, n, kh, qd), dtype)
    cot = jax.random.normal(ks[3], (b, n, h, qd), dtype)

    kw = dict(prompt_len=p, block_size=bs)
    fits = backend != "cpu" or 6 * b * h * n * n * 4 <= ram / 2
    try:  # the error yardstick: the dense reference in float32 on the same inputs
      ref = sc.staircase_attention_reference(
          *(x.astype(jnp.float32) for x in (q, k, v)), **kw) if fits else None
    except Exception as err:  # noqa: BLE001 - e.g. out of device memory at long lengths
      print(f"{'':>14}float32 reference failed ({type(err).__name__}): max|err| is n/a")
      ref = None

    def runs():
      for impl in kernels:
        yield f"kernel [{impl}]", impl, lambda q, k, v, impl=impl: sc.staircase_attention(
            q, k, v, impl=impl, block_q=tiles[impl][0], block_k=tiles[impl][1], **kw)
      yield "reference (dense mask)", None, lambda q, k, v: sc.staircase_attention(
          q, k, v, impl="reference", **kw)
      if backend != "cpu":
        mask = jnp.asarray(sc.staircase_mask(p, l, bs))[None, None]
        yield "dot_product_attention", None, lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, mask=mask)

    for name, impl, attn in runs():
      if impl == "interpret" and impl in prev:
        predicted = prev[impl][0] * visited / prev[impl][1]
        if predicted > args.max_interpret_s:
          print(f"{'':>14}{name:<24} skipped: ~{predicted:.0f} s predicted in interpret "
                f"mode (> {args.max_interpret_s:.0f} s)")
          continue
      if impl is None and not fits:
        print(f"{'':>14}{name:<24} skipped: dense [B, H, N, N] scores too big for RAM")
        continue
      loss = lambda q, k, v, attn=attn, cot=cot: jnp.sum(attn(q, k, v).astype(jnp.float32) * cot)
      t0 = time.perf_counter()
      try:  # one method failing (not built, out of memory) must not lose the others
        t_f, m_f, c_f, out = measure(attn, (q, k, v), repeats)
        t_b, m_b, c_b, _ = measure(jax.grad(loss, argnums=(0, 1, 2)), (q, k, v), repeats)
        err = _max_error(out, ref)
      except Exception as e:  # noqa: BLE001 - printed, and the next method runs
        print(f"{'':>14}{name:<24} FAILED {type(e).__name__}: {str(e)[:300]}")
        continue
      if impl == "interpret":
        prev[impl] = (time.perf_counter() - t0, visited)
      print(f"{'':>14}{name:<24} {1e3 * t_f:>10.2f} {1e3 * t_b:>11.2f} "
            f"{fmt_mem(m_f):>11} {fmt_mem(m_b):>11} {f'{c_f:.1f}/{c_b:.1f}':>11} {err:>9}")
    del q, k, v, cot, ref


if __name__ == "__main__":
  main(sys.argv[1:])
