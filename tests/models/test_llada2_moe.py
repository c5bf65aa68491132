"""LLaDA2 MoE (inclusionAI LLaDA2.0/2.1-mini): reference logits and routing, HF import/export,
sharding, the grouped-matmul dispatch against a dense reference, KV cache, scan, RL step.

Fixture: tests/fixtures/llada2_moe_tiny (README: a random 3-layer model, layer 0 dense and
layers 1-2 MoE with 16 experts, top-4 of 2 kept groups out of 4, scaling 2.5, partial RoPE
over 8 of 16 dims, run by the official PyTorch code).
"""

import dataclasses
import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from flax import nnx
from safetensors import safe_open

from dllm_rl.models import convert, hf, hf_export, layers, moe
from dllm_rl.models import transformer as T
from dllm_rl.parallel.constraints import under_mesh
from dllm_rl.parallel.mesh import make_mesh
from tests.helpers import tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "tests", "fixtures", "llada2_moe_tiny")
MINI = os.path.join(ROOT, "tests", "fixtures", "arch", "llada2_mini")
LOGIT_TOL = 1e-5  # README: float64 torch differs from the float32 reference by 2.8e-6
# README: expert choice counts over 96 tokens x 4 slots, block-causal forward, layers 1 and 2.
COUNTS = [[36, 57, 2, 31, 9, 16, 6, 16, 34, 3, 27, 30, 15, 27, 12, 63],
          [54, 13, 52, 37, 5, 0, 2, 9, 17, 49, 27, 10, 24, 4, 35, 46]]


@pytest.fixture(scope="module")
def tiny():
  return hf.load_checkpoint(TINY)


@pytest.fixture(scope="module")
def expected():
  return dict(np.load(os.path.join(TINY, "expected.npz")))


def _inputs(e, rows=slice(None)):
  tokens = jnp.asarray(e["input_ids"][rows], jnp.int32)
  positions = jnp.broadcast_to(jnp.asarray(e["position_ids"], jnp.int32), tokens.shape)
  return tokens, positions, jnp.asarray(e["attention_mask"][rows, 0] == 0)  # additive → bool


def _routing(m, tokens, positions, mask, mesh=None):
  fn = under_mesh(T.apply_routing, mesh)
  with jax.default_matmul_precision("highest"):
    return jax.jit(fn, static_argnums=0)(m.graphdef, m.params, tokens, positions, mask)


def _same_sets(idx_TK, expected_TK) -> float:
  """Fraction of tokens whose chosen experts equal the reference's as sets."""
  a, b = np.sort(np.asarray(idx_TK), -1), np.sort(expected_TK.reshape(idx_TK.shape), -1)
  return float((a == b).all(-1).mean())


def test_logits_and_routing_match_the_reference(tiny, expected):
  e = expected
  assert tiny.family == "llada2"
  assert (tiny.token_ids.mask_id, tiny.token_ids.eos_id, tiny.token_ids.pad_id) == (189, 186, 186)
  assert (int(e["mask_token_id"]), int(e["eos_token_id"])) == (189, 186)
  tokens, positions, mask = _inputs(e)
  for m, ref, ref_idx in ((mask, e["logits"], e["router_topk_idx"]),
                          (None, e["logits_full"], e["router_topk_idx_full"])):
    logits, routings = _routing(tiny, tokens, positions, m)
    err = float(np.abs(np.asarray(logits) - ref).max())
    print(f"{'block-causal' if m is not None else 'bidirectional'}: max |Δlogit| = {err:.2e}")
    assert err <= LOGIT_TOL
    assert len(routings) == 2 and list(e["moe_layer_ids"]) == [1, 2]
    for layer, r in enumerate(routings):
      assert _same_sets(r.idx_TK, ref_idx[layer]) == 1.0
  _, routings = _routing(tiny, tokens, positions, mask)
  for layer, r in enumerate(routings):  # same order (distinct biased scores): weights align
    np.testing.assert_array_equal(np.asarray(r.idx_TK), e["router_topk_idx"][layer].reshape(-1, 4))
    np.testing.assert_allclose(r.weight_TK, e["router_topk_weight"][layer].reshape(-1, 4),
                               atol=1e-6)
    np.testing.assert_allclose(np.asarray(r.weight_TK).sum(-1), 2.5, rtol=1e-6)
    np.testing.assert_allclose(r.logits_TE, e["router_logits"][layer].reshape(-1, 16), atol=1e-5)


@pytest.mark.parametrize("dispatch", ["ragged_dot", "tiled"])
def test_moe_dispatch_reaches_the_experts_and_matches_the_reference(tiny, expected, dispatch):
  """``model.moe_dispatch`` picks the experts' grouped matmuls (the tiled one lowers to while
  loops: its scan and searchsorted; XLA's ragged dot to none on this CPU); both give the
  official logits."""
  cfg = dataclasses.replace(tiny.model_cfg, moe_dispatch=dispatch)
  graphdef, _ = T.abstract_model(cfg)
  m = tiny._replace(model_cfg=cfg, graphdef=graphdef)
  tokens, positions, mask = _inputs(expected)
  logits, _ = _routing(m, tokens, positions, mask)
  assert float(np.abs(np.asarray(logits) - expected["logits"]).max()) <= LOGIT_TOL
  text = jax.jit(T.apply_routing, static_argnums=0).lower(
      graphdef, tiny.params, tokens, positions, mask).as_text()
  assert ("stablehlo.while" in text) == (dispatch == "tiled")


def test_hidden_states_match_the_reference(tiny, expected):
  tokens, positions, mask = _inputs(expected)
  model = nnx.merge(tiny.graphdef, tiny.params)

  def hidden(tokens, positions, mask):
    x, cos, sin, mask = model._inputs(tokens, positions, mask)
    out = [x]
    for block in model.blocks:
      out.append(block(x := out[-1], cos, sin, mask))
    return out[:-1] + [model.final_norm(out[-1])]

  with jax.default_matmul_precision("highest"):
    got = np.stack(jax.jit(hidden)(tokens, positions, mask))
  np.testing.assert_allclose(got, expected["hidden_states"], atol=1e-5)


def test_router_load_statistics(tiny, expected):
  _, routings = _routing(tiny, *_inputs(expected))
  for layer, r in enumerate(routings):
    stats = moe.load_stats(r.idx_TK, 16)
    np.testing.assert_allclose(stats["fraction_E"] * 96, COUNTS[layer], rtol=1e-6)
    np.testing.assert_allclose(float(stats["fraction_E"].sum()), 4.0, rtol=1e-6)
    assert float(stats["max_load"]) == max(COUNTS[layer])
    np.testing.assert_allclose(float(stats["imbalance"]), max(COUNTS[layer]) / 24, rtol=1e-6)
  # Padding tokens do not count: the first row only.
  valid = jnp.arange(96) < 32
  stats = moe.load_stats(routings[0].idx_TK, 16, valid)
  want = np.bincount(expected["router_topk_idx"][0, 0].reshape(-1), minlength=16) / 32
  np.testing.assert_allclose(stats["fraction_E"], want, rtol=1e-6)


def test_token_ids_and_config_of_the_real_architecture():
  cfg, ids = hf.model_config_from_hf(hf.read_hf_config(MINI), dtype="bfloat16")
  assert (ids.mask_id, ids.eos_id, ids.pad_id) == (156895, 156892, 156892)
  assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads) == (2048, 20, 16, 4)
  assert (cfg.head_dim, cfg.n_experts, cfg.experts_per_token) == (128, 256, 8)
  assert (cfg.moe_hidden, cfg.n_shared_experts) == (512, 1)
  assert (cfg.n_expert_groups, cfg.topk_groups, cfg.routed_scaling) == (8, 4, 2.5)
  assert (cfg.first_dense_layers, cfg.rotary_dim, cfg.mlp_hidden) == (1, 64, 5120)
  _, abstract = T.abstract_model(cfg)
  # README: index total_size = 16,255,638,528 parameters + 4864 expert-bias values, 14813 tensors.
  assert T.count_params(abstract) == 16_255_638_528 + 4864
  assert len(hf.tensor_table("llada2", cfg, nnx.to_pure_dict(abstract))) == 14813
  c = hf.read_hf_config(MINI) | {"mask_token_id": 7, "eos_token_id": 8}
  ids = hf.model_config_from_hf(c)[1]
  assert (ids.mask_id, ids.eos_id) == (7, 8)  # explicit keys win over the defaults


@pytest.mark.parametrize("key, value", [("use_qkv_bias", True), ("use_bias", True),
                                        ("rope_scaling", {"type": "linear", "factor": 2.0}),
                                        ("hidden_act", "gelu")])
def test_unsupported_options_are_named(key, value):
  c = hf.read_hf_config(TINY) | {key: value}
  with pytest.raises(ValueError, match=f"LLaDA2 option '{key}'"):
    hf.model_config_from_hf(c)


def test_export_import_round_trip_is_exact(tiny, tmp_path):
  cfg, ids, _, params, family = tiny
  hf_export.export_checkpoint(params, cfg, ids, family, str(tmp_path / "one"),
                              hf_config=hf.read_hf_config(TINY))
  for name in ("model.safetensors", "config.json"):
    with open(os.path.join(TINY, name), "rb") as a, open(tmp_path / "one" / name, "rb") as b:
      assert a.read() == b.read(), name
  # Sharded, config.json built from the family's keys; re-import gives the same model.
  files = hf_export.export_checkpoint(params, cfg, ids, family, str(tmp_path / "sharded"),
                                      max_shard_bytes=200_000)
  assert sum(f.endswith(".safetensors") for f in files) > 1
  assert convert.compare_tensors(TINY, str(tmp_path / "sharded")) == []
  cfg2, ids2, _, params2, family2 = hf.load_checkpoint(str(tmp_path / "sharded"))
  assert (cfg2, ids2, family2) == (cfg, ids, family)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    assert np.array_equal(a, b)


def _broken_copy(tmp_path, edit):
  out = tmp_path / "broken"
  out.mkdir()
  shutil.copy(os.path.join(TINY, "config.json"), out / "config.json")
  with safe_open(os.path.join(TINY, "model.safetensors"), framework="numpy") as f:
    tensors = {k: f.get_tensor(k) for k in f.keys()}
  edit(tensors)
  safetensors.numpy.save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
  return str(out)


def test_missing_and_misshaped_tensors_are_named(tmp_path):
  expert = "model.layers.1.mlp.experts.3.up_proj.weight"
  with pytest.raises(ValueError, match=f"tensor '{expert}' is missing"):
    hf.load_checkpoint(_broken_copy(tmp_path, lambda t: t.pop(expert)))
  qkv = "model.layers.2.attention.query_key_value.weight"
  shutil.rmtree(tmp_path / "broken")
  shapes = r"shape \(120, 64\), expected \(128, 64\)"
  with pytest.raises(ValueError, match=rf"tensor '{qkv}' .* {shapes}"):
    hf.load_checkpoint(_broken_copy(tmp_path, lambda t: t.update({qkv: t[qkv][:120]})))


def test_sharded_forward_equals_single_device(tiny, expected):
  """data 2 × fsdp 2 × tensor 2: experts stored E/2 per fsdp shard, F split over tensor,
  dispatch per batch shard in shard_map; same logits and routing as one device."""
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  sharded = hf.load_checkpoint(TINY, mesh=mesh)
  gate = sharded.params["blocks"][1]["mlp"]["gate_proj"][...]
  assert gate.sharding.spec == jax.sharding.PartitionSpec("fsdp", None, "tensor")
  assert gate.addressable_shards[0].data.shape == (8, 64, 16)
  rows = [0, 1, 2, 0]  # 4 rows: the batch divides data × fsdp
  tokens, positions, mask = _inputs(expected, rows)
  one_logits, one_r = _routing(tiny, tokens, positions, mask)
  logits, r = _routing(sharded, tokens, positions, mask, mesh=mesh)
  np.testing.assert_allclose(logits, one_logits, atol=1e-5)  # psum over tensor: 3.7e-6
  np.testing.assert_allclose(logits, expected["logits"][rows], atol=LOGIT_TOL)
  for a, b in zip(r, one_r):
    np.testing.assert_array_equal(np.asarray(a.idx_TK), np.asarray(b.idx_TK))


def _dense_reference(x_TD, idx_TK, w_TK, gate_EDF, up_EDF, down_EFD):
  """Every expert on every token, then the chosen ones combined (tests only)."""
  gate_TEF = jnp.einsum("td,edf->tef", x_TD, gate_EDF)
  h = jax.nn.silu(gate_TEF) * jnp.einsum("td,edf->tef", x_TD, up_EDF)
  y_TED = jnp.einsum("tef,efd->ted", h, down_EFD)
  combine_TE = (jax.nn.one_hot(idx_TK, gate_EDF.shape[0]) * w_TK[..., None]).sum(1)
  return jnp.einsum("ted,te->td", y_TED, combine_TE)


@pytest.mark.parametrize("dispatch", ["ragged_dot", "tiled"])
def test_grouped_dispatch_equals_the_dense_reference(dispatch):
  t, d, e, f, top = 40, 16, 8, 12, 3

  @jax.jit  # one program for the data, the routing and both passes (eager: 3x the CPU)
  def values_and_grads(key):
    k = jax.random.split(key, 6)
    x = jax.random.normal(k[0], (t, d))
    weights = [jax.random.normal(k[i], s) * 0.3 for i, s in
               ((1, (e, d, f)), (2, (e, d, f)), (3, (e, f, d)))]
    r = moe.route(x, jax.random.normal(k[4], (d, e)), 0.1 * jax.random.normal(k[5], (e,)),
                  top_k=top, n_groups=4, topk_groups=2, scaling=2.5)
    cot = jax.random.normal(k[4], (t, d))

    def loss(fn, x, w, *ws):
      return jnp.sum(fn(x, r.idx_TK, w, *ws) * cot)

    ragged = lambda x, i, w, *ws: moe.routed_experts(x[None], i[None], w[None], *ws,
                                                     dispatch=dispatch)[0]
    got = jax.value_and_grad(lambda *a: loss(ragged, *a), argnums=(0, 1, 2, 3, 4))(
        x, r.weight_TK, *weights)
    want = jax.value_and_grad(lambda *a: loss(_dense_reference, *a), argnums=(0, 1, 2, 3, 4))(
        x, r.weight_TK, *weights)
    return r.idx_TK, got, want

  with jax.default_matmul_precision("highest"):
    idx_TK, got, want = values_and_grads(jax.random.key(0))
  assert np.all(np.asarray(idx_TK) // 2 < 4) and len(set(np.asarray(idx_TK).ravel())) > 4
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
  for a, b in zip(got[1], want[1]):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_kv_cache_forward_equals_the_full_forward(tiny, expected):
  """Prefill 16 tokens block-causally into the cache, then block 4 against it."""
  tokens, positions, _ = _inputs(expected)
  cache = T.init_kv_cache(tiny.model_cfg, 3, 32)
  blocks = jnp.arange(16) // 4
  run = jax.jit(T.apply_cached, static_argnums=0, static_argnames="write")
  with jax.default_matmul_precision("highest"):
    _, cache = run(tiny.graphdef, tiny.params, tokens[:, :16], positions[:, :16], cache,
                   jnp.zeros((3, 32), bool), 0,
                   new_mask_TT=blocks[None, :] <= blocks[:, None], write=True)
    logits, _ = run(tiny.graphdef, tiny.params, tokens[:, 16:20], positions[:, 16:20], cache,
                    jnp.broadcast_to(jnp.arange(32) < 16, (3, 32)), 16, write=False)
  np.testing.assert_allclose(logits, expected["logits"][:, 16:20], atol=LOGIT_TOL)


@pytest.mark.parametrize("remat", ["none", "full"])
def test_scan_over_dense_and_moe_layers_equals_unrolled(tiny, expected, remat):
  cfg = dataclasses.replace(tiny.model_cfg, scan_layers=True, remat=remat)
  graphdef, _ = T.abstract_model(cfg)
  tokens, positions, mask = _inputs(expected)
  with jax.default_matmul_precision("highest"):
    logits = jax.jit(T.apply, static_argnums=0)(graphdef, tiny.params, tokens, positions, mask)
  np.testing.assert_allclose(logits, expected["logits"], atol=LOGIT_TOL)


MOE = dict(n_layers=2, qk_norm=True, n_experts=8, experts_per_token=2, moe_hidden=8,
           n_shared_experts=1, n_expert_groups=4, topk_groups=2, routed_scaling=2.5,
           first_dense_layers=1, rotary_dim=4, vocab_size=13, n_kv_heads=1)


def test_block_elbo_rl_step_trains_all_but_the_expert_bias():
  """StableDRL + block_elbo on a tiny LLaDA2-shaped model with AdamW (weight decay 0.1):
  finite metrics, every trainable parameter moves, the routing bias does not."""
  import types
  from dllm_rl.diffusion.estimators import EstimatorConfig
  from dllm_rl.parallel.shard import init_train_state
  from dllm_rl.rl.step import make_rl_step
  from dllm_rl.train.optim import make_optimizer
  from tests.helpers import random_rollout_batch, rl_step_config
  cfg = tiny_model(**MOE)
  graphdef, params = T.init_model(cfg, jax.random.key(0))
  bias = params["blocks"][1]["mlp"]["expert_bias"]
  bias.set_value(0.1 * jnp.arange(8, dtype=jnp.float32))
  opt, schedule = make_optimizer(types.SimpleNamespace(
      lr=1e-2, steps=10, warmup_steps=0, schedule="constant", b1=0.9, b2=0.99,
      weight_decay=0.1, grad_clip=1.0))
  est = EstimatorConfig(num_samples=1, block_size=4, attention_impl="reference")
  step_cfg = rl_step_config("stabledrl", "centered", "block_elbo", est, inner_steps=1,
                            num_states=4)
  # (copied: the skip counters of a fresh state share one buffer, and the step donates)
  state = jax.tree.map(jnp.copy, init_train_state(params, opt, jax.random.key(1)))
  before = jax.tree.map(np.asarray, state.params)
  step = make_rl_step(graphdef, opt, schedule, step_cfg)
  state, metrics = step(state, random_rollout_batch(0, 2, 4, 4, 8, 13, 4), jax.random.key(2))
  assert all(np.isfinite(np.asarray(v)).all() for v in metrics.values())
  assert float(metrics["grad_norm"]) > 0
  after = jax.tree.map(np.asarray, state.params)
  np.testing.assert_array_equal(after["blocks"][1]["mlp"]["expert_bias"],
                                before["blocks"][1]["mlp"]["expert_bias"])
  for name in ("router", "gate_proj", "down_proj"):
    assert not np.allclose(after["blocks"][1]["mlp"][name], before["blocks"][1]["mlp"][name])


def test_config_keys_build_the_moe_and_bad_values_name_their_key():
  from dllm_rl.config.schema import base_config
  from dllm_rl.errors import ConfigError
  from dllm_rl.train.context import model_config
  from dllm_rl.train.validate import validate
  from tests.helpers import set_dotted
  moe_keys = {f"model.{k}": v for k, v in MOE.items() if k not in ("vocab_size",)}
  c = set_dotted(base_config(), moe_keys)
  validate(c)
  cfg = model_config(c, 13)
  assert (cfg.n_experts, cfg.rotary_dim) == (8, 4)
  assert not cfg.is_moe_layer(0) and cfg.is_moe_layer(1)
  for bad, key in (({"model.n_expert_groups": 3}, "model.n_expert_groups"),
                   ({"model.experts_per_token": 0}, "model.experts_per_token"),
                   ({"model.topk_groups": 5}, "model.topk_groups"),
                   ({"model.rotary_dim": 5}, "model.rotary_dim"),
                   ({"model.first_dense_layers": 3}, "model.first_dense_layers")):
    with pytest.raises(ConfigError) as err:
      validate(set_dotted(base_config(), {**moe_keys, **bad}))
    assert err.value.key == key
  # the dispatch is a run option, not architecture: kept with an HF checkpoint's config.json
  from dllm_rl.train.hf_source import hf_model_config
  arch = hf_model_config(TINY, "float32", "float32", moe_dispatch="ragged_dot")
  assert arch.model_cfg.moe_dispatch == "ragged_dot"
  assert hf_export.config_differences(hf.read_hf_config(TINY), arch.model_cfg, arch.token_ids) == []


def test_partial_rotary_leaves_the_tail_unrotated():
  x = jax.random.normal(jax.random.key(0), (1, 5, 2, 16))
  cos, sin = layers.rope_tables(jnp.arange(5)[None], 8, 600000.0)
  out = layers.apply_rope(x, cos, sin)
  np.testing.assert_array_equal(out[..., 8:], x[..., 8:])
  np.testing.assert_allclose(out[:, 0], x[:, 0], atol=1e-7)  # position 0: no rotation
  assert not np.allclose(out[:, 1, :, :8], x[:, 1, :, :8])


def test_flops_count_the_active_experts_only():
  from dllm_rl.train import flops
  cfg = tiny_model(**MOE)
  attn = 16 * (2 + 2 * 1) * 8 + 2 * 8 * 16  # q, k, v (GQA, 1 kv head), o
  assert flops.layer_matmul_params(cfg, 0) == attn + 3 * 16 * 32  # dense first layer
  assert flops.layer_matmul_params(cfg, 1) == attn + 16 * 8 + 3 * 16 * 8 * (2 + 1)
  per_layer = lambda i: 2 * 5 * flops.layer_matmul_params(cfg, i) + 4 * 5 * 5 * 2 * 8
  assert flops.forward_flops(cfg, 5) == per_layer(0) + per_layer(1) + 2 * 16 * 13 * 5


@pytest.mark.parametrize("dispatch", ["ragged_dot", "tiled"])
def test_dispatch_under_vmap_and_its_gradients(dispatch):
  """The samplers vmap the model over G completions: the dispatch folds the mapped axis
  into its tokens; gradients through the vmapped dispatch equal the per-lane loop."""
  k = jax.random.split(jax.random.key(1), 6)
  g, t, d, e, f, top = 3, 10, 8, 4, 6, 2
  x = jax.random.normal(k[0], (g, t, d))
  ws = [jax.random.normal(k[i], s) * 0.3 for i, s in
        ((1, (e, d, f)), (2, (e, d, f)), (3, (e, f, d)))]
  idx = jax.random.randint(k[4], (g, t, top), 0, e)
  w = jax.random.uniform(k[5], (g, t, top))
  ragged = lambda x, i, w, *ws: moe.routed_experts(x[None], i[None], w[None], *ws,
                                                   dispatch=dispatch)[0]
  loss = lambda fn, x, w, *ws: jnp.sum(jnp.sin(fn(x, idx, w, *ws)))
  vmapped = lambda x, i, w, *ws: jax.vmap(ragged, (0, 0, 0, None, None, None))(x, i, w, *ws)
  looped = lambda x, i, w, *ws: jnp.stack([ragged(x[j], i[j], w[j], *ws) for j in range(g)])
  grads = lambda fn: jax.value_and_grad(lambda *a: loss(fn, *a), argnums=(0, 1, 2, 3, 4))
  with jax.default_matmul_precision("highest"):  # one program for both (the loop eager: 2x)
    got, want = jax.jit(lambda *a: (grads(vmapped)(*a), grads(looped)(*a)))(x, w, *ws)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
  for a, b in zip(got[1], want[1]):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_convert_cli_round_trip_through_orbax(tmp_path):
  """`convert roundtrip`: import (Orbax; the frozen routing bias too), export, equal bytes."""
  from dllm_rl import convert as convert_cli
  assert convert_cli.main(["roundtrip", "--hf_dir", TINY, "--tmp", str(tmp_path)]) == 0


@pytest.mark.slow
def test_llada2_production_config_runs_one_rl_step_at_tiny_size(tmp_path):
  """configs/llada2_tpu.py on the tiny fixture (blocks of 4 instead of 32), a local
  character-level tokenizer laid out like LLaDA2's specials (eos 186, mask 189) and a
  GSM8K-format file: one RL step through the real code path (block sampler, block_elbo)."""
  tokenizers = pytest.importorskip("tokenizers")
  import string
  from dllm_rl.config import load_config_file
  from dllm_rl.train import modes
  from tests.test_production_configs import _gsm8k, _tiny
  d = tmp_path / "llada2"
  d.mkdir()
  for f in ("config.json", "model.safetensors"):
    shutil.copy(os.path.join(TINY, f), d / f)
  chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
  vocab = {c: i for i, c in enumerate(chars)}
  vocab.update({f"<|reserved_{i}|>": i for i in range(len(chars), 192) if i not in (186, 189)})
  vocab.update({"<|endoftext|>": 186, "<|mask|>": 189})
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[],
                                                   unk_token="<|reserved_190|>"))
  tok.decoder = tokenizers.decoders.Fuse()
  tok.add_special_tokens(["<|endoftext|>", "<|mask|>"])
  tok.save(str(d / "tokenizer.json"))
  (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
  config = load_config_file(os.path.join(ROOT, "configs", "llada2_tpu.py"))
  config.model.block_size = 4
  config = _tiny(config, d, _gsm8k(tmp_path))
  summary = modes.run(config, str(tmp_path / "work"))
  assert summary["rl_steps"] == 1
  records = [json.loads(line) for line in open(tmp_path / "work" / "metrics.jsonl")]
  step = [r for r in records if r.get("phase") == "rl" and "reward_mean" in r]
  assert step and all(np.isfinite(float(step[0][k])) for k in ("loss", "grad_norm", "ratio_max"))
  # Router load per MoE layer (layers 1, 2) of the policy that rolled out: a token picks 4 of
  # 16 experts, so the busiest expert holds between 1/4 and all of the tokens.
  for layer in (1, 2):
    assert 0.25 <= step[0][f"router_max_fraction_l{layer}"] <= 1.0
    assert 1.0 <= step[0][f"router_imbalance_l{layer}"] <= 4.0
  assert "router_imbalance_l0" not in step[0]  # the dense first layer
  assert step[0]["router_imbalance_max"] == max(step[0][f"router_imbalance_l{i}"] for i in (1, 2))


@pytest.mark.slow
@pytest.mark.parametrize("expert", [1, 4])
def test_rl_step_compiles_for_a_tpu_slice_with_native_grouped_matmuls(expert):
  """configs/llada2_tpu.py at tiny size compiled for a v5p-8 (4 chips, FSDP 4, or expert
  parallelism 4) in this CPU process through libtpu: the expert matmuls lower to XLA's
  ragged dot (not the masked dense fallback jax uses on CPU), inside shard_map; with
  mesh.expert = 4 the rows travel by ragged_all_to_all (the TPU path of moe_ep); the
  block_elbo staircase attention (estimator.attention_impl=pallas) compiles to Mosaic
  kernels (tests/test_plan.py lowers SDAR's and leaves their libtpu compile to this test)."""
  from tests.test_plan import _tpu_available
  if not _tpu_available():
    pytest.skip("libtpu not installed (pip install -r requirements-tpu.txt)")
  from dllm_rl.config import load_config_file
  from dllm_rl.parallel import topology
  from dllm_rl.planning import programs
  config = load_config_file(os.path.join(ROOT, "configs", "llada2_tpu.py"))
  config.model.hf_checkpoint = TINY
  config.model.block_size = 4
  config.data.prompt_len, config.data.completion_len = 16, 16
  config.sampler.steps, config.sampler.block_len = 8, 4
  config.rl.batch_prompts, config.rl.group_size, config.eval.batch_size = 4, 2, 4
  config.mesh.expert = expert
  progs, mesh, model_cfg = programs.build_programs(config, topology.get_topology("v5p-8").devices)
  assert model_cfg.n_experts == 16
  assert dict(mesh.shape) == {"data": 1, "fsdp": 4 // expert, "expert": expert, "tensor": 1}
  rl_step = next(p for p in progs if p.name == "rl_step")
  lowered = rl_step.fn.lower(*rl_step.args)
  text = lowered.as_text()
  assert "chlo.ragged_dot" in text and "sdy.manual_computation" in text
  assert ("ragged_all_to_all" in text) == (expert > 1)
  compiled = lowered.compile()
  assert compiled.memory_analysis() is not None
  kernels = {m.group(1) for m in re.finditer(
      r'^\s*(?:ROOT )?%(staircase_\w+?)(?:\.\d+)* = .*custom_call_target="tpu_custom_call"',
      compiled.as_text(), re.M)}
  assert kernels == {"staircase_fwd", "staircase_dq", "staircase_dkdv"}, kernels


def test_router_metrics_count_each_layers_expert_load():
  """The logged router statistics equal counts of the routed expert sets of the reference
  (router_topk_idx of the block-causal forward, fixture README): the busiest expert of
  layer 1 takes 63 of the 96 tokens' 4 slots, of layer 2 54."""
  from dllm_rl.train.router_stats import router_metrics
  m = hf.load_checkpoint(TINY)
  data = np.load(os.path.join(TINY, "expected.npz"))
  ids = jnp.asarray(data["input_ids"], jnp.int32)
  b = ids.shape[0]
  with jax.default_matmul_precision("highest"):  # prompt of 4 (one block) + completion of 28
    got = router_metrics(m.graphdef, m.params, ids[:, :4], jnp.ones((b, 4), bool),
                         ids[:, None, 4:], moe_layers=(1, 2), block_size=4,
                         prompt_block_causal=True)
  for layer, idx in zip((1, 2), data["router_topk_idx"]):
    counts = np.bincount(idx.reshape(-1), minlength=16)
    np.testing.assert_allclose(float(got[f"router_max_fraction_l{layer}"]), counts.max() / 96,
                               rtol=1e-6)
    np.testing.assert_allclose(float(got[f"router_imbalance_l{layer}"]),
                               counts.max() / counts.mean(), rtol=1e-6)


def test_an_llada2_checkpoint_run_bidirectionally_is_said():
  """config.json holds no block size to check model.block_size against: block_size 0 on an
  LLaDA2 checkpoint (its official generate decodes blocks of 32, block-causally) is a note
  naming the setting that matches it; a block model, or another family, says nothing."""
  from dllm_rl.config.schema import base_config
  from dllm_rl.train.run_notes import family_notes
  config = base_config()
  assert config.model.block_size == 0
  (line,) = family_notes(config, "llada2")
  assert "attends bidirectionally" in line and "--config.model.block_size=32" in line
  assert family_notes(config, "llada") == [] and family_notes(config, None) == []
  config.model.block_size = 32
  assert family_notes(config, "llada2") == []
