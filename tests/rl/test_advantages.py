"""Advantages: paper identities (zero-sum, β → 0, binary closed form, StepRS = loop)."""

from __future__ import annotations

import decimal
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.rl import advantages as adv

BETAS = (-3.0, -0.5, 1e-8, 0.0, 0.5, 3.0, 20.0)


def _rewards(seed: int, b: int = 5, g: int = 6) -> np.ndarray:
  return np.random.default_rng(seed).uniform(0.0, 1.0, (b, g)).astype(np.float32)


def _binary(seed: int, b: int = 16, g: int = 8) -> np.ndarray:
  return (np.random.default_rng(seed).uniform(size=(b, g)) < 0.4).astype(np.float32)


def _rs_ref(r_G: np.ndarray, beta: float) -> np.ndarray:
  """(1/β)(e^{β r_i} / mean_j e^{β r_j} − 1) in float64; centered at β = 0."""
  r = np.asarray(r_G, np.float64)
  if beta == 0.0:
    return r - r.mean()
  w = np.exp(beta * (r - r.max()))
  return (w / w.mean() - 1.0) / beta


def _g(schedule: str, u: float) -> float:
  return {"linear": u, "cosine": (1 - math.cos(math.pi * u)) / 2, "step": float(u >= 0.5)}[schedule]


# ------------------------------------------------------------ grpo / centered


def test_grpo_and_centered_hand_values():
  r = np.array([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]], np.float32)
  c = np.asarray(adv.centered(r))
  np.testing.assert_array_equal(c, [[0.5, -0.5, -0.5, 0.5], [0, 0, 0, 0]])
  std = math.sqrt(4 * 0.25 / 3)  # ddof = 1
  a = 0.5 / (std + 1e-4)
  np.testing.assert_allclose(np.asarray(adv.grpo(r)), [[a, -a, -a, a], [0] * 4], rtol=1e-6)
  assert adv.grpo(r).dtype == jnp.float32


def test_constant_groups_are_exactly_zero():
  r = np.full((3, 7), 0.1, np.float32)
  for a in (adv.centered(r), adv.grpo(r), adv.risk_sensitive(r, 2.0), adv.risk_sensitive(r, 0.0)):
    np.testing.assert_array_equal(np.asarray(a), 0.0)


def test_grpo_and_centered_zero_sum():
  r = _rewards(0)
  np.testing.assert_allclose(np.asarray(adv.centered(r)).sum(-1), 0.0, atol=1e-6)
  np.testing.assert_allclose(np.asarray(adv.grpo(r)).sum(-1), 0.0, atol=1e-5)
  # grpo has unit (ddof=1) std per group up to eps
  np.testing.assert_allclose(np.asarray(adv.grpo(r, eps=0.0)).std(-1, ddof=1), 1.0, rtol=1e-5)


def test_zscore_is_tracerls_population_z_score():
  """TraceRL's ``z_score_normalize`` (configs/trajectory.py): the population std, no ε, 0 for a
  uniform group; d1's ``grpo`` (ddof = 1) is √((G − 1)/G) of it. By hand: r = (1, 0, 0, 0)
  gives (√3, −1/√3, −1/√3, −1/√3)."""
  r = _rewards(5)
  g = r.shape[-1]
  z = (r - r.mean(-1, keepdims=True)) / r.std(-1, keepdims=True)
  np.testing.assert_allclose(np.asarray(adv.zscore(r)), z, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(adv.grpo(r, eps=0.0)), math.sqrt((g - 1) / g) * z,
                             rtol=1e-5, atol=1e-6)
  third = 1 / math.sqrt(3)
  np.testing.assert_allclose(np.asarray(adv.zscore(np.array([[1.0, 0.0, 0.0, 0.0]]))),
                             [[math.sqrt(3), -third, -third, -third]], rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(adv.zscore(np.full((2, 5), 0.3))), 0.0)
  assert "zscore" in adv.ADVANTAGES.names()


def test_leave_one_out_is_the_official_rloo_baseline():
  """ESPO / DiffuCoder (``leave_one_out = True``): baseline = (Σ_group r − r_i)/(G − 1);
  by hand for r = (1, 0, 0, 1): ±2/3; zero-sum; constant groups exactly 0."""
  r = _rewards(3)
  g = r.shape[-1]
  official = r - (r.sum(-1, keepdims=True) - r) / (g - 1)
  np.testing.assert_allclose(np.asarray(adv.leave_one_out(r)), official, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(adv.leave_one_out(np.array([[1.0, 0.0, 0.0, 1.0]]))),
                             [[2 / 3, -2 / 3, -2 / 3, 2 / 3]], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(adv.leave_one_out(r)).sum(-1), 0.0, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(adv.leave_one_out(np.full((2, 5), 0.3))), 0.0)


# ------------------------------------------------------------ risk-sensitive


@pytest.mark.parametrize("beta", BETAS)
def test_risk_sensitive_zero_sum_and_reference(beta):
  r = _rewards(1)
  a = np.asarray(adv.risk_sensitive(r, beta))
  assert a.dtype == np.float32 and np.isfinite(a).all()
  np.testing.assert_allclose(a.sum(-1), 0.0, atol=1e-5)
  ref = np.stack([_rs_ref(row, beta) for row in r])
  np.testing.assert_allclose(a, ref, rtol=1e-4, atol=1e-5)


def test_risk_sensitive_to_centered_as_beta_to_zero():
  r = _rewards(2)
  c = np.asarray(adv.centered(r))
  np.testing.assert_array_equal(np.asarray(adv.risk_sensitive(r, 0.0)), c)
  for beta in (1e-4, -1e-4):
    a = np.asarray(adv.risk_sensitive(r, beta))
    assert np.linalg.norm(a - c) / np.linalg.norm(c) < 1e-4
    # and genuinely risk-sensitive, not the centered fallback
    assert np.abs(a - c).max() > 0


def test_risk_sensitive_large_beta_finite():
  r = _rewards(3)
  for beta in (50.0, -50.0, 200.0):
    a = np.asarray(adv.risk_sensitive(r, beta))
    assert np.isfinite(a).all()
    np.testing.assert_allclose(a.sum(-1), 0.0, atol=1e-5)
    assert (a >= -1 / abs(beta) - 1e-6).all() if beta > 0 else (a <= 1 / abs(beta) + 1e-6).all()
  np.testing.assert_allclose(np.asarray(adv.risk_sensitive(r, 50.0)),
                             np.stack([_rs_ref(row, 50.0) for row in r]), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("beta", (-20.0, -2.0, -1e-8, 0.0, 1e-3, 1.0, 5.0, 50.0))
def test_binary_reward_closed_form(beta):
  r = _binary(4)
  p = r.mean(-1, keepdims=True)
  want = np.asarray(adv.rs_weight(beta, p)) * (r - p)
  np.testing.assert_allclose(np.asarray(adv.risk_sensitive(r, beta)), want, rtol=1e-4, atol=1e-6)


def test_rs_weight_limits_and_formula():
  np.testing.assert_allclose(np.asarray(adv.rs_weight(0.0, 0.3)), 1.0)
  np.testing.assert_allclose(np.asarray(adv.rs_weight(1e-4, 0.3)), 1.0, atol=1e-4)
  for beta in (-4.0, -0.7, 0.7, 4.0):
    for p in (0.0, 0.25, 1.0):
      want = math.expm1(beta) / (beta * (1 + p * math.expm1(beta)))
      np.testing.assert_allclose(float(adv.rs_weight(beta, p)), want, rtol=1e-5)
  assert np.isfinite(np.asarray(adv.rs_weight(200.0, 0.5)))


def test_rs_weight_is_accurate_up_to_beta_30_in_float32():
  """At p = 0 and 1 the closed form must not cancel (β = 16 used to give 5.24e5
  instead of 5.55e5, β = 20 inf instead of 2.4e7)."""
  decimal.getcontext().prec = 50  # the float64 closed form cancels too: exact reference
  for beta in (-30.0, -20.0, -16.0, -5.0, 5.0, 16.0, 20.0, 25.0, 30.0):
    for p in (0.0, 1 / 16, 0.5, 15 / 16, 1.0):
      em = decimal.Decimal(beta).exp() - 1
      want = float(em / (decimal.Decimal(beta) * (1 + decimal.Decimal(p) * em)))
      got = float(adv.rs_weight(np.float32(beta), np.float32(p)))
      assert got == pytest.approx(want, rel=1e-5), (beta, p)
  r = _binary(24, b=16, g=16)
  r[0] = 0.0
  r[0, 0] = 1.0  # p̂ = 1/16: e^{β(1 − p̂)} is large at β = 30
  p = r.mean(-1, keepdims=True)
  for beta in (16.0, 30.0, -30.0):
    want = np.asarray(adv.rs_weight(beta, p)) * (r - p)
    got = np.asarray(adv.risk_sensitive(r, beta))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_risk_sensitive_per_completion_beta():
  r = _rewards(5)
  beta_BG = np.random.default_rng(5).uniform(-3, 3, r.shape).astype(np.float32)
  a = np.asarray(adv.risk_sensitive(r, beta_BG))
  for b in range(r.shape[0]):
    for g in range(r.shape[1]):
      assert a[b, g] == pytest.approx(_rs_ref(r[b], float(beta_BG[b, g]))[g], rel=1e-4, abs=1e-5)
  # a per-prompt β of shape [B, 1] is the row-wise scalar call
  beta_B1 = np.array([[-1.0], [0.0], [0.5], [2.0], [7.0]], np.float32)
  rows = [np.asarray(adv.risk_sensitive(r[i:i + 1], float(beta_B1[i, 0])))[0] for i in range(5)]
  np.testing.assert_allclose(np.asarray(adv.risk_sensitive(r, beta_B1)), np.stack(rows), rtol=1e-6)


def test_risk_sensitive_gradients_finite():
  r = jnp.asarray(_rewards(6))
  w = np.random.default_rng(6).normal(size=r.shape).astype(np.float32)
  loss = lambda x, bt: jnp.sum(adv.risk_sensitive(x, bt) * w)
  grads = jax.jit(jax.grad(loss, argnums=(0, 1)))
  for beta in (0.0, 1e-8, -1e-8, 1.0, 50.0, -50.0):
    g_r, g_beta = grads(r, jnp.float32(beta))
    assert np.isfinite(np.asarray(g_r)).all() and np.isfinite(float(g_beta)), beta
    if abs(beta) < 1e-6:  # gradient of the centered map: w − mean w
      np.testing.assert_allclose(np.asarray(g_r), w - w.mean(-1, keepdims=True), atol=1e-6)


def test_risk_sensitive_gradients_finite_where_exp_overflows_float32():
  """β(r − r̄) = 200 > 88: exp overflows float32 on the log-mean-exp's small branch, which
  the where discards; that branch sees e clipped, so no inf·0 = NaN reaches the gradient."""
  r = jnp.asarray(_binary(7, b=4, g=6))
  w = np.random.default_rng(7).normal(size=r.shape).astype(np.float32)
  grads = jax.jit(jax.grad(lambda x, bt: jnp.sum(adv.risk_sensitive(x, bt) * w), argnums=(0, 1)))
  for beta in (400.0, -400.0):
    g_r, g_beta = grads(r, jnp.float32(beta))
    assert np.isfinite(np.asarray(g_r)).all() and np.isfinite(float(g_beta)), beta


# ------------------------------------------------------------ schedules / progress


@pytest.mark.parametrize("schedule", adv.BETA_SCHEDULES)
def test_beta_schedule_endpoints_and_monotone(schedule):
  u = np.linspace(0, 1, 101)
  beta = np.asarray(adv.beta_schedule(u, -1.0, 3.0, schedule))
  assert beta.dtype == np.float32
  assert beta[0] == pytest.approx(-1.0) and beta[-1] == pytest.approx(3.0)
  assert (np.diff(beta) >= -1e-6).all()
  down = np.asarray(adv.beta_schedule(u, 3.0, -1.0, schedule))
  assert (np.diff(down) <= 1e-6).all()
  for x in (0.2, 0.4999, 0.5, 0.8):
    assert float(adv.beta_schedule(x, -1.0, 3.0, schedule)) == pytest.approx(
        -1.0 + 4.0 * _g(schedule, x), abs=1e-6)


def test_beta_schedule_unknown():
  with pytest.raises(ValueError, match="linear, cosine, step"):
    adv.beta_schedule(0.5, 0.0, 1.0, "exponential")
  with pytest.raises(ValueError, match="choices"):
    adv.AdvantageConfig(beta_schedule="nope")


def test_progress_from_unmask_step():
  s = np.array([[[-1, 0, 1, 2, 3, 9]]])
  u = np.asarray(adv.progress_from_unmask_step(s, 4))
  assert u.dtype == np.float32 and u.shape == s.shape
  np.testing.assert_allclose(u[0, 0], [0, 0, 1 / 3, 2 / 3, 1, 1], rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(adv.progress_from_unmask_step(s, 1)), 0.0)
  np.testing.assert_allclose(np.asarray(adv.progress_from_unmask_step(np.array([0, 1]), 2)), [0, 1])


# ------------------------------------------------------------ StepRS


def test_steprs_constant_beta_equals_risk_sensitive():
  r = _rewards(7, 3, 5)
  u = np.random.default_rng(7).uniform(size=(3, 5, 4)).astype(np.float32)
  for beta in (-2.0, 0.0, 0.7, 30.0):
    for schedule in adv.BETA_SCHEDULES:
      got = np.asarray(adv.steprs(r, u, beta, beta, schedule))
      want = np.broadcast_to(np.asarray(adv.risk_sensitive(r, beta))[..., None], got.shape)
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("schedule", adv.BETA_SCHEDULES)
def test_steprs_binary_identity_with_a_beta_per_state(schedule):
  """A = w_{β_s}(p̂)(r − p̂) token by token, β_s from each token's own state."""
  r = _binary(23, b=6, g=8)
  s = np.random.default_rng(23).integers(0, 6, size=(6, 8, 5))
  u = adv.progress_from_unmask_step(s, 6)
  got = np.asarray(adv.steprs(r, u, -1.0, 6.0, schedule))
  beta = np.asarray(adv.beta_schedule(u, -1.0, 6.0, schedule))
  p_hat = r.mean(-1)[:, None, None]
  want = (np.asarray(adv.rs_weight(beta, np.broadcast_to(p_hat, beta.shape)))
          * (r[..., None] - p_hat))
  np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6)
  assert len(np.unique(np.round(beta, 5))) >= 2  # the test really uses several β


@pytest.mark.parametrize("schedule", adv.BETA_SCHEDULES)
def test_steprs_matches_python_loop(schedule):
  b, g, length, states = 2, 4, 6, 5
  rng = np.random.default_rng(8)
  r = rng.uniform(size=(b, g)).astype(np.float32)
  r[1] = (rng.uniform(size=g) < 0.5).astype(np.float32)
  s = rng.integers(0, states, size=(b, g, length))
  u = adv.progress_from_unmask_step(s, states)
  got = np.asarray(adv.steprs(r, u, 0.0, 4.0, schedule))
  assert got.shape == (b, g, length) and got.dtype == np.float32
  for i in range(b):
    for j in range(g):
      for k in range(length):
        beta = 4.0 * _g(schedule, s[i, j, k] / (states - 1))
        assert got[i, j, k] == pytest.approx(_rs_ref(r[i], beta)[j], rel=1e-4, abs=1e-6)


def test_rms_and_mass_matched_rescale_the_whole_batch():
  b, g, length = 4, 5, 7
  rng = np.random.default_rng(9)
  r = rng.uniform(size=(b, g)).astype(np.float32)
  r[2] = 1.0  # all-equal group
  mask = rng.uniform(size=(b, g, length)) < 0.7
  mask[:, :, 0] = True
  u = rng.uniform(size=(b, g, length)).astype(np.float32)
  a = np.asarray(adv.steprs(r, u, 0.0, 5.0))
  c = np.broadcast_to(np.asarray(adv.centered(r))[..., None], a.shape)
  rms = lambda x: np.sqrt(np.mean(x ** 2))
  mass = lambda x: np.mean(np.abs(x))
  for fn, stat in ((adv.rms_matched, rms), (adv.mass_matched, mass)):
    m = np.asarray(fn(a, r, mask))
    assert np.isfinite(m).all()
    assert stat(m[mask]) == pytest.approx(stat(c[mask]), rel=1e-5)  # the batch statistic
    np.testing.assert_array_equal(m[2], 0.0)
    # one positive scale for the whole batch: the prompts' relative weights survive
    ratio = m[[0, 1, 3]] / a[[0, 1, 3]]
    np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-5)
    assert ratio.flat[0] > 0
  # advantages that are all 0 stay 0 (no NaN)
  zero = np.asarray(adv.rms_matched(np.zeros_like(a), r, mask))
  np.testing.assert_array_equal(zero, 0.0)


def test_constant_beta_control_keeps_the_prompt_weights_that_a_per_prompt_scale_cancels():
  """With binary rewards and a constant β, StepRS = w_β(p̂)(r − p̂): the control
  must keep w_β(p̂) (differ from centered) and only match the batch RMS."""
  r = _binary(21, b=12, g=8)
  r[0] = [1, 0, 0, 0, 0, 0, 0, 0]  # p̂ = 1/8
  r[1] = [1, 1, 1, 1, 1, 1, 1, 0]  # p̂ = 7/8
  mask = np.ones((12, 8, 3), bool)
  u = np.zeros((12, 8, 3), np.float32)
  cfg = adv.AdvantageConfig(beta_start=3.0, beta_end=3.0)
  got = np.asarray(adv.ADVANTAGES.get("steprs_rms_matched")(r, u, mask, cfg))
  c = np.broadcast_to(np.asarray(adv.centered(r))[..., None], got.shape)
  assert np.sqrt(np.mean(got ** 2)) == pytest.approx(np.sqrt(np.mean(c ** 2)), rel=1e-5)
  assert not np.allclose(got, c, atol=1e-3)
  # the per-prompt weights w_β(p̂) survive: prompt 0 (hard) gains over prompt 1 (easy)
  w = lambda p: math.expm1(3.0) / (3.0 * (1 + p * math.expm1(3.0)))
  gain = (got[0] / c[0]).mean() / (got[1] / c[1]).mean()
  assert gain == pytest.approx(w(1 / 8) / w(7 / 8), rel=1e-4)


def test_per_state_control_matches_each_state():
  r = _rewards(22, b=6, g=4)
  s = np.random.default_rng(22).integers(0, 4, size=(6, 4, 5))
  u = np.asarray(adv.progress_from_unmask_step(s, 4))
  mask = np.ones(s.shape, bool)
  cfg = adv.AdvantageConfig(beta_start=0.0, beta_end=4.0, control_per_state=True, num_states=4)
  got = np.asarray(adv.ADVANTAGES.get("steprs_rms_matched")(r, u, mask, cfg))
  c = np.broadcast_to(np.asarray(adv.centered(r))[..., None], got.shape)
  for state in range(4):
    sel = s == state
    assert np.sqrt(np.mean(got[sel] ** 2)) == pytest.approx(np.sqrt(np.mean(c[sel] ** 2)),
                                                            rel=1e-5)


def test_progress_per_row_counts_each_rows_own_states():
  """Threshold mode: two rows that finish at different step counts (shared step counter)."""
  steps = np.array([[[0, 0, 1, 2, 5, 5],      # states {0,1,2,5}: S = 4
                     [0, 3, 3, 3, 7, 9]]])    # states {0,3,7}, 9 is after EOS: S = 3
  action = np.array([[[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]]], bool)
  u = np.asarray(adv.progress_per_row(steps, action))
  np.testing.assert_allclose(u[0, 0], [0, 0, 1 / 3, 2 / 3, 1, 1], rtol=1e-6)
  np.testing.assert_allclose(u[0, 1], [0, 0.5, 0.5, 0.5, 1, 0], rtol=1e-6)
  never = np.asarray(adv.progress_per_row(np.array([[-1, 2, 6]]), np.ones((1, 3), bool)))
  np.testing.assert_allclose(never, [[0, 0, 1]])  # −1 (never committed) is not a state
  one = np.asarray(adv.progress_per_row(np.array([[4, 4]]), np.ones((1, 2), bool)))
  np.testing.assert_array_equal(one, 0.0)  # S = 1: u = 0


# ------------------------------------------------------------ calibration


@pytest.mark.parametrize("p_bar", (0.1, 0.3, 0.5, 0.7, 0.9))
def test_calibrated_beta_round_trip(p_bar):
  beta = adv.calibrated_beta(p_bar)
  if p_bar < 0.5:
    assert beta > 0
  elif p_bar > 0.5:
    assert beta < 0
  else:
    assert beta == 0.0
  if beta != 0.0:
    w = math.expm1(beta) / (beta * (1 + p_bar * math.expm1(beta)))
    assert w == pytest.approx(1.0, abs=1e-10)
    assert 1 / beta - 1 / math.expm1(beta) == pytest.approx(p_bar, abs=1e-10)
  assert float(adv.rs_weight(beta, p_bar)) == pytest.approx(1.0, abs=1e-5)
  assert adv.calibrated_beta(1 - p_bar) == pytest.approx(-beta, abs=1e-9)


@pytest.mark.parametrize("wrong, right", ((-1.0, 1.0), (0.0, 2.0), (0.5, 0.75)))
def test_two_valued_rewards_see_beta_times_their_spread(wrong, right):
  """Rewards wrong + s·c (c ∈ {0, 1}, s = right − wrong) at β weigh centered advantages by
  w_{sβ}(p̂): the calibrated β (for 0/1 rewards) must be divided by s (calibrated_beta)."""
  c = _binary(6)
  s = right - wrong
  r = wrong + s * c
  p = c.mean(-1, keepdims=True)
  beta = adv.calibrated_beta(0.3)  # w_β(0.3) = 1
  want = np.asarray(adv.rs_weight(beta, p)) * (r - r.mean(-1, keepdims=True))
  np.testing.assert_allclose(np.asarray(adv.risk_sensitive(r, beta / s)), want,
                             rtol=1e-4, atol=1e-6)


def test_calibrated_beta_rejects_out_of_range():
  for bad in (0.0, 1.0, -0.1, 1.5, float("nan")):
    with pytest.raises(ValueError):
      adv.calibrated_beta(bad)
  assert adv.calibrated_beta(1e-3) > 900  # p ≈ 1/β for small p


# ------------------------------------------------------------ registry


def test_registry_names():
  assert adv.ADVANTAGES.names() == sorted([
      "grpo", "centered", "leave_one_out", "risk_sensitive", "steprs", "steprs_rms_matched",
      "steprs_mass_matched", "zscore"])
  with pytest.raises(KeyError, match="steprs"):
    adv.ADVANTAGES.get("step_rs")


def test_advantage_config_from_config():
  cfg = adv.AdvantageConfig.from_config({"name": "steprs", "beta_end": 4.0,
                                         "beta_schedule": "cosine"})
  assert cfg == adv.AdvantageConfig(beta_end=4.0, beta_schedule="cosine")
  assert adv.AdvantageConfig() == adv.AdvantageConfig(1.0, 0.0, 2.0, "linear")
  with pytest.raises(ValueError, match="bogus"):
    adv.AdvantageConfig.from_config({"bogus": 1})


@pytest.mark.parametrize("name", adv.ADVANTAGES.names())
def test_registered_fns_jit_mask_and_values(name):
  b, g, length = 3, 4, 5
  rng = np.random.default_rng(10)
  r = rng.uniform(size=(b, g)).astype(np.float32)
  u = rng.uniform(size=(b, g, length)).astype(np.float32)
  mask = rng.uniform(size=(b, g, length)) < 0.8
  mask[:, :, 0] = True
  cfg = adv.AdvantageConfig(beta=1.5, beta_start=-1.0, beta_end=3.0, beta_schedule="cosine")
  fn = adv.ADVANTAGES.get(name)
  eager = np.asarray(fn(r, u, mask, cfg))
  jitted = np.asarray(jax.jit(functools.partial(fn, cfg=cfg))(r, u, mask))
  assert jitted.shape == (b, g, length) and jitted.dtype == np.float32
  np.testing.assert_allclose(jitted, eager, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(eager[~mask], 0.0)
  want = _closed_form(name, r, u, mask, cfg)
  np.testing.assert_allclose(eager, np.where(mask, want, 0.0), rtol=1e-5, atol=1e-7)


def _closed_form(name, r, u, mask, cfg):
  """The papers' formulas in float64 numpy, independent of dllm_rl.rl.advantages:
  centered (Dr. GRPO) r − r̄; zscore (TraceRL) (r − r̄)/std_{ddof=0}; leave-one-out
  r_i − mean_{j≠i} r_j; GRPO (r − r̄)/(std_{ddof=1} + 1e-4); RS-GRPO
  (1/β)(e^{βr_i}/mean_j e^{βr_j} − 1); StepRS: RS-GRPO of the token's completion at
  β(u) = β_start + (β_end − β_start)(1 − cos πu)/2; the controls rescale StepRS by one
  batch factor: sqrt(Σ_m c² / Σ_m A²) (rms) or Σ_m |c| / Σ_m |A| (mass), c = r − r̄."""
  r = np.asarray(r, np.float64)
  c = r - r.mean(-1, keepdims=True)
  if name == "centered":
    return c[..., None]
  if name == "zscore":  # TraceRL: the population std, no ε
    return (c / r.std(-1, keepdims=True))[..., None]
  if name == "leave_one_out":
    g = r.shape[-1]
    return (r - (r.sum(-1, keepdims=True) - r) / (g - 1))[..., None]
  if name == "grpo":
    return (c / (r.std(-1, ddof=1, keepdims=True) + 1e-4))[..., None]
  if name == "risk_sensitive":
    return np.stack([_rs_ref(row, cfg.beta) for row in r])[..., None]
  beta = cfg.beta_start + (cfg.beta_end - cfg.beta_start) * (1 - np.cos(np.pi * u)) / 2
  step = np.empty(u.shape)
  for b, g, l in np.ndindex(*u.shape):
    step[b, g, l] = _rs_ref(r[b], beta[b, g, l])[g]
  cm = np.broadcast_to(c[..., None], u.shape)[mask]
  if name == "steprs":
    return step
  if name == "steprs_rms_matched":
    return step * np.sqrt((cm ** 2).sum() / (step[mask] ** 2).sum())
  assert name == "steprs_mass_matched", name
  return step * np.abs(cm).sum() / np.abs(step[mask]).sum()
