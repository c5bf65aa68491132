"""Hand-computed values of policy-loss normalisers and thresholds that the identity tests in
test_losses.py leave free: the d1 token loss and the token KL divide by the number of action
tokens (not the padded size), and the bypass threshold is ρ̂ > 1 + ε, i.e.
log ρ̂ > log(1 + ε)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.rl import losses

# One prompt, two completions of 3 and 1 action tokens in L = 4 positions.
_MASK = jnp.array([[[True, True, True, False], [True, False, False, False]]])


def test_grpo_token_level_divides_by_the_number_of_action_tokens():
  adv = jnp.broadcast_to(jnp.array([[2.0, 1.0]])[..., None], _MASK.shape)
  zeros = jnp.zeros(_MASK.shape)  # ρ̂ = 1 on every token: inside the trust region
  loss, grad = jax.jit(jax.value_and_grad(losses.grpo_token_level))(zeros, zeros, adv, _MASK,
                                                                    0.2)
  assert float(loss) == pytest.approx(-(3 * 2.0 + 1 * 1.0) / 4)  # Σ tokens / Σ lengths
  np.testing.assert_allclose(grad, np.where(_MASK, -np.asarray(adv) / 4, 0.0), rtol=1e-6)


def test_token_kl_is_the_mean_over_action_tokens():
  logp = jnp.zeros(_MASK.shape)
  ref = jnp.full(_MASK.shape, -1.0)  # d = −1 on every token; padding holds the same value
  for kind, per_token in (("k1", 1.0), ("k2", 0.5), ("k3", np.exp(-1.0))):
    kl = losses.kl_penalty_tokens(logp, ref, _MASK, kind)
    assert float(kl) == pytest.approx(per_token, rel=1e-6), kind


def test_bypass_threshold_is_one_plus_eps_on_the_ratio_not_eps_on_its_log():
  eps = 0.2
  # log ρ̂ = 0.19: ρ̂ = 1.209 > 1 + ε (bypassed), although log ρ̂ < ε.
  log_ratio = jnp.array([[0.19, 0.17]])  # ρ̂ = 1.209, 1.185
  adv = jnp.full((1, 2, 1), -1.0)
  m = jax.jit(losses.ratio_metrics, static_argnums=3)(log_ratio, adv, jnp.ones((1, 2, 1), bool),
                                                      eps)
  assert float(m["bypass_fraction"]) == pytest.approx(0.5)
  bypassed = losses.grpo_bypassed(jnp.exp(log_ratio), adv[..., 0], eps)
  np.testing.assert_array_equal(bypassed, [[True, False]])
