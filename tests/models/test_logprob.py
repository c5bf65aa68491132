"""Chunked vocabulary log-prob / entropy with its own VJP = the plain log-softmax."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.diffusion.estimators import ESTIMATORS, EstimatorConfig
from dllm_rl.diffusion.scoring import LogitsScorer, ModelScorer
from dllm_rl.models import logprob
from dllm_rl.models import transformer as T
from dllm_rl.parallel.mesh import make_mesh
from dllm_rl.types import SequenceBatch
from tests.helpers import tiny_model

B, L, D, V = 3, 10, 8, 37


def _inputs(seed=0, dtype=jnp.float32):
  k = jax.random.split(jax.random.key(seed), 5)
  h = jax.random.normal(k[0], (B, L, D)).astype(dtype)
  w = jax.random.normal(k[1], (D, V))
  y = jax.random.randint(k[2], (B, L), 0, V)
  return h, w, y, jax.random.normal(k[3], (B, L)), jax.random.normal(k[4], (B, L))


def _objective(fn, y, cot_lp, cot_ent):
  def f(h, w):
    lp, ent = fn(h, w, y)
    return jnp.sum(lp * cot_lp) + jnp.sum(ent * cot_ent)
  return f


def _reference(h, w, y):
  logits = jnp.einsum("bld,dv->blv", h, w.astype(h.dtype), preferred_element_type=jnp.float32)
  return logprob.logp_entropy_reference(logits, y)


@pytest.mark.parametrize("chunk", [0, 3, 4, 10, 64])  # one slab, ragged, exact, L, > L
def test_values_and_gradients_equal_the_plain_log_softmax(chunk):
  h, w, y, cot_lp, cot_ent = _inputs()
  lp, ent = jax.jit(lambda h, w: logprob.logp_entropy(h, w, y, chunk))(h, w)
  lp_ref, ent_ref = _reference(h, w, y)
  np.testing.assert_allclose(lp, lp_ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ent, ent_ref, rtol=1e-5, atol=1e-5)
  assert lp.dtype == ent.dtype == jnp.float32
  f = _objective(lambda h, w, y: logprob.logp_entropy(h, w, y, chunk), y, cot_lp, cot_ent)
  grads = jax.jit(jax.grad(f, (0, 1)))(h, w)
  grads_ref = jax.grad(_objective(_reference, y, cot_lp, cot_ent), (0, 1))(h, w)
  for a, b in zip(grads, grads_ref):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_entropy_cotangent_alone_gives_the_entropy_gradient():
  h, w, y, _, cot_ent = _inputs(1)
  zero = jnp.zeros((B, L))
  g = jax.grad(_objective(lambda h, w, y: logprob.logp_entropy(h, w, y, 4), y, zero, cot_ent))(h, w)
  g_ref = jax.grad(_objective(_reference, y, zero, cot_ent))(h, w)
  np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-6)
  assert float(jnp.abs(g).max()) > 1e-3  # the entropy term is not silently dropped


def test_bf16_compute_stays_close_and_returns_param_dtype_gradients():
  h, w, y, cot_lp, cot_ent = _inputs(2, jnp.bfloat16)
  f = _objective(lambda h, w, y: logprob.logp_entropy(h, w, y, 4), y, cot_lp, cot_ent)
  dh, dw = jax.grad(f, (0, 1))(h, w)
  dh_ref, dw_ref = jax.grad(_objective(_reference, y, cot_lp, cot_ent), (0, 1))(h, w)
  assert dh.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
  np.testing.assert_allclose(dw, dw_ref, rtol=5e-2, atol=5e-2)
  np.testing.assert_allclose(dh.astype(jnp.float32), dh_ref.astype(jnp.float32), rtol=5e-2,
                             atol=5e-2)


def test_only_chunk_rows_of_logits_are_materialised():
  """The compiled gradient holds no [B, L, V] float32 array, only [B, chunk, V] slabs."""
  b, l, d, v = 4, 64, 16, 512
  h = jnp.ones((b, l, d))
  w = jnp.ones((d, v))
  y = jnp.zeros((b, l), jnp.int32)
  f = lambda h, w: logprob.logp_entropy(h, w, y, 8)[0].sum()
  hlo = jax.jit(jax.grad(f, (0, 1))).lower(h, w).compile().as_text()
  assert f"f32[{b},{l},{v}]" not in hlo and f"f32[{b},8,{v}]" in hlo
  plain = lambda h, w: _reference(h, w, y)[0].sum()
  assert f"f32[{b},{l},{v}]" in jax.jit(jax.grad(plain, (0, 1))).lower(h, w).compile().as_text()


CFG = tiny_model(vocab_size=21, n_layers=2, n_heads=4, tie_embeddings=False)


def _seqs():
  k = jax.random.split(jax.random.key(5), 2)
  valid = jnp.arange(7)[None, :] < jnp.array([[7], [4], [1], [6]])
  return SequenceBatch(jax.random.randint(k[0], (4, 5), 3, 21),
                       jnp.ones((4, 5), bool).at[0, :2].set(False),
                       jax.random.randint(k[1], (4, 7), 3, 21), valid)


@pytest.mark.parametrize("name, tied", [("mean_field", False), ("elbo", True),
                                        ("spg_block", False)])
def test_model_scorer_estimates_and_gradients_equal_full_logits(name, tied):
  import dataclasses
  graphdef, params = T.init_model(dataclasses.replace(CFG, tie_embeddings=tied), jax.random.key(0))
  cfg = EstimatorConfig(num_samples=2, spg_block_len=3, prompt_mask_prob=0.2, logits_chunk=3)
  est = ESTIMATORS.get(name)

  def seq(p, scorer_cls):
    scorer = (ModelScorer(graphdef, p, 3) if scorer_cls is ModelScorer
              else LogitsScorer(lambda *a: T.apply(graphdef, p, *a)))
    lik = est(scorer, _seqs(), jax.random.key(3), cfg, 2)
    return lik.seq_B.sum() + lik.entropy_B.sum(), lik

  (v1, lik1), g1 = jax.value_and_grad(lambda p: seq(p, ModelScorer), has_aux=True)(params)
  (v0, lik0), g0 = jax.value_and_grad(lambda p: seq(p, LogitsScorer), has_aux=True)(params)
  np.testing.assert_allclose(lik1.token_BL, lik0.token_BL, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(lik1.entropy_B, lik0.entropy_B, rtol=1e-5, atol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g0)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_sharded_chunked_log_probs_equal_one_device():
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  h, w, y, cot_lp, cot_ent = _inputs(3)
  w, y = w[:, :36], y % 36  # the vocabulary splits over tensor
  h = jnp.concatenate([h, h[:1]], axis=0)  # 4 rows: split over data × fsdp
  y = jnp.concatenate([y, y[:1]], axis=0)
  cot_lp = jnp.concatenate([cot_lp, cot_lp[:1]], axis=0)
  cot_ent = jnp.concatenate([cot_ent, cot_ent[:1]], axis=0)
  f = _objective(lambda h, w, y: logprob.logp_entropy(h, w, y, 4), y, cot_lp, cot_ent)
  from jax.sharding import NamedSharding, PartitionSpec as Pspec
  hs = jax.device_put(h, NamedSharding(mesh, Pspec(("data", "fsdp"))))
  ws = jax.device_put(w, NamedSharding(mesh, Pspec(None, "tensor")))
  got = jax.jit(jax.grad(f, (0, 1)))(hs, ws)
  want = jax.grad(f, (0, 1))(h, w)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
