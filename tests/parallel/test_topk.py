"""dllm_rl.parallel.topk.top_k: lax.top_k's values and indices (ties to the lower index)
plain, under one or nested vmaps over any axis, and jitted; its partitioning on a GPU mesh is
checked where JAX's CUDA plugin is installed (tests/test_gpu_compile.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.parallel.topk import top_k


@pytest.fixture(scope="module")
def x():
  # halves: many ties inside each row, so the tie order is tested too
  return jnp.round(jax.random.normal(jax.random.key(0), (3, 4, 5, 40)) * 2) / 2


def _same(got, want):
  for a, b in zip(got, want):
    np.testing.assert_array_equal(a, b)
  assert got[1].dtype == want[1].dtype


@pytest.mark.parametrize("k", [1, 2, 7, 40])
def test_equals_lax_top_k_plain_and_under_vmaps(x, k):
  want = jax.lax.top_k(x, k)
  f = lambda y: top_k(y, k)
  _same(top_k(x, k), want)
  _same(jax.vmap(f)(x), want)
  _same(jax.vmap(jax.vmap(f))(x), want)
  _same(jax.jit(jax.vmap(jax.vmap(jax.vmap(f))))(x), want)  # down to one row per call
  moved = jax.jit(jax.vmap(f, in_axes=2, out_axes=2))(x)  # a middle axis mapped
  _same(moved, want)


def test_a_mapped_vector_is_plain_top_k():
  v = jnp.arange(12.0).reshape(3, 4) % 3
  _same(jax.vmap(lambda y: top_k(y, 2))(v), jax.lax.top_k(v, 2))
