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


def test_clipped_objective_equals_the_min_and_stays_finite_where_the_ratio_overflows():
  eps = 0.2
  log_ratio = _rand(7, (4, 6), 1.0)
  adv = _rand(8, (4, 6)).at[0, 0].set(0.0)
  ratio = jnp.exp(log_ratio)
  by_min = lambda x: jnp.minimum(jnp.exp(x) * adv, jnp.clip(jnp.exp(x), 1 - eps, 1 + eps) * adv)
  np.testing.assert_allclose(losses.clipped_objective(log_ratio, adv, eps), by_min(log_ratio),
                             rtol=1e-6)
  np.testing.assert_allclose(jax.grad(lambda x: losses.clipped_objective(x, adv, eps).sum())(
      log_ratio), jax.grad(lambda x: by_min(x).sum())(log_ratio), rtol=1e-6)
  assert bool(jnp.any(losses.grpo_clipped(ratio, adv, eps)))  # both branches are exercised
  # log ρ̂ = 100 overflows float32. A > 0: clipped, gradient 0 (the min's is 0 · ∞ = NaN).
  # A < 0: the bypass, an unbounded weight: +∞ as the method's own gradient says.
  logp, logp_old = jnp.array([[100.0, 0.0], [100.0, 0.0]]), jnp.zeros((2, 2))
  adv = jnp.array([[1.0, -1.0], [-1.0, 1.0]])
  grad = jax.grad(losses.grpo)(logp, logp_old, adv, eps)
  np.testing.assert_allclose(grad, [[0.0, 0.25], [np.inf, -0.25]])
  grad = jax.grad(losses.espo)(logp[:1] * 4, logp_old[:1], adv[:1], 2, eps)  # Δℓ̂ / L = 200
  np.testing.assert_allclose(grad, [[0.0, 0.25]])
  token, token_old = logp[:1, :, None], logp_old[:1, :, None]
  grad = jax.grad(losses.grpo_token_level)(token, token_old, adv[:1, :, None],
                                           jnp.ones((1, 2, 1), bool), eps)
  np.testing.assert_allclose(grad, [[[0.0], [0.5]]])


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
  np.testing.assert_allclose(losses.kl_penalty(logp, ref, "k3"), (np.exp(-1) + 1 - 1) / 2,
                             rtol=1e-6)
  with pytest.raises(ValueError, match="k4"):
    losses.kl_penalty(logp, ref, "k4")


def _lik(token_BGL, eubo_BGL=None):
  from dllm_rl.diffusion.estimators import Likelihood
  extra = {} if eubo_BGL is None else {"eubo_token_BL": eubo_BGL, "eubo_B": eubo_BGL.sum(-1)}
  return Likelihood(token_BL=token_BGL, seq_B=token_BGL.sum(-1),
                    entropy_B=jnp.zeros(token_BGL.shape[:2]), extra=extra)


def _stabledrl_numpy(elbo, eubo, old_seq, adv, mask, omega, C=5.0):
  """The official spg_snis loss per group: −Σ_i w_i Σ_k A_ik ℓ̂^SPG_ik,
  w = softmax(min(log ρ̂, log C)) with log ρ̂ from the ELBO; ℓ̂^SPG = ELBO if A > 0 else
  ω·EUBO + (1 − ω)·ELBO; mean over groups."""
  elbo, eubo, adv = (np.asarray(x, np.float64) for x in (elbo, eubo, adv))
  log_rho = np.minimum(np.where(mask, elbo, 0).sum(-1) - old_seq, np.log(C))
  w = np.exp(log_rho - log_rho.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  surr = np.where(adv > 0, elbo, omega * eubo + (1 - omega) * elbo)
  return -(w * np.where(mask, adv * surr, 0).sum(-1)).sum(-1).mean()


def test_stabledrl_with_an_eubo_uses_the_spg_surrogate():
  b, g, l = 3, 4, 5
  mask = np.asarray(jax.random.bernoulli(jax.random.key(14), 0.8, (b, g, l)))
  # estimator outputs are 0 off the action (Likelihood invariant)
  elbo = jnp.where(mask, -jnp.abs(_rand(10, (b, g, l))), 0.0)
  eubo = jnp.where(mask, -jnp.abs(_rand(11, (b, g, l))), 0.0)
  old = np.asarray(elbo.sum(-1)) + np.asarray(_rand(12, (b, g), 0.5))
  adv = _rand(13, (b, g, l))
  old_lik = _lik(jnp.asarray(old)[..., None] * jnp.ones((1, 1, l)) / l)
  fn = losses.LOSSES.get("stabledrl")
  for omega in (0.5, 0.0, 1.0):
    cfg = losses.LossConfig(spg_omega=omega)
    loss, _ = fn(_lik(elbo, eubo), old_lik, adv, mask, None, cfg)
    assert float(loss) == pytest.approx(_stabledrl_numpy(elbo, eubo, old, adv, mask, omega),
                                        rel=1e-5)
  # ω = 0 is the ELBO-only loss (an estimator without an EUBO), in value and gradient
  cfg0 = losses.LossConfig(spg_omega=0.0)
  with_eubo = lambda e: fn(_lik(e, eubo), old_lik, adv, mask, None, cfg0)[0]
  elbo_only = lambda e: fn(_lik(e), old_lik, adv, mask, None, cfg0)[0]
  assert float(with_eubo(elbo)) == pytest.approx(float(elbo_only(elbo)), rel=1e-6)
  np.testing.assert_allclose(jax.grad(with_eubo)(elbo), jax.grad(elbo_only)(elbo), rtol=1e-6)
  # the EUBO receives gradient exactly where A ≤ 0 (and the token is an action)
  g_eubo = jax.grad(lambda u: fn(_lik(elbo, u), old_lik, adv, mask, None,
                                 losses.LossConfig())[0])(eubo)
  np.testing.assert_array_equal(np.asarray(g_eubo) != 0, (np.asarray(adv) <= 0) & mask)


def test_grpo_clip_fraction_counts_only_clips_that_take_effect():
  """A > 0 with ρ̂ > 1 + ε is clipped; A < 0 with ρ̂ > 1 + ε is the bypass, not a clip."""
  b, g, l = 1, 4, 3
  log_ratio = jnp.log(jnp.array([[2.0, 2.0, 0.5, 0.5]]))
  adv = jnp.broadcast_to(jnp.array([[1.0, -1.0, 1.0, -1.0]])[..., None], (b, g, l))
  mask = jnp.ones((b, g, l), bool)
  old = _lik(jnp.zeros((b, g, l)))
  new = _lik(jnp.broadcast_to(log_ratio[..., None] / l, (b, g, l)))
  for name in ("grpo", "grpo_token"):
    new_ = new if name == "grpo" else _lik(jnp.broadcast_to(log_ratio[..., None], (b, g, l)))
    _, m = losses.LOSSES.get(name)(new_, old, adv, mask, None, losses.LossConfig(eps=0.2))
    assert float(m["clip_fraction"]) == pytest.approx(0.5)  # completions 0 and 3 only
  metrics = losses.ratio_metrics(log_ratio, adv, mask, 0.2)
  assert float(metrics["bypass_fraction"]) == pytest.approx(0.25)  # completion 1


def test_espo_and_grpo_token_report_the_bypass_of_the_ratio_they_clip():
  """ESPO clips exp(Δ/L), not the sequence ratio exp(Δ); grpo_token clips each token's ratio:
  their bypass_fraction (A < 0, ratio > 1 + ε) is of that ratio, as their clip_fraction is."""
  b, g, l = 1, 4, 8
  delta = jnp.array([[2.0, 2.0, 1.0, 1.0]])  # ESPO ratios 1.28, 1.28, 1.13, 1.13
  adv = jnp.broadcast_to(jnp.array([[1.0, -1.0, 1.0, -1.0]])[..., None], (b, g, l))
  mask = jnp.ones((b, g, l), bool)
  old, new = _lik(jnp.zeros((b, g, l))), _lik(jnp.broadcast_to(delta[..., None] / l, (b, g, l)))
  _, m = losses.LOSSES.get("espo")(new, old, adv, mask, None, losses.LossConfig(eps=0.2))
  assert float(m["clip_fraction"]) == 0.25 and float(m["bypass_fraction"]) == 0.25  # 0 / 1
  assert float(losses.ratio_metrics(delta, adv, mask, 0.2)["bypass_fraction"]) == 0.5  # 1, 3
  # grpo_token: token ratios e^{±1} on the 4 + 2 action tokens of two completions
  token = jnp.zeros((b, g, l)).at[0, 1, :4].set(1.0).at[0, 3, :2].set(-1.0)
  mask2 = mask.at[0, 1, 6:].set(False)
  _, m = losses.LOSSES.get("grpo_token")(_lik(token), old, adv, mask2, None, losses.LossConfig())
  assert float(m["bypass_fraction"]) == pytest.approx(4 / 30)  # completion 1's 4 tokens
  assert float(m["clip_fraction"]) == pytest.approx(2 / 30)  # completion 3's 2 tokens


def test_kl_and_ratio_metrics_stay_finite_for_sum_reduced_log_ratios():
  logp = jnp.array([[-900.0, -5.0], [-1.0, -300.0]])
  ref = jnp.zeros_like(logp)
  kl, grad = jax.value_and_grad(lambda x: losses.kl_penalty(x, ref, "k3"))(logp)
  assert np.isfinite(float(kl)) and np.all(np.isfinite(np.asarray(grad)))
  assert float(losses.kl_penalty(jnp.array([-3.0]), jnp.zeros(1), "k3")) == pytest.approx(
      np.exp(3.0) - 3.0 - 1.0, rel=1e-6)  # exact below the linear continuation
  log_ratio = jnp.array([[500.0, -500.0, 0.0]])
  m = losses.ratio_metrics(log_ratio, jnp.ones((1, 3, 2)), jnp.ones((1, 3, 2), bool), 0.2)
  assert all(np.isfinite(float(v)) for v in m.values())
  assert float(m["log_ratio_max"]) == 500.0


# ------------------------------------------- StableDRL ablations (arXiv 2603.06743)


def test_clip_none_with_self_normalisation_gives_ratio_over_group_sum():
  log_ratio = _rand(20, (3, 6), 2.0)
  w = losses.stabledrl_weights(log_ratio, clip="none", self_normalize=True)
  rho = np.exp(np.asarray(log_ratio, np.float64))
  np.testing.assert_allclose(w, rho / rho.sum(-1, keepdims=True), rtol=1e-5)
  # No clipping: a ratio far above C keeps its full share (upper would cap it at C).
  big = jnp.array([[jnp.log(50.0), 0.0]])
  np.testing.assert_allclose(losses.stabledrl_weights(big, clip="none"), [[50 / 51, 1 / 51]],
                             rtol=1e-6)
  assert float(losses.stabledrl_weights(big, clip="upper")[0, 0]) == pytest.approx(5 / 6)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_without_self_normalisation_upper_clip_gradient_is_min_rho_c_times_a_over_gb(sign):
  b, g, c = 4, 6, 5.0
  logp, logp_old = _rand(21, (b, g), 3.0), _rand(22, (b, g), 3.0)
  adv = sign * jnp.abs(_rand(23, (b, g)))
  grad = jax.grad(losses.stabledrl)(logp, logp_old, adv, clip="upper", C=c, self_normalize=False)
  rho = np.exp(np.asarray(logp - logp_old, np.float64))
  assert (rho > c).any() and (rho < c).any()  # both sides of the clip are exercised
  np.testing.assert_allclose(grad, -np.minimum(rho, c) * np.asarray(adv) / (g * b),
                             rtol=1e-5, atol=1e-7)


def test_without_self_normalisation_symmetric_weights_are_clip_over_g():
  log_ratio = _rand(24, (2, 5), 1.0)
  w = losses.stabledrl_weights(log_ratio, clip="symmetric", eps=0.2, self_normalize=False)
  np.testing.assert_allclose(w, np.clip(np.exp(np.asarray(log_ratio)), 0.8, 1.2) / 5, rtol=1e-5)


def test_clip_none_without_self_normalisation_is_refused():
  with pytest.raises(ValueError, match="unbounded"):
    losses.stabledrl_weights(jnp.zeros((1, 2)), clip="none", self_normalize=False)


def test_registered_stabledrl_passes_the_ablation_options_through():
  from dllm_rl.diffusion.estimators import Likelihood
  b, g, l = 2, 4, 3
  token = _rand(25, (b, g, l), 1.0)
  token_old = _rand(26, (b, g, l), 1.0)
  adv = jnp.broadcast_to(_rand(27, (b, g))[..., None], (b, g, l))
  mask = jnp.ones((b, g, l), bool)
  lengths = jnp.full((b, g), float(l))
  lik_of = lambda t: Likelihood(seq_B=t.sum(-1), token_BL=t, entropy_B=jnp.zeros((b, g)),
                                extra={})
  for clip, norm in (("upper", False), ("none", True), ("symmetric", False), ("upper", True)):
    cfg = losses.LossConfig(clip=clip, self_normalize=norm)
    fn = lambda t: losses.LOSSES.get("stabledrl")(lik_of(t), lik_of(token_old), adv, mask,
                                                  lengths, cfg)[0]
    want = lambda t: losses.stabledrl(t.sum(-1), token_old.sum(-1), adv[..., 0], clip=clip,
                                      self_normalize=norm)
    np.testing.assert_allclose(jax.grad(fn)(token), jax.grad(want)(token), rtol=1e-5, atol=1e-7)
  _, metrics = losses.LOSSES.get("stabledrl")(lik_of(token), lik_of(token_old), adv, mask, lengths,
                                              losses.LossConfig(clip="none"))
  assert float(metrics["clip_fraction"]) == 0.0
