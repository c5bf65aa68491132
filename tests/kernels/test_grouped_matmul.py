"""The experts' grouped matmuls (dllm_rl.kernels.grouped_matmul): the tiled dispatch against
XLA's ragged dot (values and gradients, empty groups, rows past Σ sizes), its memory
(rows, not experts × rows), and which one ``auto`` picks for each target platform."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.kernels import grouped_matmul as gmm


def _problem(r, d, f, sizes, seed=0):
  rng = np.random.default_rng(seed)
  e = len(sizes)
  x = jnp.asarray(rng.normal(size=(r, d)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(e, d, f)), jnp.float32)
  ct = jnp.asarray(rng.normal(size=(r, f)), jnp.float32)
  return x, w, jnp.asarray(sizes, jnp.int32), ct


def _value_and_grads(fn, x, w, ct):
  loss = lambda x, w: jnp.sum(fn(x, w) * ct)
  return jax.jit(lambda x, w: (fn(x, w), *jax.grad(loss, argnums=(0, 1))(x, w)))(x, w)


def _reference(x, w, sizes):
  """Row by row in numpy: x[r] @ w[group of r], 0 past Σ sizes."""
  ends = np.cumsum(np.asarray(sizes))
  y = np.zeros((x.shape[0], w.shape[-1]), np.float64)
  for r in range(min(int(ends[-1]), x.shape[0])):
    y[r] = np.asarray(x[r], np.float64) @ np.asarray(w[np.searchsorted(ends, r, "right")])
  return y


CASES = [  # rows, D, F, group sizes (empty groups, rows past Σ sizes: experts held elsewhere)
    (64, 16, 24, (10, 0, 30, 20)),
    (300, 32, 8, (0, 41, 37, 0, 90, 3, 60, 52)),
    (5, 8, 8, (0, 0, 5)),
    (40, 8, 16, (0, 0, 0, 0)),  # no row routed here
    (0, 8, 8, (0,)),  # no row at all
]


@pytest.mark.parametrize("tile,chunk", [(None, None), (8, 1), (8, 3), (16, 2)])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"r{c[0]}e{len(c[3])}")
def test_tiled_matches_the_ragged_dot_values_and_gradients(case, tile, chunk):
  """The tiled dispatch is ``ragged_dot`` (same values, same x and w gradients) whatever the
  tile and chunk sizes; rows past Σ sizes give 0 and get no gradient."""
  r, d, f, sizes = case
  x, w, sizes_E, ct = _problem(r, d, f, sizes)
  want = _value_and_grads(lambda x, w: gmm.grouped_matmul(x, w, sizes_E, "ragged_dot"), x, w, ct)
  got = _value_and_grads(lambda x, w: gmm.tiled_matmul(x, w, sizes_E, tile, chunk), x, w, ct)
  np.testing.assert_allclose(got[0], _reference(x, w, sizes), rtol=1e-5, atol=1e-4)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
  routed = sum(sizes)
  assert not np.any(np.asarray(got[0])[routed:]) and not np.any(np.asarray(got[1])[routed:])


def test_bfloat16_stays_bfloat16_and_close():
  x, w, sizes_E, ct = _problem(96, 32, 16, (20, 30, 0, 40))
  xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
  y = jax.jit(gmm.tiled_matmul)(xb, wb, sizes_E)
  assert y.dtype == jnp.bfloat16
  ref = _reference(xb.astype(jnp.float32), wb.astype(jnp.float32), (20, 30, 0, 40))
  np.testing.assert_allclose(np.asarray(y, np.float32), ref, rtol=2e-2, atol=2e-1)


def _temp_bytes(fn, *args):
  return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_tiled_memory_scales_with_rows_not_experts_times_rows():
  """64 experts, 2048 rows: ragged_dot's dense expansion (this CPU's, and XLA GPU's) holds
  [E, R, ·] buffers; the tiled dispatch one copy of the padded rows, one output and one chunk
  of gathered weights (here under a fifth: 4.2 MB against 34.6 MB)."""
  r, d, f, e = 2048, 64, 64, 64
  x, w, _, _ = _problem(r, d, f, (r // e,) * e)
  sizes_E = jnp.full((e,), r // e, jnp.int32)
  dense = _temp_bytes(lambda x, w: gmm.grouped_matmul(x, w, sizes_E, "ragged_dot"), x, w)
  tiled = _temp_bytes(lambda x, w: gmm.tiled_matmul(x, w, sizes_E), x, w)
  tile = gmm.tile_rows(r, e)
  padded = (-(-r // tile) + e - 1) * tile
  assert dense >= e * r * 4  # at least one [E, R] float32 mask or product
  assert tiled <= 4 * padded * max(d, f) * 4 + (e * d * f * 4), (tiled, dense)
  assert tiled * 5 < dense, (tiled, dense)


def test_tile_rows():
  assert gmm.tile_rows(393216, 256) == gmm.TILE  # LLaDA2-mini's routed rows: full tiles
  assert gmm.tile_rows(64, 4) == 16 and gmm.tile_rows(5, 3) == 8 and gmm.tile_rows(0, 4) == 8


def _under(platform):
  device = jax.sharding.AbstractDevice(device_kind="x", num_cores=None, platform=platform)
  return jax.sharding.use_abstract_mesh(
      jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device))


@pytest.mark.parametrize("platform,want", [("tpu", "ragged_dot"), ("gpu", "tiled"),
                                           ("cuda", "tiled"), ("cpu", "tiled")])
def test_auto_picks_the_ragged_dot_only_for_tpu(platform, want):
  with _under(platform):
    assert gmm.resolve("auto") == want
    assert gmm.resolve("ragged_dot") == "ragged_dot" and gmm.resolve("tiled") == "tiled"


def test_unknown_dispatch_names_the_config_key():
  with pytest.raises(ValueError, match="model.moe_dispatch='megablox'"):
    gmm.resolve("megablox")


def test_bfloat16_weight_gradient_sums_an_experts_tiles_in_float32():
  """A bf16 expert's weight gradient summed over its 256 tiles: as close to the float32 one as
  XLA's ragged dot gets (summed in bf16, tile by tile, it was 8x further: 2.3e-2 against 2.7e-3)."""
  r, d, f, sizes = 4096, 16, 8, (2048, 2048)
  x, w, sizes_E, ct = _problem(r, d, f, sizes, seed=1)
  dw = lambda fn, dt: jax.jit(jax.grad(lambda w: jnp.sum(
      fn(x.astype(dt), w).astype(jnp.float32) * ct)))(w.astype(dt)).astype(jnp.float32)
  exact = dw(lambda x, w: gmm.tiled_matmul(x, w, sizes_E, 8), jnp.float32)
  err = lambda got: float(jnp.abs(got - exact).max() / jnp.abs(exact).max())
  ragged = err(dw(lambda x, w: gmm.grouped_matmul(x, w, sizes_E, "ragged_dot"), jnp.bfloat16))
  tiled = err(dw(lambda x, w: gmm.tiled_matmul(x, w, sizes_E, 8), jnp.bfloat16))
  print(f"bf16 dW error: tiled {tiled:.2e}, ragged_dot {ragged:.2e}")
  assert tiled <= 1.5 * ragged + 1e-3, (tiled, ragged)
