"""The ``trajectory`` estimator on block-diffusion models (SDAR / TraDo, TraceRL's rl_sdar.py):
each token scored in the block sampler's state it was committed from — earlier blocks clean,
its own block partially unmasked, later blocks absent — every block's group k in one
staircase pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.diffusion.estimators import ESTIMATORS, EstimatorConfig
from dllm_rl.diffusion.trajectory import block_state_groups, num_passes, states_per_block
from dllm_rl.kernels.block_mask import block_causal_mask
from dllm_rl.models import transformer as T
from dllm_rl.rl.step import RolloutBatch, action_mask
from dllm_rl.types import SequenceBatch
from tests.helpers import (EOS, MASK, assert_rl_step_runs_and_micro_batches_agree, tiny_model,
                           tiny_run_config, trajectory_rl_step_grads)

CFG = tiny_model(vocab_size=12, n_layers=2, init_std=0.5)
BS = 4  # block size: completions of 8 tokens are 2 blocks
S = 8   # the sampler's step budget: 4 steps per block
EST = ESTIMATORS.get("trajectory")


def _cfg(shrink=1, reduction="sum", prompt_block_causal=False, num_states=S):
  return EstimatorConfig(num_states=num_states, trajectory_shrink=shrink, reduction=reduction,
                         block_size=BS, attention_impl="reference",
                         prompt_block_causal=prompt_block_causal)


@pytest.fixture(scope="module")
def model():
  graphdef, params = T.init_model(CFG, jax.random.key(0))
  return graphdef, params


def _seqs():
  """Two rows, two blocks each, global steps as the block sampler records them: repeated
  steps and a step without a commitment inside a block, a left-padded prompt, an action that
  ends in block 0 (row 1: the rest is EOS, recorded at the last step)."""
  prompt = jnp.array([[4, 5, 6], [0, 7, 3]])
  prompt_valid = jnp.array([[1, 1, 1], [0, 1, 1]], bool)
  completion = jnp.array([[3, 9, 8, 5, 10, 4, 6, 11],
                          [6, 6, EOS, EOS, EOS, EOS, EOS, EOS]])
  valid = jnp.array([[1] * 8, [1, 1, 1, 0, 0, 0, 0, 0]], bool)
  steps = jnp.array([[2, 0, 2, 3, 5, 4, 7, 5],
                     [1, 0, 3, 3, 3, 3, 3, 3]])
  return SequenceBatch(prompt, prompt_valid, completion, valid, steps)


def _hand_built(graphdef, params, seqs, shrink, prompt_block_causal):
  """TraceRL's block states by hand, one forward per token: [prompt | blocks before the
  token's block, clean | its block with the positions committed before its group's first
  step revealed, the rest masks], under the block sampler's dense block-causal mask."""
  apply = jax.jit(lambda *a: T.apply(graphdef, params, *a))
  steps = np.asarray(seqs.unmask_step_BL)
  comp = np.asarray(seqs.completion_BL)
  p = seqs.prompt_BP.shape[1]
  out = np.zeros(comp.shape, np.float32)
  for b in range(comp.shape[0]):
    pos = np.asarray(T.positions_from_valid(jnp.concatenate(
        [seqs.prompt_valid_BP[b], jnp.ones(comp.shape[1], bool)])))
    for j in range(comp.shape[1]):
      if not seqs.completion_valid_BL[b, j] or steps[b, j] < 0:
        continue
      lo = j // BS * BS
      blk = steps[b, lo:lo + BS]
      distinct = sorted({int(s) for s in blk if s >= 0})
      first = distinct[distinct.index(steps[b, j]) // shrink * shrink]
      state = np.where((blk >= 0) & (blk < first), comp[b, lo:lo + BS], MASK)
      tokens = np.concatenate([np.asarray(seqs.prompt_BP[b]), comp[b, :lo], state])[None]
      mask = block_causal_mask(seqs.prompt_valid_BP[b:b + 1], lo + BS, BS, prompt_block_causal)
      logits = apply(jnp.asarray(tokens), jnp.asarray(pos[None, :p + lo + BS]), mask)[0]
      out[b, j] = jax.nn.log_softmax(logits[p + j].astype(jnp.float32))[comp[b, j]]
  return out


@pytest.mark.parametrize("shrink,prompt_block_causal", [(1, False), (2, True)])
def test_each_token_is_scored_in_its_block_state(model, shrink, prompt_block_causal):
  """The defining identity: the batched staircase estimate = the per-token loop."""
  graphdef, params = model
  seqs = _seqs()
  logits_fn = lambda *a: T.apply(graphdef, params, *a)
  lik = EST(logits_fn, seqs, jax.random.key(0), _cfg(shrink, "sum", prompt_block_causal), MASK)
  want = _hand_built(graphdef, params, seqs, shrink, prompt_block_causal)
  assert (want != 0).sum() == 11  # every valid committed token has a term
  np.testing.assert_allclose(lik.token_BL, want, atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(lik.seq_B, want.sum(-1), atol=1e-4, rtol=1e-5)
  mean = EST(logits_fn, seqs, None, _cfg(shrink, "mean", prompt_block_causal), MASK)
  np.testing.assert_allclose(mean.seq_B, want.sum(-1) / np.array([8, 3]), atol=1e-5)


def test_groups_are_ranks_within_each_block():
  steps = _seqs().unmask_step_BL
  np.testing.assert_array_equal(block_state_groups(steps, BS, 1),
                                [[1, 0, 1, 2, 1, 0, 2, 1], [1, 0, 2, 2, 0, 0, 0, 0]])
  np.testing.assert_array_equal(block_state_groups(steps, BS, 2),
                                [[0, 0, 0, 1, 0, 0, 1, 0], [0, 0, 1, 1, 0, 0, 0, 0]])
  np.testing.assert_array_equal(block_state_groups(jnp.array([[-1, 6, -1, 6]]), BS, 1),
                                [[-1, 0, -1, 0]])


@pytest.mark.parametrize("shrink,passes", [(1, 4), (2, 2), (3, 2), (4, 1)])
def test_one_staircase_pass_per_group_across_all_blocks(shrink, passes):
  seqs = _seqs()
  draws = EST.draw(None, seqs, _cfg(shrink), MASK)
  assert draws["noisy_BL"].shape[0] == passes == num_passes(S, shrink, completion_len=8,
                                                            block_size=BS)
  assert draws["prompt_BP"].shape == (passes, 2, 3)
  scored = np.asarray(draws["scored_BL"])
  np.testing.assert_array_equal(scored.sum(0), seqs.completion_valid_BL)  # each token once
  if shrink == 1:  # pass 1 scores block 0's second state and block 1's, side by side
    np.testing.assert_array_equal(scored[1, 0], [1, 0, 1, 0, 1, 0, 0, 1])
    np.testing.assert_array_equal(draws["noisy_BL"][1, 0],
                                  [MASK, 9, MASK, MASK, MASK, 4, MASK, MASK])
  # fixed schedule of 1 step per block (S = 2 over 2 blocks): one pass; threshold (S = L): bs
  assert num_passes(2, 1, completion_len=8, block_size=BS) == 1
  assert num_passes(8, 1, completion_len=8, block_size=BS) == BS
  with pytest.raises(ValueError, match="multiple"):
    num_passes(3, 1, completion_len=8, block_size=BS)


def test_a_block_has_at_most_block_size_states_whatever_the_step_budget():
  """S_b = min(bs, S / nb): a block of bs tokens is committed in at most bs distinct steps,
  so a budget of 32 steps per block (S = 64 over 2 blocks) still needs bs passes, not 32."""
  assert states_per_block(64, 8, BS) == BS
  assert num_passes(64, 1, completion_len=8, block_size=BS) == BS
  assert num_passes(64, 3, completion_len=8, block_size=BS) == 2
  assert states_per_block(4, 8, BS) == 2  # a fixed budget below bs per block is kept


@pytest.mark.parametrize("threshold", [0.0, 0.3])
def test_replays_the_block_sampler_and_log_ratio_is_exactly_zero(model, threshold):
  """A recorded block rollout (KV-cached sampler, block-causal prompt): the noisy block a
  token is scored in is its block in the sampler's tokens before its step, the blocks
  before it are clean, and two estimates at θ = θ_old (any keys) are bit-identical."""
  from dllm_rl.sampling.block_sampler import BlockSamplerConfig, sample_blocks
  graphdef, params = model
  prompt = jnp.array([[4, 5, 6], [7, 3, 8]])
  cfg = BlockSamplerConfig(completion_len=8, steps=4, block_len=BS, temperature=1.0,
                           threshold=threshold, stop_at_eos=False, record_trajectory=True,
                           prompt_block_causal=True)
  out = sample_blocks(graphdef, params, prompt, jnp.ones_like(prompt, bool), jax.random.key(3),
                      cfg=cfg, mask_id=MASK, eos_id=EOS)
  action = np.asarray(action_mask(out.completion_BL, EOS))  # as the RL step: through the EOS
  seqs = SequenceBatch(prompt, jnp.ones_like(prompt, bool), out.completion_BL,
                       jnp.asarray(action), out.unmask_step_BL)
  est = _cfg(1, "sum", True, num_states=cfg.max_steps)
  draws = EST.draw(None, seqs, est, MASK)
  assert draws["noisy_BL"].shape[0] == (BS if threshold else 2)
  traj = np.asarray(out.trajectory_SBL)
  before = np.concatenate([np.full_like(traj[:1], MASK), traj], 0)  # state before step s
  steps = np.asarray(out.unmask_step_BL)
  checked = 0
  for k, b, j in zip(*np.nonzero(np.asarray(draws["scored_BL"]))):
    lo, hi = j // BS * BS, j // BS * BS + BS
    on = action[b, :hi]  # the sampler's tokens after the action never reach the estimator
    np.testing.assert_array_equal(np.where(on, draws["noisy_BL"][k, b, :hi], -1)[lo:],
                                  np.where(on, before[steps[b, j], b, :hi], -1)[lo:])
    np.testing.assert_array_equal(np.where(on, before[steps[b, j], b, :hi], -1)[:lo],
                                  np.where(on, out.completion_BL[b, :hi], -1)[:lo])
    checked += 1
  assert checked == action.sum() >= 4
  logits_fn = lambda *a: T.apply(graphdef, params, *a)
  a = EST(logits_fn, seqs, jax.random.key(0), est, MASK)
  b = EST(logits_fn, seqs, jax.random.key(123), est, MASK)
  np.testing.assert_array_equal(a.seq_B - b.seq_B, 0.0)
  assert np.all(np.asarray(a.seq_B) < 0)


def _rollout(b=2, g=4, p=3, l=8):
  """Block-ordered steps: block i takes steps 2i, 2i + 1 (2 tokens a step), 2 steps a block."""
  k = jax.random.split(jax.random.key(7), 4)
  completion = jax.random.randint(k[2], (b, g, l), 3, 12)
  completion = completion.at[0, 1, 3].set(EOS).at[1, 2, 0].set(EOS)
  within = jnp.argsort(jax.random.uniform(k[3], (b, g, l // BS, BS)), -1) // 2
  steps = (within + 2 * jnp.arange(l // BS)[:, None]).reshape(b, g, l)
  rewards = jnp.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.5]])
  return RolloutBatch(prompt_BP=jax.random.randint(k[1], (b, p), 3, 12),
                      prompt_valid_BP=jnp.ones((b, p), bool).at[1, 0].set(False),
                      completion_BGL=completion, unmask_step_BGL=steps, rewards_BG=rewards,
                      correct_BG=rewards > 0.5)


def _step(loss, advantage, micro_batch, reduction):
  est = _cfg(1, reduction, True, num_states=4)
  return trajectory_rl_step_grads(CFG, _rollout(), est, loss, advantage, micro_batch)


@pytest.mark.parametrize("loss,advantage,reduction", [
    ("stabledrl", "steprs", "mean"), ("grpo", "grpo", "mean"), ("grpo_token", "grpo", "sum")])
def test_runs_in_the_jitted_rl_step_on_a_block_model(loss, advantage, reduction):
  assert_rl_step_runs_and_micro_batches_agree(_step, loss, advantage, reduction)


def test_a_block_config_validates_and_counts_staircase_passes():
  from dllm_rl.models.transformer import ModelConfig
  from dllm_rl.train import flops
  from dllm_rl.train.validate import validate
  over = {"estimator.name": "trajectory", "model.block_size": 4, "sampler.block_len": 4,
          "model.prompt_block_causal": True}
  config = tiny_run_config("rl", over)
  validate(config)
  m = ModelConfig(vocab_size=16, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=16,
                  mlp_hidden=64)
  elbo = tiny_run_config("rl", {**over, "estimator.name": "block_elbo",
                                "estimator.num_samples": 4})  # 8 steps / 2 blocks: K = 4
  assert flops.rl_step_flops(config, m) == flops.rl_step_flops(elbo, m)
