"""sampler.cache: `none` is the exact sampler (unchanged), `prefix`/`dual` equal it exactly
when every block takes a single step (that step runs on the block-start forward, which is the
exact forward), and they run in vmapped groups and on a sharded mesh."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.train import evaluation
from dllm_rl.diffusion.sft import sequence_inputs
from dllm_rl.models import transformer as T
from dllm_rl.parallel import shard
from dllm_rl.parallel.mesh import make_mesh
from dllm_rl.sampling import sampler as S
from dllm_rl.sampling.step import select_commits
from tests.helpers import small_model

MASK, EOS = 2, 1
L, BL = 12, 4
# init_std 0.3: logits spread widely, so confidences are far from ties.
CFG = small_model(vocab_size=24)
FIELDS = ("completion_BL", "unmask_step_BL", "num_steps", "num_blocks", "trajectory_SBL")


@pytest.fixture(scope="module")
def model():
  return T.init_model(CFG, jax.random.key(0))


def _prompts(b=3, p=5):
  prompt = jax.random.randint(jax.random.key(7), (b, p), 3, 24)
  valid = jnp.ones((b, p), bool).at[0, :2].set(False).at[2, :4].set(False)  # left padding
  return prompt, valid


@functools.partial(jax.jit, static_argnums=0, static_argnames=("cfg",))
def _sample(graphdef, params, prompt, valid, key, *, cfg):
  return S.sample(graphdef, params, prompt, valid, key, cfg=cfg, mask_id=MASK, eos_id=EOS)


def _reference(graphdef, params, prompt, valid, key, cfg):
  """The sampler as it was before open-block logits: the full forward and head over all
  P + L positions at every step (Python loops), decisions on the open block's rows."""
  x = jnp.full((prompt.shape[0], L), MASK, jnp.int32)
  unmask = jnp.full_like(x, -1)
  sched, step = S.transfer_schedule(BL, cfg.steps_per_block), 0
  for block in range(L // BL):
    for s in range(cfg.steps_per_block):
      logits = T.apply(graphdef, params, *sequence_inputs(prompt, valid, x))[:, prompt.shape[1]:]
      sl = slice(block * BL, (block + 1) * BL)
      x0, commit = select_commits(logits[:, sl], x[:, sl] == MASK, jax.random.fold_in(key, step),
                                  sched[s], cfg=cfg, mask_id=MASK)
      x = x.at[:, sl].set(jnp.where(commit, x0, x[:, sl]))
      unmask = unmask.at[:, sl].set(jnp.where(commit, step, unmask[:, sl]))
      step += 1
  return x, unmask


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_cache_none_equals_full_forward_reference(model, temperature):
  g, params = model
  prompt, valid = _prompts()
  cfg = S.SamplerConfig(completion_len=L, steps=6, block_len=BL, temperature=temperature,
                        stop_at_eos=False)
  out = _sample(g, params, prompt, valid, jax.random.key(3), cfg=cfg)
  x, unmask = _reference(g, params, prompt, valid, jax.random.key(3), cfg)
  np.testing.assert_array_equal(out.completion_BL, x)
  np.testing.assert_array_equal(out.unmask_step_BL, unmask)
  assert len(np.unique(x)) > 4  # not a degenerate output


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("temperature, stop_at_eos", [(0.0, False), (1.2, True)])
def test_single_step_blocks_are_exact(model, cache, temperature, stop_at_eos):
  g, params = model
  prompt, valid = _prompts()
  cfg = S.SamplerConfig(completion_len=L, steps=L // BL, block_len=BL, temperature=temperature,
                        stop_at_eos=stop_at_eos, record_trajectory=True)
  ref = _sample(g, params, prompt, valid, jax.random.key(5), cfg=cfg)
  out = _sample(g, params, prompt, valid, jax.random.key(5),
                cfg=dataclasses.replace(cfg, cache=cache))
  for field in FIELDS:
    np.testing.assert_array_equal(getattr(out, field), getattr(ref, field), err_msg=field)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_refreshing_every_step_is_exact(model, cache):
  """sampler.cache_refresh = 1: every step runs the block-start (exact) forward."""
  g, params = model
  prompt, valid = _prompts()
  cfg = S.SamplerConfig(completion_len=L, steps=L, block_len=BL, temperature=0.8,
                        stop_at_eos=True, record_trajectory=True)
  ref = _sample(g, params, prompt, valid, jax.random.key(4), cfg=cfg)
  out = _sample(g, params, prompt, valid, jax.random.key(4),
                cfg=dataclasses.replace(cfg, cache=cache, cache_refresh=1))
  for field in FIELDS:
    np.testing.assert_array_equal(getattr(out, field), getattr(ref, field), err_msg=field)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_modes_keep_the_schedule_and_record_steps(model, cache):
  """Several steps per block: k_s commits per step inside the open block, unmask steps =
  the first step at which the trajectory shows the token, and close to the exact tokens."""
  g, params = model
  prompt, valid = _prompts()
  cfg = S.SamplerConfig(completion_len=L, steps=6, block_len=BL, temperature=0.0, cache=cache,
                        stop_at_eos=False, record_trajectory=True, exclude_mask=True)
  out = _sample(g, params, prompt, valid, jax.random.key(0), cfg=cfg)
  traj = np.asarray(out.trajectory_SBL)
  sched = np.tile(S.transfer_schedule(BL, 2), L // BL)
  prev = np.full(traj.shape[1:], MASK)
  for s in range(6):
    newly = (prev == MASK) & (traj[s] != MASK)
    np.testing.assert_array_equal(newly.sum(-1), sched[s])
    assert np.all(np.nonzero(newly)[1] // BL == s // 2)
    np.testing.assert_array_equal(traj[s][prev != MASK], prev[prev != MASK])
    prev = traj[s]
  np.testing.assert_array_equal(out.unmask_step_BL, np.argmax(traj != MASK, axis=0))
  exact = _sample(g, params, prompt, valid, jax.random.key(0),
                  cfg=dataclasses.replace(cfg, cache="none"))
  assert (np.asarray(out.completion_BL) == np.asarray(exact.completion_BL)).mean() > 0.5


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_threshold_mode_with_cache(model, cache):
  g, params = model
  prompt, valid = _prompts()
  cfg = S.SamplerConfig(completion_len=L, steps=3, block_len=BL, temperature=0.7, threshold=0.3,
                        cache=cache, stop_at_eos=False, exclude_mask=True)
  out = _sample(g, params, prompt, valid, jax.random.key(2), cfg=cfg)
  assert 3 <= int(out.num_steps) <= L and int(out.num_blocks) == 3
  assert not np.any(np.asarray(out.completion_BL) == MASK)
  assert np.asarray(out.unmask_step_BL).max() == int(out.num_steps) - 1


def test_dual_cache_groups_and_sharded_mesh_equal_single_device(model):
  """vmapped groups = per-key samples, and a (2, 2, 2) mesh = one device, with the dual cache."""
  g, params = model
  prompt = jax.random.randint(jax.random.key(5), (8, 5), 3, 24)
  valid = jnp.ones((8, 5), bool).at[1, :3].set(False)
  cfg = S.SamplerConfig(completion_len=L, steps=6, block_len=BL, temperature=1.0, cache="dual")
  key = jax.random.key(6)
  ref = evaluation.make_sample_fn(g, cfg, mask_id=MASK, eos_id=EOS, group_size=2)(
      params, prompt, valid, key)
  for i, k in enumerate(jax.random.split(key, 2)):
    one = _sample(g, params, prompt, valid, k, cfg=cfg)
    np.testing.assert_array_equal(ref.completion_BL[:, i], one.completion_BL)
    np.testing.assert_array_equal(ref.unmask_step_BL[:, i], one.unmask_step_BL)
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  sharded_params = jax.device_put(params, shard.param_shardings(params, mesh))
  p, v = shard.shard_batch(mesh, (np.asarray(prompt), np.asarray(valid)))
  out = evaluation.make_sample_fn(g, cfg, mask_id=MASK, eos_id=EOS, mesh=mesh, group_size=2)(
      sharded_params, p, v, key)
  np.testing.assert_array_equal(out.completion_BL, ref.completion_BL)
  np.testing.assert_array_equal(out.unmask_step_BL, ref.unmask_step_BL)
