"""The device's measured matmul peak, the denominator of the benchmarks' FLOP/s and MFU."""

from __future__ import annotations

import statistics
import time


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
