"""Sampler invariants: schedule, no re-masking, step/block counts, determinism, EOS."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dllm_rl.models import transformer as T
from dllm_rl.sampling import sampler as S
from dllm_rl.sampling.remasking import REMASKING
from tests.helpers import small_model, tiny_model

MASK, EOS = 2, 1
CFG = small_model(vocab_size=30, n_layers=1, init_std=0.02)


@pytest.fixture
def model():
  """A fresh (graphdef, params) per test: no test sees another's changes."""
  return T.init_model(CFG, jax.random.key(0))


def _uniform_logits(params):
  """A copy of ``params`` with the final norm's scale 0: every logit is 0 (uniform), so
  greedy argmax proposes token 0 everywhere. ``params`` itself is left as it is."""
  params = jax.tree.map(jnp.copy, params)
  pure = nnx.to_pure_dict(params)
  pure["final_norm"]["scale"] = jnp.zeros_like(pure["final_norm"]["scale"])
  nnx.replace_by_pure_dict(params, pure)
  return params


def _prompts(b=3, p=5):
  prompt = jax.random.randint(jax.random.key(7), (b, p), 3, 30)
  valid = jnp.ones((b, p), bool).at[0, :2].set(False)  # one left-padded row
  return prompt, valid


def _run(model, cfg, key=1, **kw):
  g, params = model
  prompt, valid = _prompts(**kw)
  fn = jax.jit(lambda pr, k: S.sample(g, params, pr, valid, k, cfg=cfg, mask_id=MASK, eos_id=EOS))
  return fn(prompt, jax.random.key(key))


def test_transfer_schedule():
  np.testing.assert_array_equal(S.transfer_schedule(8, 3), [3, 3, 2])
  assert S.transfer_schedule(32, 32).sum() == 32


@pytest.mark.parametrize("remasking", REMASKING.names())
def test_commits_scheduled_tokens_per_step_and_never_remasks(model, remasking):
  cfg = S.SamplerConfig(completion_len=12, steps=6, block_len=4, temperature=0.7,
                        remasking=remasking, stop_at_eos=False, record_trajectory=True,
                        exclude_mask=True)  # exactly k per step needs no mask proposals
  out = _run(model, cfg)
  assert int(out.num_steps) == 6 and int(out.num_blocks) == 3
  traj = np.asarray(out.trajectory_SBL)
  sched = np.tile(S.transfer_schedule(4, 2), 3)
  prev = np.full(traj.shape[1:], MASK)
  for s in range(6):
    newly = (prev == MASK) & (traj[s] != MASK)
    np.testing.assert_array_equal(newly.sum(-1), sched[s])  # exactly k_s per row
    kept = prev != MASK
    np.testing.assert_array_equal(traj[s][kept], prev[kept])  # committed tokens never change
    block = s // 2
    assert np.all(np.nonzero(newly)[1] // 4 == block)  # only inside the current block
    prev = traj[s]
  completion = np.asarray(out.completion_BL)
  assert not np.any(completion == MASK)
  unmask = np.asarray(out.unmask_step_BL)
  first_seen = np.argmax(traj != MASK, axis=0)
  np.testing.assert_array_equal(unmask, first_seen)



@pytest.mark.parametrize("bad, got", [
    (lambda logits_BLV, x0_BL, key: logits_BLV.max(-1)[0], r"float32 of shape \(4,\)"),  # [L]
    (lambda logits_BLV, x0_BL, key: logits_BLV.max((-2, -1)), r"float32 of shape \(3,\)"),  # [B]
    # integer confidences (a rounded score: ties) and half-precision ones: not float32
    (lambda logits_BLV, x0_BL, key: jnp.round(10 * logits_BLV.max(-1)).astype(jnp.int32),
     r"int32 of shape \(3, 4\)"),
    (lambda logits_BLV, x0_BL, key: logits_BLV.max(-1).astype(jnp.bfloat16),
     r"bfloat16 of shape \(3, 4\)")],
    ids=["per_position", "per_sequence", "int32", "bfloat16"])
def test_a_remasking_policy_of_the_wrong_shape_or_dtype_is_named(model, monkeypatch, bad, got):
  monkeypatch.setitem(REMASKING._items, "mine", bad)
  cfg = S.SamplerConfig(completion_len=8, steps=4, block_len=4, temperature=0.7,
                        remasking="mine")
  with pytest.raises(TypeError, match=rf"sampler\.remasking='mine'.*{got}.*float32.*\(3, 4\)"):
    _run(model, cfg)

def test_same_seed_same_output_and_different_seed_differs(model):
  cfg = S.SamplerConfig(completion_len=8, steps=4, block_len=4, temperature=1.0, stop_at_eos=False)
  a, b, c = _run(model, cfg, key=3), _run(model, cfg, key=3), _run(model, cfg, key=4)
  np.testing.assert_array_equal(a.completion_BL, b.completion_BL)
  assert not np.array_equal(a.completion_BL, c.completion_BL)


def test_greedy_ignores_key(model):
  cfg = S.SamplerConfig(completion_len=8, steps=8, block_len=4, temperature=0.0, stop_at_eos=False)
  np.testing.assert_array_equal(_run(model, cfg, key=3).completion_BL,
                                _run(model, cfg, key=9).completion_BL)


def test_threshold_mode_commits_at_least_one_per_step(model):
  cfg = S.SamplerConfig(completion_len=8, steps=2, block_len=4, temperature=0.5, threshold=0.05,
                        stop_at_eos=False, record_trajectory=True, exclude_mask=True)
  out = _run(model, cfg)
  n = int(out.num_steps)
  assert 2 <= n <= 8
  traj = np.asarray(out.trajectory_SBL)
  counts = [(traj[s] != MASK).sum() for s in range(n)]
  assert all(b > a for a, b in zip([0] + counts, counts))  # progress every step
  assert not np.any(np.asarray(out.completion_BL) == MASK)


def test_stop_at_eos_fills_and_skips_blocks(model):
  g, params = model
  params = _uniform_logits(params)  # → argmax proposes token 0 everywhere
  prompt, valid = _prompts()
  cfg = S.SamplerConfig(completion_len=12, steps=6, block_len=4, stop_at_eos=True)
  out = S.sample(g, params, prompt, valid, jax.random.key(0), cfg=cfg, mask_id=MASK, eos_id=0)
  assert int(out.num_blocks) == 1 and int(out.num_steps) == 2  # only the first block ran
  np.testing.assert_array_equal(out.completion_BL, 0)
  assert np.all(np.asarray(out.unmask_step_BL)[:, 4:] == 1)  # filled when block 0 finished


@pytest.mark.parametrize("threshold", [0.0, 0.05])
def test_proposed_mask_token_stays_masked_and_is_not_recorded(model, threshold):
  """Uniform logits → greedy argmax proposes token 0; with mask id 0 every pick is
  the mask token (the official code would write it back: the position stays masked).
  Nothing is committed, unmask steps stay -1, threshold mode stops after block_len steps;
  with ``exclude_mask`` token 1 is committed instead."""
  g, params = model
  params = _uniform_logits(params)
  prompt, valid = _prompts()
  cfg = S.SamplerConfig(completion_len=8, steps=4, block_len=4, threshold=threshold,
                        stop_at_eos=False)
  out = S.sample(g, params, prompt, valid, jax.random.key(0), cfg=cfg, mask_id=0, eos_id=EOS)
  np.testing.assert_array_equal(out.completion_BL, 0)
  np.testing.assert_array_equal(out.unmask_step_BL, -1)
  assert int(out.num_steps) == (8 if threshold else 4) and int(out.num_blocks) == 2
  out = S.sample(g, params, prompt, valid, jax.random.key(0), mask_id=0, eos_id=7,
                 cfg=dataclasses.replace(cfg, exclude_mask=True))
  np.testing.assert_array_equal(out.completion_BL, 1)
  assert np.all(np.asarray(out.unmask_step_BL) >= 0)


def test_tokens_after_first_eos_are_eos(model):
  cfg = S.SamplerConfig(completion_len=12, steps=12, block_len=4, temperature=3.0, stop_at_eos=True,
                        exclude_mask=True)
  g, params = model
  prompt, valid = _prompts(b=16)
  out = S.sample(g, params, prompt, valid, jax.random.key(5), cfg=cfg, mask_id=MASK, eos_id=EOS)
  c = np.asarray(out.completion_BL)
  assert not np.any(c == MASK)
  assert np.any(c == EOS)  # some rows do end early (the check below is not vacuous)
  for row in c:
    hits = np.nonzero(row == EOS)[0]
    if hits.size:
      assert np.all(row[hits[0]:] == EOS)


def test_group_rollouts_match_per_key_samples(model):
  g, params = model
  prompt, valid = _prompts()
  cfg = S.SamplerConfig(completion_len=8, steps=4, block_len=4, temperature=1.0, stop_at_eos=False)
  key = jax.random.key(11)
  out = S.sample_groups(g, params, prompt, valid, key, group_size=3, cfg=cfg, mask_id=MASK,
                        eos_id=EOS)
  assert out.completion_BL.shape == (3, 3, 8)
  for i, k in enumerate(jax.random.split(key, 3)):
    one = S.sample(g, params, prompt, valid, k, cfg=cfg, mask_id=MASK, eos_id=EOS)
    np.testing.assert_array_equal(out.completion_BL[:, i], one.completion_BL)
  assert not np.array_equal(out.completion_BL[:, 0], out.completion_BL[:, 1])


def test_bad_shape_rejected(model):
  g, params = model
  prompt, valid = _prompts()
  with pytest.raises(ValueError, match="block_len"):
    S.sample(g, params, prompt, valid, jax.random.key(0),
             cfg=S.SamplerConfig(completion_len=10, steps=4, block_len=4), mask_id=MASK, eos_id=EOS)


def test_exclude_mask_comes_from_the_config():
  from dllm_rl.config import base_config
  c = base_config()
  assert not S.SamplerConfig.from_config(c).exclude_mask  # official LLaDA behaviour by default
  c.sampler.exclude_mask = True
  assert S.SamplerConfig.from_config(c).exclude_mask


@pytest.mark.parametrize("kind", ["masked", "block"])
def test_stop_at_eos_keeps_the_tokens_before_the_first_eos(kind):
  """A mask left in a finished block (a mask-id proposal) before the first EOS stays a mask:
  ``stop_at_eos`` only skips work, the tokens up to the first EOS are those without it (the
  fill once turned that mask into EOS, cutting the completion short)."""
  from dllm_rl.sampling import block_sampler as BS
  g, params = T.init_model(tiny_model(vocab_size=8, init_std=0.3), jax.random.key(0))
  prompt = jax.random.randint(jax.random.key(7), (8, 3), 3, 8)
  valid = jnp.ones((8, 3), bool)
  cfg = S.SamplerConfig(completion_len=8, steps=4, block_len=4, temperature=1.0,
                        stop_at_eos=False)
  fn = S.sample
  if kind == "block":
    cfg, fn = BS.BlockSamplerConfig(**dataclasses.asdict(cfg)), BS.sample_blocks
  eos = 4  # a frequent token of this model: some rows leave a mask before their first one
  free, stop = (np.asarray(fn(g, params, prompt, valid, jax.random.key(1), mask_id=MASK,
                              eos_id=eos, cfg=dataclasses.replace(cfg, stop_at_eos=s))
                           .completion_BL) for s in (False, True))
  first = [np.flatnonzero(r == eos)[0] if (r == eos).any() else len(r) for r in free]
  assert any((r[:f] == MASK).any() and f < len(r) for r, f in zip(free, first))  # exercised
  for r_free, r_stop, f in zip(free, stop, first):
    np.testing.assert_array_equal(r_stop[:f], r_free[:f])
