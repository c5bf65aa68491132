"""Expert parallelism (``mesh.expert`` > 1, dllm_rl.models.moe_ep): sharded = single device.

The tiny LLaDA2 MoE fixture (16 experts, top-4; tests/fixtures/llada2_moe_tiny) on meshes
with an expert axis of 2 and 4 among the 8 CPU devices: the same logits, routing and
gradients as one device, each device holding E/expert experts (never gathered over
'expert') while the rows travel by all-to-all; the rules and the config checks.
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from dllm_rl.errors import ConfigError
from dllm_rl.models import hf, moe
from dllm_rl.models import transformer as T
from dllm_rl.parallel.constraints import under_mesh
from dllm_rl.parallel.mesh import AXES, make_mesh
from dllm_rl.parallel.rules import logical_to_spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "tests", "fixtures", "llada2_moe_tiny")
# float32. Logits: measured 3.6e-6. Gradients (of sum(logits · noise), up to ~600): relative
# to each leaf's largest entry, measured 9.8e-7, the same as a data × fsdp = 2 × 4 mesh
# without expert parallelism (the batch-sharded reductions, not the all-to-all).
TOL = 1e-5


@pytest.fixture(scope="module")
def tiny():
  return hf.load_checkpoint(TINY)


def _batch():
  """8 rows (the batch divides data × fsdp × expert = 8), block-causal 24-token sequences."""
  e = np.load(os.path.join(TINY, "expected.npz"))
  rows = [0, 1, 2, 0, 2, 1, 1, 0]
  tokens = jnp.asarray(e["input_ids"][rows], jnp.int32)
  positions = jnp.broadcast_to(jnp.asarray(e["position_ids"], jnp.int32), tokens.shape)
  return tokens, positions, jnp.asarray(e["attention_mask"][rows, 0] == 0)


def _loss_and_grads(m, mesh=None):
  """(logits, routing, loss, grads): a fixed random projection of the logits as the loss."""
  tokens, positions, mask = _batch()

  def loss(params):
    logits, routing = T.apply_routing(m.graphdef, params, tokens, positions, mask)
    cot = jax.random.normal(jax.random.key(3), logits.shape)
    return jnp.sum(logits * cot), (logits, routing)

  fn = jax.jit(under_mesh(jax.value_and_grad(loss, has_aux=True), mesh))
  with jax.default_matmul_precision("highest"):
    (value, (logits, routing)), grads = fn(m.params)
    text = fn.lower(m.params).as_text() if mesh is not None else ""
  return logits, routing, value, grads, text


@pytest.fixture(scope="module")
def one_device(tiny):
  return _loss_and_grads(tiny)


@pytest.mark.parametrize("shape", [(2, 2, 2, 1), (1, 2, 4, 1)], ids=["expert2", "expert4"])
def test_logits_routing_and_gradients_equal_one_device(tiny, one_device, shape):
  mesh = make_mesh(dict(zip(AXES, shape)))
  sharded = hf.load_checkpoint(TINY, mesh=mesh)
  ep = mesh.shape["expert"]
  gate = sharded.params["blocks"][1]["mlp"]["gate_proj"][...]
  assert gate.sharding.spec == P(("expert", "fsdp"), None, "tensor")
  # E/expert experts per expert group, split FSDP-style over the group's 2 fsdp devices
  assert {s.data.shape for s in gate.addressable_shards} == {(16 // ep // 2, 64, 32)}
  logits, routing, value, grads, text = _loss_and_grads(sharded, mesh)
  assert "all_to_all" in text  # the rows travel; the weights stay
  one_logits, one_routing, one_value, one_grads, _ = one_device
  np.testing.assert_allclose(logits, one_logits, atol=TOL)
  np.testing.assert_allclose(value, one_value, rtol=TOL)
  for a, b in zip(routing, one_routing):
    np.testing.assert_array_equal(np.asarray(a.idx_TK), np.asarray(b.idx_TK))
  leaves = jax.tree_util.tree_leaves_with_path(grads)
  for (path, a), b in zip(leaves, jax.tree_util.tree_leaves(one_grads)):
    scale = max(float(np.abs(b).max()), 1.0)
    np.testing.assert_allclose(a, b, atol=TOL * scale, err_msg=jax.tree_util.keystr(path))


def _dispatch_grads(x, idx, w, ws, mesh=None, dispatch="auto"):
  """(loss, grads) of sum(sin(routed experts)); a leading lane axis (5-D ``x``) is vmapped,
  as the samplers vmap the model over the G completions of a prompt."""
  fn = functools.partial(moe.routed_experts, dispatch=dispatch)
  if x.ndim == 4:
    fn = jax.vmap(fn, (0, 0, 0, None, None, None))
  loss = lambda x, w, *ws: jnp.sum(jnp.sin(fn(x, idx, w, *ws)))
  grad = jax.jit(under_mesh(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)), mesh))
  args = (x, w, *ws)
  if mesh is not None:
    args = jax.device_put(args, jax.sharding.NamedSharding(mesh, P()))
  with jax.default_matmul_precision("highest"):
    return grad(*args)


@pytest.mark.parametrize("shape, lead, dispatch", [
    ((1, 2, 2, 2), (8,), "auto"), ((2, 1, 4, 1), (2,), "auto"), ((1, 1, 4, 1), (3, 4), "auto"),
    ((1, 1, 4, 1), (3, 4), "ragged_dot")],  # TPU's dispatch (auto is tiled on this CPU)
    ids=["all_to_all-tensor2", "replicated-rows", "vmapped", "vmapped-ragged_dot"])
def test_dispatch_and_its_gradients_on_the_expert_axis(shape, lead, dispatch):
  """all-to-all with the experts' width over tensor; a batch the expert axis does not
  divide (each device adds its own experts' share, summed over 'expert'); under vmap."""
  k = jax.random.split(jax.random.key(0), 6)
  n, d, e, f, top = 6, 16, 8, 12, 3
  x = jax.random.normal(k[0], (*lead, n, d))
  ws = [jax.random.normal(k[i], s) * 0.3 for i, s in
        ((1, (e, d, f)), (2, (e, d, f)), (3, (e, f, d)))]
  idx = jax.random.randint(k[4], (*lead, n, top), 0, e)
  w = jax.random.uniform(k[5], (*lead, n, top))
  got = _dispatch_grads(x, idx, w, ws, make_mesh(dict(zip(AXES, shape))), dispatch)
  want = _dispatch_grads(x, idx, w, ws, dispatch=dispatch)
  np.testing.assert_allclose(got[0], want[0], rtol=TOL)
  for a, b in zip(got[1], want[1]):  # measured: 1.2e-5 absolute, 3.4e-6 relative
    np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL)


def test_rules_split_experts_over_the_expert_axis_and_leave_it_out_at_size_1():
  ep = AbstractMesh((1, 2, 4, 1), AXES)
  one = AbstractMesh((2, 2, 1, 2), AXES)
  shape = (16, 64, 32)
  assert logical_to_spec(("expert", "embed", "mlp"), shape, ep) == P(("expert", "fsdp"), None,
                                                                     "tensor")
  assert logical_to_spec(("embed", "mlp"), (64, 32), ep) == P(("fsdp", "expert"), "tensor")
  assert logical_to_spec(("expert", "embed", "mlp"), shape, one) == P("fsdp", None, "tensor")
  assert logical_to_spec(("embed", "mlp"), (64, 32), one) == P("fsdp", "tensor")
  # 4 experts on expert × fsdp = 8: the longest prefix that divides, 'expert' alone
  assert logical_to_spec(("expert", "embed", "mlp"), (4, 64, 32), ep) == P("expert", "fsdp",
                                                                          "tensor")


def test_mesh_expert_must_divide_the_experts_and_names_its_key():
  from dllm_rl.config.schema import base_config
  from dllm_rl.train.context import check_expert_axis
  from dllm_rl.train.hf_source import hf_model_config
  from dllm_rl.train.validate import validate
  from tests.helpers import set_dotted
  moe_keys = {"model.n_layers": 2, "model.qk_norm": True, "model.n_experts": 8,
              "model.experts_per_token": 2, "model.moe_hidden": 8, "model.n_expert_groups": 4,
              "model.topk_groups": 2, "model.first_dense_layers": 1, "model.rotary_dim": 4,
              "model.n_kv_heads": 1}
  validate(set_dotted(base_config(), {**moe_keys, "mesh.expert": 4}))
  for bad in ({**moe_keys, "mesh.expert": 3}, {"mesh.expert": 2}, {"mesh.expert": -1}):
    with pytest.raises(ConfigError) as err:
      validate(set_dotted(base_config(), bad))
    assert err.value.key == "mesh.expert", bad
  tiny_cfg = hf_model_config(TINY, "float32", "float32").model_cfg  # 16 experts
  check_expert_axis(set_dotted(base_config(), {"mesh.expert": 4}), tiny_cfg)
  with pytest.raises(ConfigError, match="must divide the model's 16 experts") as err:
    check_expert_axis(set_dotted(base_config(), {"mesh.expert": 3}), tiny_cfg)
  assert err.value.key == "mesh.expert"
