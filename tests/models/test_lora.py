"""LoRA (dllm_rl.models.lora): a fresh adapter changes nothing, the adapter path equals its
merged weight, a step moves the adapters only, the optimizer holds state for adapters only,
adapters shard like their base weights, and the config keys are validated."""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dllm_rl.config.schema import base_config
from dllm_rl.errors import ConfigError, ConfigErrors
from dllm_rl.models import lora, transformer
from dllm_rl.parallel.mesh import make_mesh
from dllm_rl.parallel.shard import init_state_sharded
from dllm_rl.train.optim import make_optimizer
from dllm_rl.train.sft_step import make_sft_step
from dllm_rl.train.validate import validate
from dllm_rl.types import SequenceBatch

BASE = transformer.ModelConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2,
                               head_dim=4, mlp_hidden=24)
LORA = types.SimpleNamespace(rank=4, alpha=8.0, targets=tuple(lora.TARGETS),
                             base_dtype="bfloat16")
CFG = lora.configure(BASE, LORA)


# jitted (one compile per test instead of one per primitive, as eager dispatch does)
_apply = jax.jit(transformer.apply, static_argnums=0)


def _inputs(b=2, n=6):
  tokens = jax.random.randint(jax.random.key(1), (b, n), 0, BASE.vocab_size)
  return tokens, jnp.broadcast_to(jnp.arange(n), (b, n))


def _randomise_b(params, key):
  """Nonzero B matrices (a fresh adapter has B = 0)."""
  keys = iter(jax.random.split(key, 64))
  def one(path, v):
    if lora.is_adapter(v) and path[-1].key == "b":
      return v.replace(0.1 * jax.random.normal(next(keys), v[...].shape, v[...].dtype))
    return v
  return jax.tree_util.tree_map_with_path(one, params,
                                          is_leaf=lambda x: isinstance(x, nnx.Variable))


def _sft_opt(lr=1e-2):
  return make_optimizer(types.SimpleNamespace(lr=lr, steps=10, warmup_steps=0, schedule="constant",
                                              b1=0.9, b2=0.999, weight_decay=0.1, grad_clip=1.0),
                        lora_only=True)


def test_fresh_adapter_leaves_logits_unchanged_exactly():
  graphdef, params = transformer.init_model(CFG, jax.random.key(0))
  adapters, base = lora.split_adapters(params)
  assert len(jax.tree.leaves(adapters)) == 2 * 7 * BASE.n_layers
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(adapters))
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(base))
  plain_graphdef, _ = transformer.abstract_model(lora.without_lora(CFG))
  tokens, pos = _inputs()
  with_lora = _apply(graphdef, params, tokens, pos)
  without = _apply(plain_graphdef, base, tokens, pos)
  np.testing.assert_array_equal(np.asarray(with_lora), np.asarray(without))


def test_merged_weights_equal_adapter_path():
  cfg = dataclasses.replace(CFG, param_dtype=jnp.float32)
  graphdef, params = transformer.init_model(cfg, jax.random.key(0))
  params = _randomise_b(params, jax.random.key(2))
  plain = lora.without_lora(cfg)
  plain_graphdef, plain_abstract = transformer.abstract_model(plain)
  merged = lora.merge_adapters(params, cfg, plain_abstract)
  tokens, pos = _inputs()
  unmerged_logits = _apply(graphdef, params, tokens, pos)
  merged_logits = _apply(plain_graphdef, merged, tokens, pos)
  base_logits = _apply(plain_graphdef, lora.split_adapters(params)[1], tokens, pos)
  assert float(jnp.abs(unmerged_logits - base_logits).max()) > 1e-3  # the adapters matter
  np.testing.assert_allclose(np.asarray(merged_logits), np.asarray(unmerged_logits), atol=1e-5)


def test_sft_step_moves_only_adapters_and_opt_state_holds_only_adapters():
  mesh = make_mesh({"data": 1, "fsdp": 2, "tensor": 2})
  graphdef, params = transformer.init_params_sharded(CFG, jax.random.key(0), mesh)
  optimizer, schedule = _sft_opt()
  state, sharding = init_state_sharded(params, optimizer, jax.random.key(3), mesh)
  n_adapter = sum(x.size for x in jax.tree.leaves(lora.split_adapters(params)[0]))
  moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
  assert sum(x.size for x in moments) == 2 * n_adapter  # Adam mu and nu of the adapters only
  base_before = jax.device_get(lora.split_adapters(state.params)[1])
  adapters_before = jax.device_get(lora.split_adapters(state.params)[0])
  step = make_sft_step(graphdef, optimizer, schedule, mask_id=3, t_eps=1e-3, mesh=mesh,
                       state_sharding=sharding)
  tokens = jax.random.randint(jax.random.key(4), (4, 8), 4, BASE.vocab_size)
  batch = SequenceBatch(prompt_BP=tokens[:, :4], prompt_valid_BP=jnp.ones((4, 4), bool),
                        completion_BL=tokens[:, 4:], completion_valid_BL=jnp.ones((4, 4), bool))
  for i in range(2):  # the second step: B != 0, so A gets a gradient too
    state, metrics = step(state, batch, jax.random.key(5 + i))
  adapters, base = jax.device_get(lora.split_adapters(state.params))
  for x, y in zip(jax.tree.leaves(base_before), jax.tree.leaves(base)):
    np.testing.assert_array_equal(x, y)  # bit-identical base
  moved = [not np.array_equal(x, y) for x, y in
           zip(jax.tree.leaves(adapters_before), jax.tree.leaves(adapters))]
  assert all(moved)
  assert np.isfinite(float(metrics["loss"]))


def test_adapters_shard_like_their_base():
  mesh = make_mesh({"data": 1, "fsdp": 2, "tensor": 2})
  _, params = transformer.init_params_sharded(CFG, jax.random.key(0), mesh)
  attn, mlp = params["blocks"][0]["attn"], params["blocks"][0]["mlp"]
  spec = lambda v: tuple(v[...].sharding.spec)
  assert spec(attn["q_proj_lora"]["a"]) == ("fsdp", None)             # A: like q's input
  assert spec(attn["q_proj_lora"]["b"]) == ("fsdp", "tensor", None)   # B: like q's output,
  assert spec(attn["o_proj_lora"]["a"]) == ("tensor", None, "fsdp")   # the rank over 'fsdp'
  assert spec(attn["o_proj_lora"]["b"]) == (None, "fsdp")             # where it is free
  assert spec(mlp["down_proj_lora"]["a"]) == ("tensor", "fsdp")
  assert spec(mlp["up_proj_lora"]["b"]) == ("fsdp", "tensor")
  # Every adapter is split over the 4 devices or over 'fsdp' at least: none is whole anywhere.
  for path, v in jax.tree_util.tree_flatten_with_path(
      params, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]:
    if lora.is_adapter(v):
      assert "fsdp" in jax.tree.leaves(tuple(v[...].sharding.spec)), path


@pytest.mark.parametrize("key,value,name", [("rank", -1, "lora.rank"),
                                            ("targets", ("q", "qkv"), "lora.targets"),
                                            ("targets", ("q", "v", "q"), "named more than"),
                                            ("alpha", 0.0, "lora.alpha")])
def test_validation_names_the_key(key, value, name):
  config = base_config()
  config.lora.rank = 8
  config.lora[key] = value
  with pytest.raises((ConfigError, ConfigErrors)) as err:
    validate(config)
  assert name in str(err.value)


def test_rank_zero_is_the_plain_model():
  assert lora.configure(BASE, dict_ns(rank=0)) is BASE
  _, params = transformer.abstract_model(BASE)
  assert not lora.has_adapters(params)


def dict_ns(**kw):
  return types.SimpleNamespace(**{**vars(LORA), **kw})


def test_optimizer_update_of_base_is_zero():
  _, params = transformer.init_model(CFG, jax.random.key(0))
  optimizer, _ = _sft_opt()
  grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = jax.jit(optimizer.update)(grads, jax.jit(optimizer.init)(params), params)
  adapters, base = lora.split_adapters(updates)
  assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(base))
  assert all(np.any(np.asarray(x)) for x in jax.tree.leaves(adapters))
  assert optax.tree.norm(adapters) > 0


def test_base_gets_no_gradient():
  from dllm_rl.diffusion.sft import sft_loss
  graphdef, params = transformer.init_model(CFG, jax.random.key(0))
  params = _randomise_b(params, jax.random.key(2))
  tokens = jax.random.randint(jax.random.key(4), (2, 8), 4, BASE.vocab_size)
  batch = SequenceBatch(prompt_BP=tokens[:, :4], prompt_valid_BP=jnp.ones((2, 4), bool),
                        completion_BL=tokens[:, 4:], completion_valid_BL=jnp.ones((2, 4), bool))
  loss = lambda p: sft_loss(graphdef, lora.freeze_base(p), batch, jax.random.key(5), mask_id=3,
                            t_eps=1e-3)[0]
  adapters, base = lora.split_adapters(jax.jit(jax.grad(loss))(params))
  assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(base))
  assert all(np.any(np.asarray(x)) for x in jax.tree.leaves(adapters))


def test_a_rank_above_a_projections_dimensions_is_said():
  """The embedded default's projections are 64 wide at their narrowest: rank 100 is named with
  the projections it exceeds and the rank that uses all of them; rank 64 says nothing."""
  from dllm_rl.config.defaults import get_config
  from dllm_rl.models import lora as lora_lib
  from dllm_rl.train.context import model_config
  from dllm_rl.train.run_notes import lora_notes
  c = get_config()
  c.lora.rank, c.lora.targets = 100, ("q", "down")
  line, = lora_notes(lora_lib.configure(model_config(c, 20), c.lora))
  assert line.startswith("config.lora.rank=100 is above the rank the adapters of down_proj (64),"
                         " q_proj (64) can use")
  assert line.endswith("lora.rank=64 or less uses all of it")
  c.lora.rank = 64
  assert lora_notes(lora_lib.configure(model_config(c, 20), c.lora)) == []


def test_targets_that_adapt_nothing_are_a_config_error_naming_lora_targets():
  """MLP targets alone on a MoE model whose every layer routes (no dense layer, no shared
  expert) would give no adapter, and the run would train nothing: refused before anything is
  built; a shared expert, a dense layer or an attention target gives adapters."""
  from dllm_rl.train.context import check_lora_targets
  moe = dataclasses.replace(BASE, n_experts=4, experts_per_token=2, moe_hidden=8,
                            first_dense_layers=0, n_shared_experts=0)
  mlp_only = dict_ns(targets=("gate", "up", "down"))
  cfg = lora.configure(moe, mlp_only)
  assert not lora.has_adapters(transformer.abstract_model(cfg)[1])
  with pytest.raises(ConfigError) as err:
    check_lora_targets(cfg)
  assert err.value.key == "lora.targets" and "train nothing" in str(err.value)
  for ok in (lora.configure(dataclasses.replace(moe, n_shared_experts=1), mlp_only),
             lora.configure(dataclasses.replace(moe, first_dense_layers=1), mlp_only),
             lora.configure(moe, dict_ns(targets=("q", "gate"))), BASE):
    check_lora_targets(ok)
    assert ok is BASE or lora.has_adapters(transformer.abstract_model(ok)[1])


def test_peft_of_llada2_holds_the_fused_qkv_update(tmp_path):
  """LLaDA2's fused query_key_value gets one PEFT LoRA of rank n·r (n adapted parts of q | k |
  v; here q and v) whose (alpha_pattern / rank_pattern)·B·A equals the merged q, k, v rows
  minus the base; the unfused dense o_proj keeps rank r. (The PEFT folder held no q/k/v.)"""
  import json
  from safetensors.numpy import load_file
  from dllm_rl.models import hf, peft
  from tests.helpers import tiny_model
  cfg = lora.configure(tiny_model(n_layers=2, n_experts=4, experts_per_token=2, moe_hidden=8,
                                  n_shared_experts=1, first_dense_layers=1, qk_norm=True,
                                  n_kv_heads=1), dict_ns(targets=("q", "v", "o")))
  params = _randomise_b(transformer.init_model(cfg, jax.random.key(0))[1], jax.random.key(1))
  pure = jax.tree.map(np.asarray, nnx.to_pure_dict(params))
  peft.export_peft(pure, cfg, "llada2", str(tmp_path), "base")
  tensors = load_file(str(tmp_path / peft.WEIGHTS_FILE))
  config = json.load(open(tmp_path / peft.CONFIG_FILE))
  merged = lora.merge_pure(pure, cfg.lora_alpha / cfg.lora_rank)
  for i in range(2):
    attn, base = merged["blocks"][i]["attn"], pure["blocks"][i]["attn"]
    for module, names, kind in (("query_key_value", ("q_proj", "k_proj", "v_proj"), hf.IN),
                                ("dense", ("o_proj",), hf.OUT)):
      m = f"model.layers.{i}.attention.{module}"
      want = np.concatenate([hf.to_hf(np.asarray(attn[n], np.float32), kind)
                             - hf.to_hf(np.asarray(base[n], np.float32), kind) for n in names])
      a = tensors[f"base_model.model.{m}.lora_A.weight"]
      b = tensors[f"base_model.model.{m}.lora_B.weight"]
      r = config["rank_pattern"].get(m, config["r"])
      scale = config["alpha_pattern"].get(m, config["lora_alpha"]) / r
      assert a.shape[0] == b.shape[1] == r == (8 if module == "query_key_value" else 4)
      assert m in config["target_modules"] and np.abs(want).max() > 0
      np.testing.assert_allclose(scale * b @ a, want, atol=1e-6)


@pytest.mark.parametrize("fixture, task", [("llada_tiny", "CAUSAL_LM"), ("sdar_tiny", "CAUSAL_LM"),
                                           ("llada2_moe_tiny", "CAUSAL_LM"), ("dream_tiny", None)])
def test_peft_config_names_an_auto_class_its_base_has(fixture, task):
  """PEFT's auto classes read ``task_type`` (else ``auto_mapping``) to load the base; a
  folder with neither ("task_type": null alone, as written before) made
  ``AutoPeftModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`` fail with
  "Cannot infer the auto class from the config" (checked with peft 0.21.2 on exports of the
  tiny fixtures; with these fields it loads them and agrees with the merged export)."""
  import os
  from dllm_rl.models import hf, peft
  from tests.helpers import ROOT
  hf_config = hf.read_hf_config(os.path.join(ROOT, "tests", "fixtures", fixture))
  cfg = lora.configure(BASE, dict_ns(targets=("q",)))
  config = peft.adapter_config(cfg, ["m"], "/base", hf_config=hf_config)
  assert config["task_type"] == task
  if task is None:  # Dream's auto_map has AutoModel only: AutoPeftModel loads it through that
    assert config["auto_mapping"] == {"base_model_class": "AutoModel",
                                      "parent_library": "transformers"}
    assert "AutoModel" in hf_config["auto_map"]
  else:
    assert "auto_mapping" not in config and "AutoModelForCausalLM" in hf_config["auto_map"]
