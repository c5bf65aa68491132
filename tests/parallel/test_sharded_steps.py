"""Sharded = single device: SFT and RL steps, the sampler, and checkpoints across meshes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dllm_rl.infra.checkpoint import Checkpointer
from dllm_rl.diffusion.estimators import EstimatorConfig
from dllm_rl.models import transformer as T
from dllm_rl.parallel import shard
from dllm_rl.parallel.mesh import make_mesh, resolve_shape
from dllm_rl.rl.step import make_rl_step
from dllm_rl.sampling.sampler import SamplerConfig
from dllm_rl.train import evaluation
from dllm_rl.parallel.shard import init_train_state
from dllm_rl.train.sft_step import make_sft_step
from dllm_rl.types import SequenceBatch
from tests.helpers import EOS, MASK, random_rollout_batch, rl_step_config, tiny_model

CFG = tiny_model(vocab_size=16, n_layers=2, n_heads=4)
MESHES = [(8, 1, 1), (2, 2, 2), (1, 4, 2)]
LR = 1e-2
OPT = optax.adamw(LR)
SCHEDULE = lambda s: LR
# Parameters after a few AdamW steps: a sharded reduction sums in another order, and Adam's
# m / sqrt(v) amplifies that rounding for an element whose gradient is near zero (seen: 1.4e-5
# on one of 512 elements, on an AVX-512 Xeon). 1 % of one step's size (lr) is far below what a
# wrong sharding, mask or key does (a whole step, or more).
PARAM_ATOL = 1e-2 * LR


def _mesh(shape):
  return make_mesh(dict(zip(("data", "fsdp", "tensor"), shape)))


def _sft_batch():
  k = jax.random.split(jax.random.key(3), 2)
  return SequenceBatch(jax.random.randint(k[0], (8, 4), 3, 16), jnp.ones((8, 4), bool),
                       jax.random.randint(k[1], (8, 6), 3, 16), jnp.ones((8, 6), bool))


def _rl_batch():
  return random_rollout_batch(4, b=8, g=2, p=4, l=6, vocab_size=16, unmask_period=3)


# The official setup: SPG block masks (K = 2, prompt noise), the SPG surrogate, independent masks
# for ℓ̂_old and each inner iteration; StepRS advantages.
RL_CFG = rl_step_config("stabledrl", "steprs", "spg_block",
                        EstimatorConfig(num_samples=2, spg_block_len=3, prompt_mask_prob=0.15,
                                        antithetic=False),
                        inner_steps=2, num_states=3)


def _run(kind, mesh, cfg=CFG, scale_options=False):
  key = jax.random.key(0)
  if mesh is None:
    graphdef, params = T.init_model(cfg, key)
    state, sharding = init_train_state(params, OPT, jax.random.key(1)), None
  else:
    graphdef, params = T.init_params_sharded(cfg, key, mesh)
    state, sharding = shard.init_state_sharded(params, OPT, jax.random.key(1), mesh)
  if kind == "sft":
    fn = make_sft_step(graphdef, OPT, SCHEDULE, mask_id=MASK, t_eps=1e-3, mesh=mesh,
                       state_sharding=sharding, logits_chunk=4 if scale_options else 0)
    batch = _sft_batch()
  else:
    rl_cfg = RL_CFG
    if scale_options:
      rl_cfg = dataclasses.replace(
          RL_CFG, micro_batch=4,
          estimator_cfg=dataclasses.replace(RL_CFG.estimator_cfg, logits_chunk=4))
    fn = make_rl_step(graphdef, OPT, SCHEDULE, rl_cfg, mesh=mesh, state_sharding=sharding)
    batch = _rl_batch()
  if mesh is not None:
    batch = shard.shard_batch(mesh, jax.device_get(batch))
  losses = []
  for i in range(2):
    state, metrics = fn(state, batch, jax.random.key(10 + i))
    losses.append(float(metrics["loss"]))
  return losses, jax.device_get(state.params), state


@pytest.mark.parametrize("kind", ["sft", "rl"])
def test_steps_on_meshes_match_one_device(kind):
  ref_losses, ref_params, _ = _run(kind, None)
  for shape in MESHES:
    losses, params, state = _run(kind, _mesh(shape))
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, atol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(ref_params)):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=PARAM_ATOL)
    embed = state.params["embed"][...]
    assert tuple(embed.sharding.spec) == ("tensor", "fsdp")  # the layout survives the update
    assert embed.sharding.mesh.shape == {**dict(zip(("data", "fsdp", "tensor"), shape)),
                                         "expert": 1}


@pytest.mark.parametrize("kind", ["rl", "sft"])
def test_every_scale_option_on_a_mesh_matches_unrolled_on_one_device(kind):
  """scan + remat, chunked vocabulary (ragged chunks) and, for RL, micro-batches of 4 of
  the 16 sequences (split draws) on a (2, 2, 2) mesh = the plain step on one device."""
  ref_losses, ref_params, _ = _run(kind, None)
  scanned = dataclasses.replace(CFG, scan_layers=True, remat="minimal")
  losses, params, _ = _run(kind, _mesh((2, 2, 2)), scanned, scale_options=True)
  np.testing.assert_allclose(losses, ref_losses, rtol=2e-5, atol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(ref_params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=PARAM_ATOL)


def test_params_are_initialised_sharded_with_the_rules():
  mesh = _mesh((2, 2, 2))
  _, params = T.init_params_sharded(CFG, jax.random.key(0), mesh)
  spec = lambda v: tuple(v[...].sharding.spec)
  assert spec(params["embed"]) == ("tensor", "fsdp")
  assert spec(params["blocks"][0]["mlp"]["gate_proj"]) == ("fsdp", "tensor")
  assert spec(params["blocks"][0]["attn"]["q_proj"]) == ("fsdp", "tensor", None)
  shard_shape = params["embed"][...].addressable_shards[0].data.shape
  assert shard_shape == (8, 8)  # each device holds a quarter of the [16, 16] table
  _, ref = T.init_model(CFG, jax.random.key(0))
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(ref)):
    np.testing.assert_allclose(jax.device_get(a), b, rtol=1e-6, atol=1e-9)  # = unsharded init


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampler_tokens_identical_sharded_and_unsharded(temperature):
  cfg = SamplerConfig(completion_len=8, steps=4, block_len=4, temperature=temperature)
  graphdef, params = T.init_model(CFG, jax.random.key(0))
  prompt = jax.random.randint(jax.random.key(5), (8, 4), 3, 16)
  valid = jnp.ones((8, 4), bool)
  ref = evaluation.make_sample_fn(graphdef, cfg, mask_id=MASK, eos_id=EOS)(
      params, prompt, valid, jax.random.key(6))
  mesh = _mesh((2, 2, 2))
  _, sharded_params = T.init_params_sharded(CFG, jax.random.key(0), mesh)
  p, v = shard.shard_batch(mesh, (np.asarray(prompt), np.asarray(valid)))
  out = evaluation.make_sample_fn(graphdef, cfg, mask_id=MASK, eos_id=EOS, mesh=mesh)(
      sharded_params, p, v, jax.random.key(6))
  assert out.completion_BL.sharding.is_fully_replicated
  np.testing.assert_array_equal(out.completion_BL, ref.completion_BL)
  np.testing.assert_array_equal(out.unmask_step_BL, ref.unmask_step_BL)


def test_checkpoint_restores_onto_another_mesh(tmp_path):
  mesh_a, mesh_b = _mesh((2, 2, 2)), _mesh((1, 4, 2))
  _, params = T.init_params_sharded(CFG, jax.random.key(0), mesh_a)
  state, _ = shard.init_state_sharded(params, OPT, jax.random.key(1), mesh_a)
  with Checkpointer(str(tmp_path), keep=2) as ckpt:
    ckpt.save(1, state, {"data_position": 3})
  _, params_b = T.init_params_sharded(CFG, jax.random.key(9), mesh_b)
  template, shardings_b = shard.init_state_sharded(params_b, OPT, jax.random.key(2), mesh_b)
  with Checkpointer(str(tmp_path), keep=2) as ckpt:
    restored, meta = ckpt.restore(template)
  assert meta["data_position"] == 3
  for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(restored)):
    if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
      a, b = jax.random.key_data(a), jax.random.key_data(b)
    np.testing.assert_array_equal(jax.device_get(a), jax.device_get(b))
  embed = restored.params["embed"][...]
  assert embed.sharding.mesh.shape == mesh_b.shape
  assert tuple(embed.sharding.spec) == ("tensor", "fsdp")


def test_mesh_shapes():
  assert resolve_shape((-1, 2, 2), 8) == (2, 2, 2)
  assert resolve_shape((1, -1, 1), 8) == (1, 8, 1)
  with pytest.raises(ValueError, match=r"cannot fill 8 devices \(the other axes' product, 3,"):
    resolve_shape((3, -1, 1, 1), 8)
  with pytest.raises(ValueError, match="at most one axis may be -1"):
    resolve_shape((-1, -1, 1, 1), 8)
  with pytest.raises(ValueError, match="needs 16 devices"):
    resolve_shape((4, 2, 2), 8)
