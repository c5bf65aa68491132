"""Benchmark: the MoE experts' grouped matmul, each ``model.moe_dispatch`` implementation.

    python -m dllm_rl.benchmarks.grouped_matmul [--rows 8192] [--experts 64] [--d-model 512]
        [--hidden 256] [--dispatch ragged_dot tiled mosaic_gpu] [--tiles 64 256] [--dtype float32]

One grouped matmul y[r] = x[r] @ w[expert of r] (dllm_rl.kernels.grouped_matmul) over
``--rows`` routed rows spread uniformly at random over ``--experts`` experts (sorted, as the
MoE layer sorts them). For each ``--dispatch`` prints the median time of the jitted forward and
forward+backward (gradients of x and w), the compiled temp memory (XLA memory_analysis), the
compile seconds and the max |error| of the forward against a float64 numpy product, expert by
expert, on the same inputs, relative to max |y|. ``--tiles``: the tiled dispatch again at each
of these tile sizes (rows a tile; the dispatch's own choice is ``tile_rows``), timed right
after it. LLaDA2.0-mini's layer: ``--rows 32768 --experts 256 --d-model 2048 --hidden 512
--dtype bfloat16`` (4096 tokens × top-8). A dispatch that fails (e.g. ragged_dot's dense
expansion out of memory on a GPU, ``mosaic_gpu`` off a Hopper GPU) prints its error and the
others still run. Prints measured figures only; asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import sys

import numpy as np

from dllm_rl.benchmarks.common import check_flags, description, fmt_mem, measure


def _reference(x_RD, w_EDF, sizes_E):
  """y = x @ w[expert] in numpy, one expert's contiguous rows at a time."""
  y_RF = np.zeros((x_RD.shape[0], w_EDF.shape[-1]))
  for e, (start, end) in enumerate(zip(np.cumsum(sizes_E) - sizes_E, np.cumsum(sizes_E))):
    y_RF[start:end] = x_RD[start:end] @ w_EDF[e]
  return y_RF


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m dllm_rl.benchmarks.grouped_matmul",
                               description=description(__doc__))
  ap.add_argument("--rows", type=int, default=8192)
  ap.add_argument("--experts", type=int, default=64)
  ap.add_argument("--d-model", type=int, default=512)
  ap.add_argument("--hidden", type=int, default=256)
  ap.add_argument("--dispatch", nargs="+", default=["ragged_dot", "tiled"],
                  choices=["auto", "ragged_dot", "tiled", "mosaic_gpu"])
  ap.add_argument("--tiles", type=int, nargs="*", default=[])
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)
  check_flags(ap, args, positive=("rows", "experts", "d-model", "hidden", "repeats", "tiles"))

  import jax
  import jax.numpy as jnp

  from dllm_rl.kernels import grouped_matmul as gmm

  r, e, d, f = args.rows, args.experts, args.d_model, args.hidden
  rng = np.random.default_rng(args.seed)
  sizes_E = jnp.asarray(np.bincount(rng.integers(0, e, r), minlength=e), jnp.int32)
  dtype = jnp.dtype(args.dtype)
  x = jnp.asarray(rng.normal(size=(r, d)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(e, d, f)) / np.sqrt(d), jnp.float32)
  x, w = x.astype(dtype), w.astype(dtype)
  want = _reference(np.asarray(x, np.float64), np.asarray(w, np.float64), np.asarray(sizes_E))
  flops = 2 * r * d * f
  print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}); rows {r}, experts"
        f" {e} (largest group {int(sizes_E.max())}), D {d}, F {f}, {args.dtype}; tiled: tile"
        f" {gmm.tile_rows(r, e)} rows; useful work {flops / 1e9:.2f} GFLOP forward")
  print(f"{'dispatch':>12} {'fwd ms':>9} {'fwd+bwd ms':>11} {'fwd TFLOP/s':>11} {'fwd temp':>11}"
        f" {'bwd temp':>11} {'compile s':>11} {'rel err':>9}")
  tiles = [(f"tiled[{t}]", functools.partial(gmm.tiled_matmul, sizes_E=sizes_E, tile=t))
           for t in args.tiles]
  runs = []  # the --tiles runs right after "tiled" (at the end without it)
  for name in args.dispatch:
    runs.append((name, functools.partial(gmm.grouped_matmul, sizes_E=sizes_E, dispatch=name)))
    runs += tiles if name == "tiled" else []
  runs += [] if "tiled" in args.dispatch else tiles
  for name, fwd in runs:
    loss = lambda x, w, fwd=fwd: jnp.sum(fwd(x, w).astype(jnp.float32) ** 2)
    try:
      t_f, m_f, c_f, y = measure(fwd, (x, w), args.repeats)
      t_b, m_b, c_b, _ = measure(jax.grad(loss, argnums=(0, 1)), (x, w), args.repeats)
      got = np.asarray(y, np.float32)
      err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    except Exception as exc:  # noqa: BLE001 - one dispatch failing (OOM) must not end the rest
      print(f"{name:>12} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
      continue
    print(f"{name:>12} {t_f * 1e3:>9.2f} {t_b * 1e3:>11.2f} {flops / t_f / 1e12:>11.3f}"
          f" {fmt_mem(m_f):>11} {fmt_mem(m_b):>11} {f'{c_f:.1f}/{c_b:.1f}':>11} {err:>9.1e}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
