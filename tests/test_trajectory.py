"""The ``trajectory`` estimator (TraceRL): each token scored in the state it was committed from."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.config import ConfigError
from dllm_rl.diffusion.estimators import ESTIMATORS, EstimatorConfig
from dllm_rl.diffusion.trajectory import num_passes
from dllm_rl.models import transformer as T
from dllm_rl.rl.step import RolloutBatch
from dllm_rl.types import SequenceBatch
from tests.helpers import (EOS, MASK, assert_rl_step_runs_and_micro_batches_agree, tiny_model,
                           tiny_run_config, trajectory_rl_step_grads)

CFG = tiny_model(vocab_size=12, init_std=0.5)
S = 6  # sampler step budget of the hand-made trajectories
EST = ESTIMATORS.get("trajectory")


@pytest.fixture(scope="module")
def logits_fn():
  graphdef, params = T.init_model(CFG, jax.random.key(0))
  return lambda *a: T.apply(graphdef, params, *a)


def _seqs():
  """Two rows: repeated steps, a step that committed nothing (1 in row 0), a position never
  committed (−1, a mask id), and positions after the action (invalid) with steps of their own."""
  prompt = jnp.array([[4, 5, 6], [7, 3, 8]])
  completion = jnp.array([[3, 9, MASK, 5, 10, 4, EOS, EOS],
                          [6, 6, 11, 3, 7, EOS, EOS, EOS]])
  valid = jnp.array([[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 0, 0]], bool)
  steps = jnp.array([[2, 0, -1, 2, 3, 5, 4, 0],
                     [1, 0, 3, 2, 5, 4, 1, 5]])
  return SequenceBatch(prompt, jnp.ones_like(prompt, bool), completion, valid, steps)


def _hand_built(logits_fn, seqs, shrink):
  """TraceRL by hand, token by token: the row's distinct recorded steps in order, grouped
  ``shrink`` at a time; a token of a group is scored where every position committed before
  the group's first step is revealed and every other completion position is a mask."""
  out = np.zeros(seqs.completion_BL.shape, np.float32)
  steps = np.asarray(seqs.unmask_step_BL)
  logits_fn = jax.jit(logits_fn)
  for b in range(steps.shape[0]):
    distinct = sorted({int(s) for s in steps[b] if s >= 0})
    for j in range(steps.shape[1]):
      if not seqs.completion_valid_BL[b, j] or steps[b, j] < 0:
        continue
      first = distinct[distinct.index(steps[b, j]) // shrink * shrink]
      revealed = (steps[b] >= 0) & (steps[b] < first)
      state = jnp.where(revealed, seqs.completion_BL[b], MASK)
      tokens = jnp.concatenate([seqs.prompt_BP[b], state])[None]
      n = tokens.shape[1]
      logits = logits_fn(tokens, jnp.arange(n)[None], jnp.ones((1, 1, n), bool))[0]
      p = seqs.prompt_BP.shape[1]
      out[b, j] = jax.nn.log_softmax(logits[p + j].astype(jnp.float32))[seqs.completion_BL[b, j]]
  return out


@pytest.mark.parametrize("shrink", [1, 2])
def test_each_token_is_scored_in_the_state_it_was_committed_from(logits_fn, shrink):
  seqs = _seqs()
  cfg = EstimatorConfig(num_states=S, trajectory_shrink=shrink, reduction="sum")
  lik = EST(logits_fn, seqs, jax.random.key(0), cfg, MASK)
  want = _hand_built(logits_fn, seqs, shrink)
  assert (want != 0).sum() == 12  # every valid committed token has a term
  np.testing.assert_allclose(lik.token_BL, want, atol=1e-5)
  np.testing.assert_allclose(lik.seq_B, want.sum(-1), atol=1e-5)
  mean = EST(logits_fn, seqs, jax.random.key(0), cfg.__class__(
      num_states=S, trajectory_shrink=shrink, reduction="mean"), MASK)
  np.testing.assert_allclose(mean.seq_B, want.sum(-1) / np.array([7, 6]), atol=1e-5)


@pytest.mark.parametrize("shrink", [1, 2])
def test_mean_divides_by_the_valid_tokens_not_the_steps_or_scored_tokens(shrink):
  """A uniform model: every scored token is −log V, so ℓ̂ = −n_scored·log V ("sum") and
  −n_scored·log V / n_valid ("mean"). Row 0 has 7 valid tokens, 6 of them committed, over 4
  distinct steps; row 1 has 6 valid tokens over 6 steps."""
  seqs = _seqs()
  uniform = lambda tokens, positions, mask: jnp.zeros(tokens.shape + (CFG.vocab_size,))
  lv = np.log(CFG.vocab_size)
  for reduction, want in (("sum", [-6 * lv, -6 * lv]), ("mean", [-6 * lv / 7, -lv])):
    cfg = EstimatorConfig(num_states=S, trajectory_shrink=shrink, reduction=reduction)
    lik = EST(uniform, seqs, jax.random.key(0), cfg, MASK)
    np.testing.assert_allclose(lik.seq_B, want, rtol=1e-6)


def test_entropy_is_the_mean_over_scored_tokens_and_never_committed_stay_masks():
  """A uniform model's entropy is log V at every scored token, so entropy_B = log V exactly
  (unscored positions count for nothing); a position never committed (step −1) is a mask in
  every state even when the completion holds a token there."""
  seqs = _seqs()
  uniform = lambda tokens, positions, mask: jnp.zeros(tokens.shape + (CFG.vocab_size,))
  cfg = EstimatorConfig(num_states=S, trajectory_shrink=1, reduction="sum")
  lik = EST(uniform, seqs, jax.random.key(0), cfg, MASK)
  np.testing.assert_allclose(lik.entropy_B, np.log(CFG.vocab_size), rtol=1e-6)
  seqs = seqs.replace(completion_BL=seqs.completion_BL.at[0, 2].set(7))
  draws = EST.draw(None, seqs, cfg, MASK)
  assert (np.asarray(draws["noisy_BL"])[:, 0, 2] == MASK).all()
  assert not np.asarray(draws["scored_BL"])[:, 0, 2].any()


@pytest.mark.parametrize("shrink,passes", [(1, 6), (2, 3), (4, 2), (6, 1), (8, 1)])
def test_one_forward_pass_per_group_of_states_and_every_token_scored_once(shrink, passes):
  seqs = _seqs()
  cfg = EstimatorConfig(num_states=S, trajectory_shrink=shrink)
  draws = EST.draw(jax.random.key(1), seqs, cfg, MASK)
  assert draws["noisy_BL"].shape[0] == num_passes(S, shrink) == passes
  scored = np.asarray(draws["scored_BL"]).sum(0)
  np.testing.assert_array_equal(scored, seqs.completion_valid_BL & (seqs.unmask_step_BL >= 0))
  assert (np.asarray(draws["noisy_BL"])[:, 0, 2] == MASK).all()  # never committed: a mask


def test_log_ratio_is_exactly_zero_at_theta_old_whatever_the_keys(logits_fn):
  seqs = _seqs()
  cfg = EstimatorConfig(num_states=S, trajectory_shrink=2)
  a = EST(logits_fn, seqs, jax.random.key(0), cfg, MASK)
  b = EST(logits_fn, seqs, jax.random.key(123), cfg, MASK)
  np.testing.assert_array_equal(a.seq_B - b.seq_B, 0.0)


def test_the_states_replay_the_sampler_step_by_step():
  """The recorded trajectory of the real sampler (static schedule and threshold mode): the
  input a token is scored in equals the sampler's tokens after the step before its own."""
  from dllm_rl.sampling.sampler import SamplerConfig, sample
  model = tiny_model(vocab_size=12, init_std=0.5)
  graphdef, params = T.init_model(model, jax.random.key(2))
  prompt = jnp.array([[4, 5, 6], [7, 3, 8]])
  for threshold in (0.0, 0.3):
    cfg = SamplerConfig(completion_len=8, steps=4, block_len=4, temperature=1.0,
                        threshold=threshold, stop_at_eos=False, record_trajectory=True)
    out = sample(graphdef, params, prompt, jnp.ones_like(prompt, bool), jax.random.key(3),
                 cfg=cfg, mask_id=MASK, eos_id=EOS)
    seqs = SequenceBatch(prompt, jnp.ones_like(prompt, bool), out.completion_BL,
                         jnp.ones_like(out.completion_BL, bool), out.unmask_step_BL)
    est = EstimatorConfig(num_states=cfg.max_steps, trajectory_shrink=1)
    draws = EST.draw(None, seqs, est, MASK)
    traj = np.asarray(out.trajectory_SBL)
    before = np.concatenate([np.full_like(traj[:1], MASK), traj], 0)  # state before step s
    steps = np.asarray(out.unmask_step_BL)
    checked = 0
    for k, b, j in zip(*np.nonzero(np.asarray(draws["scored_BL"]))):
      np.testing.assert_array_equal(draws["noisy_BL"][k, b], before[steps[b, j], b])
      checked += 1
    assert checked == (steps >= 0).sum() > 8


def _rollout(b=2, g=4, p=3, l=8):
  k = jax.random.split(jax.random.key(7), 4)
  completion = jax.random.randint(k[2], (b, g, l), 3, 12)
  completion = completion.at[0, 1, 3].set(EOS).at[1, 2, 0].set(EOS)
  steps = jnp.argsort(jax.random.uniform(k[3], (b, g, l)), -1) // 2  # 2 tokens a step
  rewards = jnp.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.5]])
  return RolloutBatch(prompt_BP=jax.random.randint(k[1], (b, p), 3, 12),
                      prompt_valid_BP=jnp.ones((b, p), bool), completion_BGL=completion,
                      unmask_step_BGL=steps, rewards_BG=rewards, correct_BG=rewards > 0.5)


def _step(loss, advantage, micro_batch, reduction="mean"):
  est = EstimatorConfig(num_states=4, trajectory_shrink=2, reduction=reduction)
  return trajectory_rl_step_grads(CFG, _rollout(), est, loss, advantage, micro_batch)


@pytest.mark.parametrize("loss,advantage,reduction", [
    ("stabledrl", "steprs", "mean"), ("grpo", "grpo", "mean"), ("grpo_token", "grpo", "sum")])
def test_runs_in_the_jitted_rl_step_micro_batched_or_not(loss, advantage, reduction):
  # exact estimate at θ = θ_old (bit-exact at the estimator level, above)
  assert_rl_step_runs_and_micro_batches_agree(_step, loss, advantage, reduction)


def test_invalid_shrink_is_a_config_error_and_block_models_validate():
  from dllm_rl.train.validate import validate
  config = tiny_run_config("rl", {"estimator.name": "trajectory",
                                  "estimator.trajectory_shrink": 0})
  with pytest.raises(ConfigError, match="estimator.trajectory_shrink"):
    validate(config)
  validate(tiny_run_config("rl", {"estimator.name": "trajectory", "model.block_size": 4,
                                  "sampler.block_len": 4}))  # tests/test_trajectory_block.py


def test_trajectory_configs_validate_and_the_tiny_form_runs_the_recipe():
  import os

  from dllm_rl.config import load_config_file
  from dllm_rl.train.validate import validate
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for name in ("trajectory", "steprs_trajectory"):
    tiny = load_config_file(os.path.join(root, "configs", f"{name}.py:tiny"))
    validate(tiny)
    assert tiny.estimator.name == "trajectory"
    full = load_config_file(os.path.join(root, "configs", f"{name}.py"))
    assert full.estimator.trajectory_shrink == 8
  assert full.rl.advantage == "steprs"
  full = load_config_file(os.path.join(root, "configs", "trajectory.py"))
  assert (full.rl.loss, full.rl.eps, full.rl.lr, full.rl.group_size, full.sampler.steps,
          full.rl.temperature) == ("grpo_token", 0.2, 1e-6, 8, 512, 0.8)


def test_the_sdar_recipe_is_tracerl_on_a_block_model_with_the_official_values():
  import os

  from dllm_rl.config import load_config_file
  from dllm_rl.diffusion.trajectory import num_passes
  from dllm_rl.train.validate import validate
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                      "trajectory_sdar.py")
  tiny = load_config_file(path + ":tiny")
  validate(tiny)
  assert (tiny.estimator.name, tiny.model.block_size, tiny.rl.loss) == ("trajectory", 4,
                                                                         "grpo_token")
  assert num_passes(tiny.sampler.steps, tiny.estimator.trajectory_shrink,
                    completion_len=tiny.data.completion_len, block_size=tiny.model.block_size) == 4
  full = load_config_file(path)  # configs/rl_sdar.yaml of Gen-Verse/dLLM-RL
  assert (full.model.block_size, full.estimator.trajectory_shrink, full.rl.eps, full.rl.lr,
          full.rl.batch_prompts, full.rl.group_size, full.rl.temperature, full.sampler.threshold,
          full.rl.steps) == (4, 1, 0.2, 1e-6, 64, 16, 1.0, 0.9, 80)
  assert full.sampler.steps == full.data.completion_len  # 4 steps per block of 4
