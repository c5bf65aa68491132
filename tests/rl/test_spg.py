"""SPG: block-wise masks, ELBO/EUBO against the official formulas, and the loss."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from dllm_rl.diffusion.estimators import ESTIMATORS, EstimatorConfig, score_completion
from dllm_rl.diffusion.spg_block import make_spg_block, spg_block_masks, spg_bounds
from dllm_rl.models import transformer
from dllm_rl.rl.spg_loss import spg_loss, spg_loss_tokens, spg_surrogate
from dllm_rl.types import SequenceBatch
from tests.helpers import tiny_model

MASK_ID = 11
BLOCK = 4
MODEL_CFG = tiny_model()


def _batch(lengths=(12, 7, 1, 10), l=12, p=5):
  rng = np.random.default_rng(0)
  b = len(lengths)
  prompt_valid = np.ones((b, p), bool)
  prompt_valid[1, :2] = False  # left padding
  prompt_valid[-1, :1] = False
  completion_valid = np.arange(l)[None, :] < np.asarray(lengths)[:, None]
  return SequenceBatch(
      prompt_BP=jnp.asarray(rng.integers(0, 10, (b, p)), jnp.int32),
      prompt_valid_BP=jnp.asarray(prompt_valid),
      completion_BL=jnp.asarray(rng.integers(0, 11, (b, l)), jnp.int32),
      completion_valid_BL=jnp.asarray(completion_valid))


@functools.lru_cache(maxsize=None)
def _params(seed):
  """Random parameters of the tiny model (numpy-drawn: a real init is slow to compile)."""
  graphdef, shapes = transformer.abstract_model(MODEL_CFG)
  rng = np.random.default_rng(seed)
  return graphdef, jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape) * 0.5, s.dtype),
                                shapes)


def _logits_fn(params):
  graphdef, _ = _params(0)
  return lambda *a: transformer.apply(graphdef, params, *a)


@functools.lru_cache(maxsize=None)
def _masks_fn(k, p):
  return jax.jit(lambda key, seqs: spg_block_masks(key, seqs, k, BLOCK, p))


def _masks_over_keys(seqs, k, p, n_keys=64):
  fn = _masks_fn(k, p)
  ms = [fn(key, seqs) for key in jax.random.split(jax.random.key(1), n_keys)]
  return jax.tree.map(lambda *a: np.stack([np.asarray(x) for x in a]), *ms)


@functools.lru_cache(maxsize=None)
def _estimator(cfg):
  est = make_spg_block(BLOCK)
  return jax.jit(lambda params, seqs, key: est(_logits_fn(params), seqs, key, cfg, MASK_ID))


def test_mask_structure():
  seqs = _batch()
  m = _masks_over_keys(seqs, k=3, p=0.0)
  valid = np.asarray(seqs.completion_valid_BL)
  lengths = valid.sum(-1)
  blk = np.arange(12) // BLOCK
  assert not m.prompt_KBP.any()  # prompt untouched when prompt_mask_prob = 0
  seen_m = {}
  for n in range(m.block_KB.shape[0]):
    for k in range(3):
      for i in range(4):
        b, row = m.block_KB[n, k, i], m.completion_KBL[n, k, i]
        assert 0 <= b <= (lengths[i] - 1) // BLOCK
        len_b = min(BLOCK, lengths[i] - BLOCK * b)
        assert not row[blk < b].any()                      # earlier blocks clean
        assert row[blk > b].all()                          # later blocks fully masked
        assert row[~valid[i]].all()                        # after EOS: always masked
        n_in_block = (row & (blk == b) & valid[i]).sum()
        assert 1 <= n_in_block <= len_b
        seen_m.setdefault((i, len_b), set()).add(int(n_in_block))
    # Full-length sequence: the K draws take distinct blocks (a permutation).
    assert len(set(m.block_KB[n, :, 0].tolist())) == 3
  assert seen_m[(0, BLOCK)] == {1, 2, 3, 4}  # m ~ U{1..len_b} reaches both ends


def test_prompt_and_earlier_block_noise():
  seqs = _batch()
  m = _masks_over_keys(seqs, k=3, p=0.5)
  valid_p = np.asarray(seqs.prompt_valid_BP)
  assert not m.prompt_KBP[..., ~valid_p].any()  # prompt padding never masked
  assert 0.4 < m.prompt_KBP[..., valid_p].mean() < 0.6
  blk = np.arange(12) // BLOCK
  row = m.completion_KBL[..., 0, :]  # full-length sequence: [N, K, L]
  earlier = blk[None, None] < m.block_KB[..., 0][..., None]
  assert 0.35 < row[earlier].mean() < 0.65  # earlier blocks hit with p
  # The same key without noise: same blocks, same block-b and later masks.
  m0 = _masks_over_keys(seqs, k=3, p=0.0)
  np.testing.assert_array_equal(m0.block_KB, m.block_KB)
  not_earlier = ~(blk[None, None, None] < m.block_KB[..., None])
  np.testing.assert_array_equal(m0.completion_KBL & not_earlier, m.completion_KBL & not_earlier)


@jax.jit
def _score(params, seqs, prompt_BP, noisy_BL):
  return score_completion(_logits_fn(params), seqs, prompt_BP, noisy_BL)[0]


def _reference(params, seqs, key, k, p, beta):
  """Official SPG formulas in float64 numpy (p.pow(β), dezero, loss_mask)."""
  m = _masks_fn(k, p)(key, seqs)
  valid = np.asarray(seqs.completion_valid_BL)
  logps = []
  for i in range(k):
    prompt = jnp.where(m.prompt_KBP[i], MASK_ID, seqs.prompt_BP)
    noisy = jnp.where(m.completion_KBL[i], MASK_ID, seqs.completion_BL)
    logps.append(np.asarray(_score(params, seqs, prompt, noisy), np.float64))
  logp = np.stack(logps)                                      # [K, B, L]
  pert = np.asarray(m.completion_KBL) & valid[None]
  denom = np.maximum(pert.sum(-1), 1e-8)
  elbo = ((logp * pert).sum(-1) / denom).mean(0)
  t = pert.sum(-1) / valid.sum(-1)[None]
  avg = (np.exp(logp) ** beta * pert / np.maximum(t, 1e-8)[..., None]).mean(0)
  loss_mask = avg > 0
  eubo = (np.log(np.where(avg == 0, 1.0, avg)) * loss_mask).sum(-1) / loss_mask.sum(-1) / beta
  return elbo, eubo


def test_matches_official_formulas():
  k, p = 2, 0.15  # the official StableDRL K and prompt-mask probability
  seqs = _batch()
  est = _estimator(EstimatorConfig(num_samples=k, prompt_mask_prob=p, spg_beta=1.5))
  key = jax.random.key(7)
  values = []
  for seed in (0, 1):  # same key, different params: same masks, different values
    params = _params(seed)[1]
    lik = est(params, seqs, key)
    elbo, eubo = _reference(params, seqs, key, k, p, 1.5)
    np.testing.assert_allclose(lik.seq_B, elbo, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lik.extra["eubo_B"], eubo, rtol=1e-5, atol=1e-5)
    values.append(np.asarray(lik.seq_B))
  assert not np.allclose(values[0], values[1])


def test_invariants_and_determinism():
  seqs = _batch()
  est = _estimator(EstimatorConfig(num_samples=2, prompt_mask_prob=0.15, spg_beta=1.5))
  params = _params(0)[1]
  lik = est(params, seqs, jax.random.key(3))
  valid = np.asarray(seqs.completion_valid_BL)
  for name, tok, seq in [("elbo", lik.token_BL, lik.seq_B),
                         ("eubo", lik.extra["eubo_token_BL"], lik.extra["eubo_B"])]:
    assert tok.dtype == jnp.float32 and seq.dtype == jnp.float32, name
    np.testing.assert_allclose(tok.sum(-1), seq, rtol=1e-6, atol=1e-6)
    assert np.all(np.asarray(tok)[~valid] == 0), name
    assert np.isfinite(np.asarray(tok)).all(), name
  again = est(params, seqs, jax.random.key(3))
  jax.tree.map(np.testing.assert_array_equal, lik, again)
  other = est(params, seqs, jax.random.key(4))
  assert not np.allclose(lik.seq_B, other.seq_B)


def test_single_draw_identity():
  """K = 1: EUBO − ELBO = −log(t)/β ≥ 0 exactly, on the tiny model's log-probs.
  (For K ≥ 2 the official estimator is no bound draw by draw — a token masked in
  one draw of two loses log 2/β — nor provably in expectation, so that is not tested.)"""
  seqs = _batch()
  m = _masks_fn(2, 0.15)(jax.random.key(5), seqs)
  prompt = jnp.where(m.prompt_KBP[0], MASK_ID, seqs.prompt_BP)
  noisy = jnp.where(m.completion_KBL[0], MASK_ID, seqs.completion_BL)
  logp = _score(_params(0)[1], seqs, prompt, noisy)
  valid = seqs.completion_valid_BL
  scored = (m.completion_KBL[:1] & valid[None])
  elbo, eubo = spg_bounds(logp[None], scored, valid, 1.5)
  t = np.asarray(scored[0].sum(-1)) / np.asarray(valid.sum(-1))
  assert (t < 1).any()
  np.testing.assert_allclose(eubo.sum(-1) - elbo.sum(-1), -np.log(t) / 1.5, rtol=1e-5, atol=1e-5)


@dataclasses.dataclass(frozen=True)
class _CfgWithBlock(EstimatorConfig):
  spg_block_len: int = BLOCK


def test_registered_reads_block_len():
  """``spg_block`` uses cfg.spg_block_len, else 32 (> L here: one block, K = 2 > #blocks)."""
  seqs = _batch()
  fake = lambda tokens, positions, mask: 3.0 * jax.nn.one_hot((3 * tokens + positions) % 12, 12)
  reg = ESTIMATORS.get("spg_block")

  @jax.jit
  def run(key):
    args = (fake, seqs, key)
    return (reg(*args, _CfgWithBlock(num_samples=2), MASK_ID),
            make_spg_block(BLOCK)(*args, EstimatorConfig(num_samples=2), MASK_ID),
            reg(*args, EstimatorConfig(num_samples=2), MASK_ID),
            make_spg_block(32)(*args, EstimatorConfig(num_samples=2), MASK_ID),
            spg_block_masks(key, seqs, 2, 32, 0.0))

  got4, want4, got32, want32, m32 = run(jax.random.key(1))
  jax.tree.map(np.testing.assert_array_equal, got4, want4)
  jax.tree.map(np.testing.assert_array_equal, got32, want32)
  assert not np.allclose(got4.seq_B, got32.seq_B)
  valid = np.asarray(seqs.completion_valid_BL)
  assert (np.asarray(m32.block_KB) == 0).all()
  n = (np.asarray(m32.completion_KBL) & valid).sum(-1)
  assert ((1 <= n) & (n <= valid.sum(-1))).all()


def test_bounds_gradient():
  """∂/∂log p_kj of Σ_j ELBO_j + Σ_j EUBO_j: 1[j∈M_k]/(K|M_k|) + w_kj/|J| with
  w_kj = 1[j∈M_k] (p_kj^β/t_k) / Σ_k' 1[j∈M_k'] (p_k'j^β/t_k') — finite, and 0
  outside the scored set."""
  rng = np.random.default_rng(3)
  k, b, l, beta = 3, 2, 6, 1.5
  valid = np.arange(l)[None] < np.array([[6], [4]])
  scored = (rng.random((k, b, l)) < 0.4) & valid[None]
  scored[0, :, 0] = True
  scored[:, 1, 3] = False  # a valid token never scored (outside J)
  logp = -rng.random((k, b, l)) * 3
  fn = lambda x: sum(a.sum() for a in spg_bounds(x, jnp.asarray(scored), jnp.asarray(valid), beta))
  grad = np.asarray(jax.jit(jax.grad(fn))(jnp.asarray(logp, jnp.float32)))
  n = scored.sum(-1)
  t = n / valid.sum(-1)[None]
  x = np.where(scored, np.exp(logp) ** beta / t[..., None], 0.0)
  w = x / np.maximum(x.sum(0, keepdims=True), 1e-30)
  n_j = scored.any(0).sum(-1)
  want = scored / (k * np.maximum(n, 1))[..., None] + w / n_j[None, :, None]
  assert np.isfinite(grad).all()
  np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- loss

ELBO = jnp.array([[-1.0, -2.0, -3.0, -4.0], [-1.5, -0.5, -2.5, -1.0]])
EUBO = jnp.array([[-0.5, -1.0, -1.0, -2.0], [-1.0, -0.2, -2.0, -0.5]])
ADV = jnp.array([[1.0, -1.0, 0.0, 2.0], [-0.5, 0.5, -1.5, 1.5]])
LENS = jnp.array([[4.0, 2.0, 1.0, 3.0], [1.0, 1.0, 2.0, 4.0]])


def test_surrogate_and_loss_by_hand():
  surr = np.asarray(spg_surrogate(ELBO, EUBO, ADV, 0.25))
  np.testing.assert_allclose(surr[0], [-1.0, 0.25 * -1.0 + 0.75 * -2.0, 0.25 * -1.0 + 0.75 * -3.0,
                                       -4.0])  # A = 0 takes the mixture (SPG: A > 0 ⇒ ELBO)
  obj = np.asarray(ADV) * surr
  np.testing.assert_allclose(spg_loss(ELBO, EUBO, ADV, omega=0.25), -obj.mean(), rtol=1e-6)
  w = np.asarray(LENS)
  expected = -((w * obj).sum(-1) / w.sum(-1)).mean()
  np.testing.assert_allclose(spg_loss(ELBO, EUBO, ADV, omega=0.25, lengths_BG=LENS), expected,
                             rtol=1e-6)


def test_loss_gradient_weights():
  omega = 0.25
  g_elbo, g_eubo, g_adv = jax.grad(
      lambda e, u, a: spg_loss(e, u, a, omega=omega, lengths_BG=LENS), argnums=(0, 1, 2))(
          ELBO, EUBO, ADV)
  a, w = np.asarray(ADV), np.asarray(LENS)
  scale = -a * w / w.sum(-1, keepdims=True) / a.shape[0]
  pos = a > 0
  np.testing.assert_allclose(g_elbo, scale * np.where(pos, 1.0, 1 - omega), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(g_eubo, scale * np.where(pos, 0.0, omega), rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(g_adv, 0.0)  # advantages are constants


def test_token_form_matches_sequence_form():
  rng = np.random.default_rng(0)
  b, g, l = ELBO.shape + (5,)
  mask = jnp.asarray(rng.random((b, g, l)) < 0.8)
  split = jnp.asarray(rng.random((b, g, l)), jnp.float32) * mask
  split = split / split.sum(-1, keepdims=True)
  elbo_tok, eubo_tok = ELBO[..., None] * split, EUBO[..., None] * split
  adv_tok = jnp.broadcast_to(ADV[..., None], (b, g, l))
  f_tok = lambda e, u: spg_loss_tokens(e, u, adv_tok, mask, omega=0.4, lengths_BG=LENS)
  f_seq = lambda e, u: spg_loss(e.sum(-1), u.sum(-1), ADV, omega=0.4, lengths_BG=LENS)
  np.testing.assert_allclose(jax.jit(f_tok)(elbo_tok, eubo_tok), f_seq(elbo_tok, eubo_tok),
                             rtol=1e-6)
  gt, gs = jax.grad(f_tok, (0, 1))(elbo_tok, eubo_tok), jax.grad(f_seq, (0, 1))(elbo_tok, eubo_tok)
  for x, y in zip(gt, gs):
    np.testing.assert_allclose(np.where(mask, x, 0), np.where(mask, y, 0), rtol=1e-6, atol=1e-7)
  # Per-token advantages: token k's ELBO gradient is −w_g A_gk c_gk / (Σw · B).
  adv2 = jnp.asarray(rng.normal(size=(b, g, l)), jnp.float32)
  ge = jax.grad(lambda e: spg_loss_tokens(e, eubo_tok, adv2, mask, omega=0.4))(elbo_tok)
  a = np.asarray(adv2)
  want = -a * np.where(a > 0, 1.0, 0.6) / g / b * np.asarray(mask)
  np.testing.assert_allclose(ge, want, rtol=1e-5, atol=1e-7)
