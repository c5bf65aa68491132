"""Staircase attention: mask rules, Pallas kernel (interpret) = dense reference in
forward and gradients, block-causal gradient structure, tile skipping, dispatch."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.kernels import staircase as sc
from tests.helpers import left_pad_valid as _left_pad_valid
from tests.helpers import staircase_inputs as _inputs

# ---------------------------------------------------------------------------
# The dense mask, row by row.

@pytest.mark.parametrize("p,l,bs", [(5, 12, 4), (8, 16, 8), (0, 8, 2), (3, 6, 3)])
@pytest.mark.parametrize("prompt_block_causal", [False, True])
def test_mask_rules(p, l, bs, prompt_block_causal):
  m = sc.staircase_mask(p, l, bs, prompt_block_causal=prompt_block_causal)
  assert m.shape == (p + 2 * l, p + 2 * l) and m.dtype == bool
  clean = lambda b: slice(p + b * bs, p + (b + 1) * bs)
  noisy = lambda b: slice(p + l + b * bs, p + l + (b + 1) * bs)
  blk = lambda x: (x + (-p % bs)) // bs  # prompt blocks aligned to the prompt's end
  for r in range(p):
    want = np.zeros(p + 2 * l, bool)
    want[:p] = [(not prompt_block_causal) or blk(c) <= blk(r) for c in range(p)]
    np.testing.assert_array_equal(m[r], want)
  def all_or_none(block, expected):
    assert block.all() if expected else not block.any()

  for b in range(l // bs):
    all_or_none(m[clean(b), :p], True)
    all_or_none(m[noisy(b), :p], True)
    for other in range(l // bs):
      all_or_none(m[clean(b), clean(other)], other <= b)
      all_or_none(m[clean(b), noisy(other)], False)
      all_or_none(m[noisy(b), clean(other)], other < b)  # never its own clean block
      all_or_none(m[noisy(b), noisy(other)], other == b)


def test_layout_errors():
  with pytest.raises(ValueError, match="multiple of block_size"):
    sc.staircase_mask(4, 10, 4)
  q, k, v, _ = _inputs(1, 4, 8, 2, 2)
  with pytest.raises(ValueError, match="impl"):
    sc.staircase_attention(q, k, v, prompt_len=4, block_size=4, impl="fast")
  with pytest.raises(ValueError, match="prompt_len"):
    sc.staircase_attention(q, k, v, prompt_len=5, block_size=4)


# ---------------------------------------------------------------------------
# Tile skipping.

@pytest.mark.parametrize("p,l,bs,bq,bk,pbc", [
    (5, 12, 4, 8, 8, False), (7, 24, 8, 16, 8, True), (0, 32, 4, 8, 16, False),
    (12, 40, 8, 8, 8, True), (3, 18, 6, 8, 8, False)])
def test_visited_tiles_are_exactly_the_unmasked_ones(p, l, bs, bq, bk, pbc):
  """The kernels' tile ranges equal the tiles where the dense mask has any True."""
  lay, front = sc._make_layout(p, l, bs, pbc, bq, bk)
  dense = np.zeros((lay.n, lay.n), bool)
  dense[:lay.n_real, :lay.n_real] = sc.staircase_mask(lay.prompt, l, bs,
                                                      prompt_block_causal=pbc)
  nq, nk = lay.n // bq, lay.n // bk
  need = dense.reshape(nq, bq, nk, bk).any(axis=(1, 3))
  fwd = np.zeros_like(need)
  for qt in range(nq):
    n1, s2, n2 = (int(x) for x in sc._kv_tiles_for_q_tile(jnp.int32(qt), lay))
    fwd[qt, :n1] = True
    fwd[qt, s2:s2 + n2] = True
  bwd = np.zeros_like(need)
  for kt in range(nk):
    s1, n1, s2, n2 = (int(x) for x in sc._q_tiles_for_kv_tile(jnp.int32(kt), lay))
    bwd[s1:s1 + n1, kt] = True
    bwd[s2:s2 + n2, kt] = True
  np.testing.assert_array_equal(fwd, need)
  np.testing.assert_array_equal(bwd, need)
  assert front == lay.prompt - p and 0 < sc.tile_skip_fraction(p, l, bs, bq, bk) < 1


def test_skip_fraction():
  # P = 0, block = tile = t, L = T·t: visited = T(T+1) of (2T)² pairs.
  assert sc.tile_skip_fraction(0, 4 * 16, 16, 16, 16) == pytest.approx(1 - 5 / 16)
  fracs = [sc.tile_skip_fraction(128, l, 32, 128, 128) for l in (256, 1024, 4096, 16384)]
  assert all(a < b for a, b in zip(fracs, fracs[1:]))
  assert 0.5 < fracs[2] < 0.75 and fracs[-1] == pytest.approx(0.75, abs=0.02)


# ---------------------------------------------------------------------------
# Kernel (Pallas interpret) vs dense reference, forward and gradients.

def _fwd_and_grads(impl, q, k, v, cot, **kw):
  def loss(q, k, v):
    o = sc.staircase_attention(q, k, v, impl=impl, **kw)
    return jnp.sum(o.astype(jnp.float32) * cot), o
  (_, o), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(
      q, k, v)
  return [o, *grads]


CASES = [  # b, p, l, bs, h, kh, dtype, pbc, left pads, bq, bk
    (2, 8, 16, 4, 2, 2, jnp.float32, False, (0, 0), 8, 8),
    (2, 5, 12, 4, 4, 2, jnp.float32, False, (0, 3), 8, 8),
    (2, 5, 12, 4, 4, 1, jnp.float32, True, (2, 5), 8, 16),  # a fully padded prompt
    (1, 7, 24, 8, 3, 1, jnp.float32, True, (2,), 16, 8),
    (2, 12, 16, 4, 4, 2, jnp.bfloat16, False, (0, 4), 8, 8),
    (1, 6, 16, 8, 2, 1, jnp.bfloat16, True, (1,), 16, 16),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"P{c[1]}L{c[2]}bs{c[3]}"
                         f"H{c[4]}K{c[5]}{jnp.dtype(c[6]).name}pbc{int(c[7])}")
def test_kernel_matches_reference(case):
  b, p, l, bs, h, kh, dtype, pbc, pads, bq, bk = case
  q, k, v, cot = _inputs(b, p, l, h, kh, dtype=dtype)
  kw = dict(prompt_len=p, block_size=bs, prompt_block_causal=pbc,
            key_valid_BN=_left_pad_valid(p + 2 * l, pads))
  got = _fwd_and_grads("interpret", q, k, v, cot, block_q=bq, block_k=bk, **kw)
  want = _fwd_and_grads("reference", q, k, v, cot, **kw)
  tol = 1e-5 if dtype == jnp.float32 else 3e-2
  for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
    assert g.dtype == dtype and g.shape == w.shape
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    assert np.isfinite(g).all(), name
    np.testing.assert_allclose(g, w, atol=tol * max(1.0, np.abs(w).max()), rtol=0,
                               err_msg=name)
  if max(pads) >= p:  # prompt rows of a fully padded prompt see no key: output 0
    assert not np.asarray(got[0], np.float32)[np.argmax(pads), :p].any()


@pytest.mark.parametrize("impl", ["reference", "interpret"])
def test_noisy_block_gradient_is_block_causal(impl):
  """d(noisy block b outputs)/d(tokens) is exactly 0 on clean blocks ≥ b and on
  the noisy tokens of other blocks, and non-zero on prompt and clean blocks < b."""
  p, l, bs, b = 6, 24, 4, 3
  q, k, v, cot = _inputs(1, p, l, 4, 2)
  rows = slice(p + l + b * bs, p + l + (b + 1) * bs)

  def loss(q, k, v):
    o = sc.staircase_attention(q, k, v, prompt_len=p, block_size=bs, impl=impl,
                               block_q=8, block_k=8)
    return jnp.sum(o[:, rows] * cot[:, rows])

  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
  per_token = sum(np.abs(np.asarray(g))[0].sum(axis=(1, 2)) for g in grads)  # [N]
  allowed = np.zeros(p + 2 * l, bool)
  allowed[:p + b * bs] = True  # prompt ∪ clean blocks < b
  allowed[rows] = True
  assert (per_token[~allowed] == 0).all()
  assert (per_token[allowed] > 0).all()


# ---------------------------------------------------------------------------
# Dispatch and jit.

def test_auto_dispatch_on_cpu_is_the_reference_and_interpret_jits():
  assert jax.default_backend() == "cpu"
  p, l, bs = 4, 8, 4
  q, k, v, _ = _inputs(2, p, l, 2, 1)
  valid = _left_pad_valid(p + 2 * l, (0, 2))
  fn = lambda q, k, v, valid, impl: sc.staircase_attention(
      q, k, v, prompt_len=p, block_size=bs, key_valid_BN=valid, impl=impl)
  assert "pallas_call" in str(jax.make_jaxpr(fn, static_argnums=4)(q, k, v, valid, "interpret"))
  for impl in ("auto", "reference"):  # training on CPU uses the dense path
    assert "pallas_call" not in str(jax.make_jaxpr(fn, static_argnums=4)(q, k, v, valid, impl))
  with pytest.raises(ValueError, match="GPU or TPU"):
    fn(q, k, v, valid, "pallas")
  jitted = jax.jit(fn, static_argnums=4)(q, k, v, valid, "interpret")
  np.testing.assert_allclose(jitted, fn(q, k, v, valid, "reference"), atol=1e-5)


def test_model_attention_dispatches_staircase_spec():
  from dllm_rl.models.layers import StaircaseSpec, attention
  p, l, bs = 4, 8, 4
  q, k, v, _ = _inputs(1, p, l, 2, 1)
  valid = _left_pad_valid(p + 2 * l, (1,))
  spec = StaircaseSpec(key_valid_BN=valid, prompt_len=p, block_size=bs, impl="interpret")
  want = sc.staircase_attention_reference(q, k, v, prompt_len=p, block_size=bs,
                                          key_valid_BN=valid)
  np.testing.assert_allclose(attention(q, k, v, spec), want, atol=1e-5)


@pytest.mark.parametrize("platform,kind,call", [
    ("tpu", "tpu", "tpu_custom_call"), ("cuda", "gpu", "__gpu$xla.gpu.triton")])
def test_kernels_lower_for_tpu_and_gpu(platform, kind, call):
  """Cross-platform lowering on CPU (Mosaic TPU / Triton): catches constructs a
  compiled backend rejects at lowering time (it cannot run or fully compile them)."""
  from jax import export
  p, l, bs, tile = 16, 64, 16, (128 if kind == "tpu" else 64)
  q, k, v, _ = _inputs(1, p, l, 4, 2, qd=64, dtype=jnp.bfloat16)
  valid = _left_pad_valid(p + 2 * l, (3,))

  def loss(q, k, v):
    o = sc._kernel_attention(q, k, v, valid, p, bs, True, kind, tile, tile)
    return jnp.sum(o.astype(jnp.float32))

  # jax 0.11 lowers Triton for the GPU of the abstract mesh (its compute capability) when the
  # process has none; jax 0.10 needs no device
  gpu = jax.sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=None, platform="gpu")
  target = (jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",),
                                                                     abstract_device=gpu))
            if kind == "gpu" else contextlib.nullcontext())
  with target:
    exported = export.export(
        jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=[platform],
        disabled_checks=[export.DisabledSafetyCheck.custom_call(call)])(q, k, v)
  assert exported.mlir_module().count(f"@{call}(") == 3  # forward, dQ, dK/dV


@pytest.mark.parametrize("how", ["gone", "deprecation_enforced"])
def test_a_gpu_without_pallas_triton_falls_back_to_the_reference(monkeypatch, how):
  """JAX 0.11 deprecates Pallas' Triton backend: where it is gone (its module does not import)
  or its deprecation is made an error (the module imports, lowering raises), ``auto`` on GPU
  runs the dense reference with a warning, and an explicit ``pallas`` is an error naming the
  key."""
  import sys

  from jax._src import deprecations
  from jax.experimental import pallas
  if how == "gone":
    monkeypatch.setitem(sys.modules, "jax.experimental.pallas.triton", None)  # import fails
    monkeypatch.delattr(pallas, "triton", raising=False)
    reason = "ModuleNotFoundError"
  else:  # as `deprecations.accelerate("jax-pallas-triton")` does on a JAX that registers it
    monkeypatch.setattr(deprecations, "is_accelerated", lambda d: d == "jax-pallas-triton")
    reason = "makes its deprecation \\('jax-pallas-triton'\\) an error"
  monkeypatch.setattr(sc, "target_platform", lambda: "gpu")
  sc.triton_missing.cache_clear()
  sc._warn_once.cache_clear()
  try:
    q, k, v, _ = _inputs(1, 5, 8, 2, 2)
    with pytest.warns(UserWarning, match=f"Triton backend is unusable \\(.*{reason}"):
      out = sc.staircase_attention(q, k, v, prompt_len=5, block_size=4)
    want = sc.staircase_attention_reference(q, k, v, prompt_len=5, block_size=4)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
    with pytest.raises(ValueError, match=r"impl='pallas' \(estimator\.attention_impl\) on GPU"):
      sc.staircase_attention(q, k, v, prompt_len=5, block_size=4, impl="pallas")
  finally:
    sc.triton_missing.cache_clear()
    sc._warn_once.cache_clear()
