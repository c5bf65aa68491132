"""Policy-loss identities: StableDRL weights, gradients, GRPO bypass, per-token forms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.rl import losses


def _rand(key, shape, scale=1.0):
  return scale * jax.random.normal(jax.random.key(key), shape, jnp.float32)


@pytest.mark.parametrize("clip", ["upper", "symmetric"])
def test_stabledrl_weights_nonnegative_and_normalised(clip):
  log_ratio = _rand(0, (5, 8), 2.0)  # ratios from ~e^-6 to e^6
  w = losses.stabledrl_weights(log_ratio, clip=clip, C=5.0, eps=0.2)
  assert np.all(np.asarray(w) >= 0)
  np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)
  if clip == "upper":  # min(ρ, C) then normalise
    c = np.minimum(np.exp(np.asarray(log_ratio, np.float64)), 5.0)
  else:
    c = np.clip(np.exp(np.asarray(log_ratio, np.float64)), 0.8, 1.2)
  np.testing.assert_allclose(w, c / c.sum(-1, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize("clip", ["upper", "symmetric"])
def test_stabledrl_gradient_is_minus_w_times_a_over_b(clip):
  b, g = 4, 6
  logp, logp_old = _rand(1, (b, g), 3.0), _rand(2, (b, g), 3.0)
  for sign in (1.0, -1.0):  # weights are unconditional: the same for A > 0 and A < 0
    adv = sign * jnp.abs(_rand(3, (b, g)))
    grad = jax.grad(losses.stabledrl)(logp, logp_old, adv, clip=clip)
    w = losses.stabledrl_weights(logp - logp_old, clip=clip)
    np.testing.assert_allclose(grad, -w * adv / b, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(-grad * b / adv, w, rtol=1e-5)


def test_stabledrl_update_is_bounded_whatever_the_ratio():
  logp_old = jnp.zeros((1, 4))
  adv = jnp.array([[1.0, -1.0, 0.5, -0.5]])
  for blow_up in (0.0, 5.0, 50.0):
    logp = logp_old.at[0, 1].set(blow_up)  # ρ̂ = e^50 on a negative-advantage sample
    grad = jax.grad(losses.stabledrl)(logp, logp_old, adv)
    assert float(jnp.abs(grad).sum()) <= float(jnp.abs(adv).max()) + 1e-6


def test_grpo_bypass_on_constructed_example():
  eps = 0.2
  logp_old = jnp.zeros((1, 2))
  logp = jnp.array([[jnp.log(3.0), jnp.log(3.0)]])  # ρ̂ = 3 ≫ 1 + ε
  adv = jnp.array([[1.0, -1.0]])
  grad = jax.grad(losses.grpo)(logp, logp_old, adv, eps)
  # A > 0: clipped, no gradient. A < 0: the unclipped term is selected, weight ρ̂ = 3.
  np.testing.assert_allclose(grad, [[0.0, 3.0 / 2]], rtol=1e-6)
  m = losses.ratio_metrics(logp - logp_old, adv[..., None], jnp.ones((1, 2, 1), bool), eps)
  assert float(m["bypass_fraction"]) == 0.5
  # StableDRL on the same example: bounded convex weights (here 1/2 each).
  np.testing.assert_allclose(jax.grad(losses.stabledrl)(logp, logp_old, adv), [[-0.5, 0.5]],
                             rtol=1e-6)


def test_grpo_matches_hand_values_inside_the_trust_region():
  logp_old = jnp.zeros((2, 3))
  logp = jnp.log(jnp.array([[1.1, 0.9, 1.0], [1.0, 1.05, 0.95]]))
  adv = jnp.array([[1.0, -1.0, 0.5], [0.2, 0.3, -0.5]])
  expected = -np.mean(np.mean(np.exp(np.asarray(logp)) * np.asarray(adv), -1))
  np.testing.assert_allclose(losses.grpo(logp, logp_old, adv), expected, rtol=1e-6)


def test_per_token_forms_reduce_to_sequence_forms_for_constant_advantages():
  b, g, l = 3, 4, 5
  token = _rand(4, (b, g, l), 0.3)
  logp_old = token.sum(-1) + _rand(5, (b, g), 0.5)
  adv = _rand(6, (b, g))
  adv_tok = jnp.broadcast_to(adv[..., None], (b, g, l))
  mask = jnp.ones((b, g, l), bool)
  seq_of = lambda t: t.sum(-1)
  for clip in ("upper", "symmetric"):
    v_tok, g_tok = jax.value_and_grad(losses.stabledrl_tokens)(token, logp_old, adv_tok, mask, clip)
    v_seq, g_seq = jax.value_and_grad(lambda t: losses.stabledrl(seq_of(t), logp_old, adv, clip))(
        token)
    np.testing.assert_allclose(v_tok, v_seq, rtol=1e-5)
    np.testing.assert_allclose(g_tok, g_seq, rtol=1e-5, atol=1e-7)
  g_tok = jax.grad(losses.grpo_tokens)(token, logp_old, adv_tok, mask, 0.2)
  g_seq = jax.grad(lambda t: losses.grpo(seq_of(t), logp_old, adv, 0.2))(token)
  np.testing.assert_allclose(g_tok, g_seq, rtol=1e-5, atol=1e-7)


def test_per_token_advantages_weight_each_token():
  token = jnp.zeros((1, 2, 3))
  adv = jnp.array([[[1.0, 2.0, 3.0], [-1.0, 0.0, 1.0]]])
  grad = jax.grad(losses.stabledrl_tokens)(token, jnp.zeros((1, 2)), adv, jnp.ones((1, 2, 3), bool))
  np.testing.assert_allclose(grad, -0.5 * adv, rtol=1e-6)  # equal weights 1/2 at ρ̂ = 1


def test_kl_estimators():
  logp, ref = jnp.array([[0.0, 1.0]]), jnp.array([[0.0, 0.0]])
  assert float(losses.kl_penalty(logp, logp)) == 0.0
  np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k1"), 0.5)
  np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k2"), 0.25)
  np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k3"), (np.exp(-1) + 1 - 1) / 2, rtol=1e-6)
  with pytest.raises(ValueError, match="k4"):
    losses.kl_penalty(logp, ref, "k4")
