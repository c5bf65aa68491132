"""The jitted RL step: 2-step smoke test per loss, actions end at EOS, noise schemes, KL,
metrics."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dllm_rl.diffusion.estimators import EstimatorConfig
from dllm_rl.models import transformer as T
from dllm_rl.rl import advantages as adv_lib
from dllm_rl.rl import losses
from dllm_rl.rl.losses import LOSSES
from dllm_rl.diffusion.spg_block import spg_block_masks
from dllm_rl.rl.step import (completion_lengths, flatten_groups, make_rl_step,
                             uniform_reward_groups)
from dllm_rl.parallel.shard import init_train_state
from tests.helpers import EOS, MASK, random_rollout_batch, rl_step_config, tiny_model

CFG = tiny_model()
B, G, P, L = 2, 4, 3, 8

ESTIMATOR_FOR = {"grpo_token": ("mean_field", EstimatorConfig(reduction="sum")),
                 "spg": ("spg_block", EstimatorConfig(num_samples=2, spg_block_len=4)),
                 "wd1": ("mean_field", EstimatorConfig(reduction="sum", prompt_mask_prob=0.15)),
                 "espo": ("elbo", EstimatorConfig(num_samples=2, coupled=True, reduction="sum"))}
# configs/coupled_grpo.py's estimator (DiffuCoder): one pair at t ∈ [0.2, 0.8] + the fully
# masked pass, per-token sums
COUPLED = ("elbo", EstimatorConfig(num_samples=2, coupled=True, t_eps=0.2, full_mask_term=True,
                                   reduction="sum"))


def _batch(seed=0):
  return random_rollout_batch(seed, B, G, P, L, vocab_size=12, unmask_period=4)


def _eos_batch(seed=0):
  """Completions whose first EOS sits at 0, 2, 5, 7 or nowhere, followed by arbitrary
  committed tokens (not an EOS fill), as a sampler without stop_at_eos leaves them."""
  batch = _batch(seed)
  first = np.array([[1, 5, 8, 2], [7, 0, 3, 5]])  # 8 = no EOS
  c = np.array(batch.completion_BGL)
  for i in range(B):
    for j in range(G):
      if first[i, j] < L:
        c[i, j, first[i, j]] = EOS
  return batch.replace(completion_BGL=jnp.asarray(c)), first


def _after_eos_changed(batch, first, seed):
  """Every token (and unmask step) after the first EOS replaced."""
  k = jax.random.split(jax.random.key(100 + seed), 2)
  after = jnp.arange(L)[None, None, :] > jnp.asarray(first)[..., None]
  tokens = jax.random.randint(k[0], (B, G, L), 0, 12)  # EOS and the mask id included
  steps = jax.random.randint(k[1], (B, G, L), 0, 4)
  return batch.replace(completion_BGL=jnp.where(after, tokens, batch.completion_BGL),
                       unmask_step_BGL=jnp.where(after, steps, batch.unmask_step_BGL))


def _step(loss, advantage="centered", kl_coef=0.0, antithetic=True, inner=2, estimator=None,
          dynamic_states=False):
  name, est_cfg = estimator or ESTIMATOR_FOR.get(loss, ("elbo", EstimatorConfig(num_samples=1)))
  if antithetic is not None:
    est_cfg = dataclasses.replace(est_cfg, antithetic=antithetic)
  cfg = rl_step_config(loss, advantage, name, est_cfg, inner_steps=inner, num_states=4,
                       dynamic_states=dynamic_states, kl_coef=kl_coef)
  graphdef, params = T.init_model(CFG, jax.random.key(0))
  opt = optax.adam(1e-2)
  state = init_train_state(params, opt, jax.random.key(1))
  if kl_coef:
    state = state.replace(ref_params=jax.tree.map(jnp.copy, params))
  return make_rl_step(graphdef, opt, lambda s: 1e-2, cfg), state


@pytest.mark.parametrize("loss", LOSSES.names())
def test_two_rl_steps_per_loss(loss):
  step_fn, state = _step(loss)
  before = jax.tree.map(np.asarray, state.params)
  for i in range(2):
    state, metrics = step_fn(state, _eos_batch(i)[0], jax.random.key(10 + i))
    for k, v in metrics.items():
      assert np.isfinite(np.asarray(v)).all(), (loss, k)
  assert int(state.step) == 4  # 2 rollout batches × μ = 2 updates
  changed = [not np.allclose(a, np.asarray(b)) for a, b in
             zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(state.params))]
  assert any(changed)
  assert float(metrics["grad_norm"]) > 0
  for key in ("reward_mean", "accuracy", "ratio_mean", "ratio_max", "ratio_std", "clip_fraction",
              "bypass_fraction", "completion_length", "entropy", "grad_norm", "loss",
              "uniform_reward_groups"):
    assert key in metrics


def test_uniform_reward_groups_counts_the_prompts_whose_rewards_are_all_equal():
  assert float(uniform_reward_groups(jnp.array([[1.0, 1.0, 1.0, 1.0],
                                                [0.0, 1.0, 0.0, 0.0]]))) == 0.5
  assert float(uniform_reward_groups(jnp.array([[-1.0, -1.0], [0.5, 0.5]]))) == 1.0  # any value


def test_a_loss_that_reports_its_own_bypass_fraction_keeps_it(monkeypatch):
  """ratio_metrics' bypass is of the sequence ratio; a loss clipping another one (ESPO's
  exp(Δ/L)) reports its own, and the step logs that one."""
  espo = LOSSES.get("espo")
  own = lambda *a: (espo(*a)[0], dict(espo(*a)[1], bypass_fraction=jnp.float32(0.375)))
  monkeypatch.setitem(LOSSES._items, "espo", own)
  step_fn, state = _step("espo", inner=1)
  _, metrics = step_fn(state, _batch(), jax.random.key(3))
  assert float(metrics["bypass_fraction"]) == 0.375



_GRPO = LOSSES.get("grpo")
BAD_LOSSES = {  # what a new loss may get wrong → the words of the step's error
    "per_sequence_loss": (lambda lik, *a: (-lik.seq_B, _GRPO(lik, *a)[1]), r"float32 scalar"),
    "bare_loss": (lambda *a: _GRPO(*a)[0], r"\(loss, metrics\) pair"),
    "bf16_loss": (lambda *a: (_GRPO(*a)[0].astype(jnp.bfloat16), _GRPO(*a)[1]), "bfloat16"),
    "no_clip_fraction": (lambda *a: (_GRPO(*a)[0], {}), "'clip_fraction'"),
}


@pytest.mark.parametrize("bad", sorted(BAD_LOSSES))
def test_a_loss_that_breaks_the_contract_is_named_when_the_step_is_traced(monkeypatch, bad):
  fn, words = BAD_LOSSES[bad]
  monkeypatch.setitem(LOSSES._items, "mine", fn)
  step_fn, state = _step("mine", inner=1)
  with pytest.raises(TypeError, match=rf"rl\.loss='mine'.*{words}"):
    jax.eval_shape(step_fn, state, _batch(), jax.random.key(3))


@pytest.mark.parametrize("bad, words", [
    (lambda r, p, m, c: adv_lib.centered(r), r"shape \(2, 4\).*\(2, 4, 8\)"),
    (lambda r, p, m, c: adv_lib.ADVANTAGES.get("centered")(r, p, m, c).astype(jnp.bfloat16),
     "bfloat16")], ids=["per_sequence", "bf16"])
def test_an_advantage_of_the_wrong_shape_or_dtype_is_named(monkeypatch, bad, words):
  monkeypatch.setitem(adv_lib.ADVANTAGES._items, "mine", bad)
  step_fn, state = _step("grpo", advantage="mine", inner=1)
  with pytest.raises(TypeError, match=rf"rl\.advantage='mine'.*{words}"):
    jax.eval_shape(step_fn, state, _batch(), jax.random.key(3))

CASES = [("stabledrl", "centered", None, False), ("grpo", "grpo", None, False),
         ("grpo_token", "centered", None, False), ("spg", "centered", None, False),
         ("stabledrl", "centered", ESTIMATOR_FOR["spg"], False),
         ("stabledrl", "steprs", None, False), ("stabledrl", "steprs_rms_matched", None, True),
         ("grpo_token", "leave_one_out", COUPLED, False), ("wd1", "centered", None, False),
         ("espo", "leave_one_out", None, False)]


def test_every_registered_loss_has_an_eos_case():
  """A registry check (README "Adding a component"): a new loss fails here until CASES holds
  it, so that the EOS test below checks it too."""
  missing = sorted(set(LOSSES.names()) - {loss for loss, *_ in CASES})
  assert not missing, (f"add a case of rl.loss {missing} to CASES in tests/rl/test_rl_step.py"
                       " (with the estimator it needs)")


@pytest.mark.parametrize("loss, advantage, estimator, dynamic", CASES)
def test_nothing_after_the_first_eos_changes_loss_gradient_or_metrics(loss, advantage, estimator,
                                                                     dynamic):
  batch, first = _eos_batch()
  results = []
  step_fn, state0 = _step(loss, advantage, antithetic=False, estimator=estimator,
                          dynamic_states=dynamic)
  for variant in (batch, _after_eos_changed(batch, first, 0), _after_eos_changed(batch, first, 1)):
    state, metrics = step_fn(jax.tree.map(jnp.copy, state0), variant, jax.random.key(7))
    results.append((jax.tree.map(np.asarray, state.params), jax.tree.map(np.asarray, metrics)))
  (p0, m0) = results[0]
  lengths = np.where(first < L, first + 1, L)
  assert float(m0["completion_length"]) == pytest.approx(lengths.mean())
  for p, m in results[1:]:
    for k in m0:
      np.testing.assert_allclose(m[k], m0[k], rtol=1e-6, atol=1e-7, err_msg=k)
    for a, b in zip(jax.tree_util.tree_leaves(p0), jax.tree_util.tree_leaves(p)):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_actions_end_at_the_first_eos():
  batch, first = _eos_batch()
  seqs = flatten_groups(batch, EOS)
  lengths = np.where(first < L, first + 1, L).reshape(-1)
  valid = np.asarray(seqs.completion_valid_BL)
  np.testing.assert_array_equal(valid.sum(-1), lengths)
  np.testing.assert_array_equal(valid, np.arange(L)[None, :] < lengths[:, None])
  np.testing.assert_array_equal(np.asarray(seqs.completion_BL)[~valid], EOS)  # canonical fill
  np.testing.assert_array_equal(completion_lengths(batch.completion_BGL, EOS),
                                lengths.reshape(B, G))
  # SPG picks blocks among ceil(len / block) and scores only action tokens
  masks = spg_block_masks(jax.random.key(0), seqs, num_samples=16, block_len=4)
  used_blocks = -(-lengths // 4)
  assert np.all(np.asarray(masks.block_KB) < used_blocks[None, :])
  scored = np.asarray(masks.completion_KBL) & valid[None]
  assert scored.any(-1).all()  # every draw scores some action token
  assert (np.asarray(masks.completion_KBL) | valid[None]).all()  # after the action: always masks


def test_official_noise_by_default_gives_a_noisy_ratio_at_the_first_inner_step():
  """EstimatorConfig() is the official setup: ℓ̂_old on its own masks, ℓ̂_θ on fresh ones."""
  assert not EstimatorConfig().antithetic
  step_fn, state = _step("stabledrl", antithetic=None)
  _, metrics = step_fn(state, _eos_batch()[0], jax.random.key(5))
  assert float(metrics["ratio_max_first"]) > 1.01


def test_ratio_is_one_before_the_first_update_with_shared_masks():
  step_fn, state = _step("stabledrl", antithetic=True)
  _, metrics = step_fn(state, _batch(), jax.random.key(5))
  assert abs(float(metrics["ratio_max_first"]) - 1.0) < 1e-5  # float rounding only
  assert float(metrics["abs_log_ratio_max_first"]) < 1e-5
  step_fn, state = _step("stabledrl", antithetic=False)
  _, metrics = step_fn(state, _batch(), jax.random.key(5))
  assert float(metrics["ratio_max_first"]) > 1.01  # independent masks: ratio noise
  q = [float(metrics[f"abs_log_ratio_{k}_first"]) for k in ("p50", "p90", "p99", "max")]
  assert 0 < q[0] <= q[1] <= q[2] <= q[3]
  assert q[3] >= float(metrics["log_ratio_max"])  # |log ρ̂| max ≥ the signed max
  assert float(metrics["abs_log_ratio_max"]) >= q[3]


def test_zero_advantages_leave_params_unchanged_with_sgd():
  """All-equal rewards → centered advantages 0 → the policy gradient is exactly 0."""
  cfg = rl_step_config("stabledrl", "centered", "elbo", EstimatorConfig(), inner_steps=1,
                       num_states=4)
  graphdef, params = T.init_model(CFG, jax.random.key(0))
  opt = optax.sgd(1.0)
  state = init_train_state(params, opt, jax.random.key(1))
  before = jax.tree.map(np.asarray, state.params)
  batch = _batch().replace(rewards_BG=jnp.ones((B, G)))
  state, metrics = make_rl_step(graphdef, opt, lambda s: 1.0, cfg)(state, batch, jax.random.key(0))
  assert float(metrics["grad_norm"]) == 0.0
  for a, b in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(state.params)):
    np.testing.assert_array_equal(a, b)


def test_kl_penalty_is_zero_at_the_reference_and_reported():
  step_fn, state = _step("stabledrl", kl_coef=0.1, inner=1)
  _, metrics = step_fn(state, _batch(), jax.random.key(3))
  assert abs(float(metrics["kl"])) < 1e-6


def _kl_step(every, alpha=0.6, inner=2):
  """grpo_token on coupled per-token ELBO sums with DiffuCoder's token-level k3 KL."""
  est = ("elbo", EstimatorConfig(num_samples=1, reduction="sum", antithetic=True))
  cfg = rl_step_config("grpo_token", "leave_one_out", *est, inner_steps=inner, num_states=4,
                       kl_coef=0.01, kl_level="token", ref_sync_every=every,
                       ref_sync_alpha=alpha)
  graphdef, params = T.init_model(CFG, jax.random.key(0))
  opt = optax.adam(1e-2)
  state = init_train_state(params, opt, jax.random.key(1))
  state = state.replace(ref_params=jax.tree.map(jnp.copy, params))
  return make_rl_step(graphdef, opt, lambda s: 1e-2, cfg), state


@pytest.mark.parametrize("every, synced", [(2, True), (4, False), (0, False)])
def test_the_reference_moves_toward_the_policy_every_n_updates(every, synced):
  """ref ← α·θ + (1 − α)·ref after update n when n is a multiple of ``ref_sync_every`` (TRL's
  SyncRefModelCallback); two updates: a sync at 2, none at 4 or with 0."""
  step_fn, state = _kl_step(every)
  ref0 = jax.tree.map(np.asarray, state.ref_params)
  state, metrics = step_fn(state, _eos_batch()[0], jax.random.key(3))
  assert int(state.step) == 2 and float(metrics["kl"]) > 0  # θ left the reference at m = 1
  params = jax.tree.map(np.asarray, state.params)
  for r0, p, r in zip(jax.tree_util.tree_leaves(ref0), jax.tree_util.tree_leaves(params),
                      jax.tree_util.tree_leaves(state.ref_params)):
    want = 0.6 * p + 0.4 * r0 if synced else r0
    np.testing.assert_allclose(np.asarray(r), want, rtol=1e-6, atol=1e-7)


def test_token_level_kl_is_the_mean_over_action_tokens_of_each_tokens_estimate():
  """DiffuCoder / TRL: per_token_kl = e^d − d − 1, d = ref − θ per token, summed over the
  completion mask and divided by its size; k1 / k2 likewise; not the sequence estimator."""
  tok = jnp.array([[[-1.0, -2.0, -3.0]]])
  ref = jnp.array([[[-1.5, -1.0, 9.0]]])
  mask = jnp.array([[[True, True, False]]])
  d = np.array([-0.5, 1.0])
  assert float(losses.kl_penalty_tokens(tok, ref, mask, "k3")) == pytest.approx(
      np.mean(np.exp(d) - d - 1), rel=1e-6)
  assert float(losses.kl_penalty_tokens(tok, ref, mask, "k1")) == pytest.approx(-d.mean())
  assert float(losses.kl_penalty_tokens(tok, ref, mask, "k2")) == pytest.approx(
      np.mean(d * d / 2))
  seq = float(losses.kl_penalty(tok.sum(-1), ref.sum(-1), "k3"))
  assert seq != pytest.approx(float(losses.kl_penalty_tokens(tok, ref, mask, "k3")))


def test_steprs_advantage_runs_in_the_step():
  step_fn, state = _step("stabledrl", advantage="steprs")
  state, metrics = step_fn(state, _batch(), jax.random.key(3))
  assert np.isfinite(float(metrics["loss"]))


def test_completion_lengths():
  c = jnp.array([[[5, 1, 1], [5, 6, 7], [1, 1, 1]]])
  np.testing.assert_array_equal(completion_lengths(c, 1), [[2, 3, 1]])


@pytest.mark.parametrize("name", ["wd1", "espo", "coupled_grpo"])
def test_one_step_of_each_baseline_recipe_is_finite(name):
  """configs/<name>.py:tiny's algorithm through the run's own step options
  (dllm_rl.train.rl_loop.step_config), one jitted update on the tiny model: finite loss
  and metrics, a nonzero gradient, and — where the official code scores θ_old on θ's
  masks (ESPO, coupled-GRPO) — a ratio of exactly 1 before the update."""
  import types
  from dllm_rl.config import recipes
  from dllm_rl.train.rl_loop import step_config
  config = recipes.recipe_config("tiny", getattr(recipes, name), None)
  cfg = dataclasses.replace(
      step_config(config, types.SimpleNamespace(max_steps=4, threshold=0.0), MASK, EOS),
      inner_steps=1)
  assert cfg.loss == config.rl.loss and cfg.estimator_cfg.antithetic == (name != "wd1")
  graphdef, params = T.init_model(CFG, jax.random.key(0))
  opt = optax.adam(1e-2)
  state = init_train_state(params, opt, jax.random.key(1))
  if cfg.kl_coef:
    state = state.replace(ref_params=jax.tree.map(jnp.copy, params))
  state, metrics = make_rl_step(graphdef, opt, lambda s: 1e-2, cfg)(state, _eos_batch()[0],
                                                                    jax.random.key(2))
  for k, v in metrics.items():
    assert np.isfinite(np.asarray(v)).all(), k
  assert float(metrics["grad_norm"]) > 0 and int(state.step) == 1
  if cfg.estimator_cfg.antithetic:
    assert abs(float(metrics["ratio_max_first"]) - 1.0) < 1e-5
