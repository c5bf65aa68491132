"""Master weights and Adam moments live in ``model.param_dtype`` whatever the checkpoint
file holds: a bf16 HF checkpoint loaded for RL (param_dtype float32, compute bfloat16)
trains in fp32, so that one AdamW update at lr 2e-6 is not rounded away."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.models import convert

from dllm_rl.train import context as setup, hf_source
from dllm_rl.config import load_config_file
from dllm_rl.models import hf, hf_export
from dllm_rl.parallel.mesh import make_mesh
from dllm_rl.parallel.shard import init_state_sharded
from dllm_rl.train.rl_loop import rl_optimizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "llada_tiny")


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
  """The tiny LLaDA fixture re-written as a bfloat16 HF checkpoint (as LLaDA-8B ships)."""
  out = tmp_path_factory.mktemp("llada_bf16")
  cfg, ids, _, params, family = hf.load_checkpoint(FIXTURE, dtype="bfloat16")
  hf_export.export_checkpoint(params, cfg, ids, family, str(out), dtype="bfloat16")
  return str(out)


def _one_rl_update(path, mesh):
  """Load as configs/llada_tpu.py does (bf16 compute, fp32 params), one AdamW step with
  that config's optimizer (lr 2e-6, wd 0.1, clip 0.2) on a masked-token loss."""
  config = load_config_file(os.path.join(ROOT, "configs", "llada_tpu.py"))
  assert config.rl.lr == 2e-6
  model_cfg, _, _ = hf_source.hf_model_config(path, config.model.dtype, config.model.param_dtype)
  graphdef, params = hf_source.load_hf_params(path, model_cfg, mesh)
  optimizer, _ = rl_optimizer(config.rl)
  state, _ = init_state_sharded(params, optimizer, jax.random.key(0), mesh)
  tokens = jax.random.randint(jax.random.key(1), (8, 16), 0, model_cfg.vocab_size)
  positions = jnp.broadcast_to(jnp.arange(16), tokens.shape)

  def loss_fn(p):
    from dllm_rl.models import transformer
    logits = transformer.apply(graphdef, p, tokens, positions)
    assert logits.dtype == jnp.float32
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], -1))

  @jax.jit
  def step(state):
    grads = jax.grad(loss_fn)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    return jax.tree.map(lambda p, u: p + u, state.params, updates), opt_state

  new_params, opt_state = step(state)
  return model_cfg, state, new_params, opt_state


@pytest.mark.parametrize("imported", [False, True])
def test_bf16_checkpoint_trains_in_fp32(bf16_checkpoint, tmp_path, imported):
  path = bf16_checkpoint
  if imported:  # `python -m dllm_rl.convert import` keeps the file's bf16; the run casts
    path = str(tmp_path / "imported")
    convert.import_hf(bf16_checkpoint, path, dtype="bfloat16")
  mesh = make_mesh({"data": 1, "fsdp": 2, "tensor": 1})
  model_cfg, state, new_params, opt_state = _one_rl_update(path, mesh)
  assert model_cfg.dtype == jnp.bfloat16 and model_cfg.param_dtype == jnp.float32
  leaves = jax.tree.leaves(state.params)
  assert leaves and all(x.dtype == jnp.float32 for x in leaves)
  moments = [x for x in jax.tree.leaves(opt_state) if x.ndim > 0]
  assert len(moments) == 2 * len(leaves)  # Adam's mu and nu, one per parameter
  assert all(x.dtype == jnp.float32 for x in moments)
  changed = sum(int(np.sum(np.asarray(a) != np.asarray(b)))
                for a, b in zip(leaves, jax.tree.leaves(new_params)))
  total = sum(x.size for x in leaves)
  assert changed >= 0.99 * total, f"only {changed}/{total} weights changed"
  # The starting fp32 weights are the checkpoint's bf16 values, exactly.
  _, _, _, ref, _ = hf.load_checkpoint(bf16_checkpoint, dtype="bfloat16")
  for a, b in zip(jax.tree.leaves(ref), leaves):
    assert np.array_equal(np.asarray(a).astype(np.float32), np.asarray(b))


def test_fresh_init_uses_param_dtype():
  config = load_config_file(os.path.join(ROOT, "configs", "tiny_cpu.py"))
  config.model.dtype, config.model.param_dtype = "bfloat16", "float32"
  model_cfg = setup.model_config(config, vocab_size=32)
  from dllm_rl.models.transformer import init_params_sharded
  _, params = init_params_sharded(model_cfg, jax.random.key(0), make_mesh(config.mesh))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
