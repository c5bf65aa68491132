"""Dream (DreamModel: Dream-v0 7B, DiffuCoder): the Qwen2-shaped bidirectional model with
q/k/v biases and the logit shift, against the PyTorch reference (tests/fixtures/dream_tiny).

The reference's raw row i scores token i + 1; its samplers realign with
``cat([raw[:, :1], raw[:, :-1]], 1)``. The framework's forwards return the realigned rows
(``logits_shifted``); ``apply_raw`` returns the raw ones (``logits``).
"""

import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open

from dllm_rl.models import convert, hf, hf_export, layers, logprob
from dllm_rl.models import transformer as T

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "dream_tiny")
# The fixture README: float64 torch differs from its float32 logits by ≤ 2.1e-6.
LOGIT_TOL = 1e-5


@pytest.fixture(scope="module")
def loaded():
  return hf.load_checkpoint(FIXTURE)


@pytest.fixture(scope="module")
def expected():
  return dict(np.load(os.path.join(FIXTURE, "expected.npz")))


def _arange(tokens):
  return jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)


@functools.partial(jax.jit, static_argnums=0)
def _raw_and_shifted(graphdef, params, tokens, positions, mask):
  return (T.apply_raw(graphdef, params, tokens, positions, mask),
          T.apply(graphdef, params, tokens, positions, mask))


def _err(a, b, where=None):
  d = np.abs(np.asarray(a) - np.asarray(b))
  return float((d[where] if where is not None else d).max())


def test_config_json_gives_a_biased_shifted_qwen2_model(loaded):
  cfg, ids, _, params, family = loaded
  assert family == "dream"
  assert ids == hf.TokenIds(mask_id=156, eos_id=150, pad_id=150, bos_id=150, block_size=None)
  assert (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_hidden) == (
      64, 4, 2, 16, 176)
  assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.tie_embeddings, cfg.qk_norm) == (
      1e6, 1e-6, False, False)
  assert cfg.qkv_bias and cfg.logit_shift
  attn = nnx.to_pure_dict(params)["blocks"][0]["attn"]
  assert attn["q_bias"].shape == (4, 16) and attn["k_bias"].shape == attn["v_bias"].shape == (2, 16)


def test_dream_7b_config_json_gives_the_7b_model_without_allocating():
  """Dream-v0-Instruct-7B's config.json (tests/fixtures/arch): its safetensors index has
  339 tensors and 15,231,233,024 bf16 bytes."""
  c = hf.read_hf_config(os.path.join(ROOT, "tests", "fixtures", "arch", "dream_v0_instruct_7b"))
  cfg, ids = hf.model_config_from_hf(c, dtype="bfloat16")
  assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (
      3584, 28, 28, 4, 128)
  assert (ids.mask_id, ids.eos_id, ids.pad_id) == (151666, 151643, 151643)
  _, abstract = T.abstract_model(cfg)
  assert T.count_params(abstract) * 2 == 15_231_233_024
  assert len(hf.FAMILIES["dream"].tensors(cfg)) == 339


def test_raw_and_per_position_logits_match_the_reference(loaded, expected):
  _, _, graphdef, params, _ = loaded
  tokens = jnp.asarray(expected["input_ids"], jnp.int32)
  with jax.default_matmul_precision("highest"):
    raw, shifted = _raw_and_shifted(graphdef, params, tokens, _arange(tokens), None)
  raw_err, shift_err = _err(raw, expected["logits"]), _err(shifted, expected["logits_shifted"])
  print(f"dream: max |Δlogit| raw {raw_err:.2e}, shifted {shift_err:.2e}")
  assert raw_err <= LOGIT_TOL and shift_err <= LOGIT_TOL
  # The shift is what the default forward returns: dropping it is off by far more.
  assert _err(shifted, expected["logits"]) > 1.0
  np.testing.assert_array_equal(shifted, T.shift_rows(raw))


def test_padded_forward_matches_the_reference_at_valid_positions(loaded, expected):
  """Left padding, key-padding mask (True = may attend). Pad queries attend nothing in
  the reference (zero rows) and are not compared; the shifted row after the last pad
  reads a pad row, so shifted rows are compared where their source row is valid."""
  _, _, graphdef, params, _ = loaded
  tokens = jnp.asarray(expected["pad_input_ids"], jnp.int32)
  valid = expected["pad_attention_mask_2d"].astype(bool)
  mask = jnp.asarray(valid)[:, None, :]
  with jax.default_matmul_precision("highest"):
    raw, shifted = _raw_and_shifted(graphdef, params, tokens, _arange(tokens), mask)
    posids, _ = _raw_and_shifted(graphdef, params, tokens,
                                 jnp.asarray(expected["pad_position_ids"], jnp.int32), mask)
  source_valid = np.asarray(T.shift_rows(jnp.asarray(valid))) & valid
  errs = (_err(raw, expected["pad_logits"], valid),
          _err(posids, expected["pad_logits_posids"], valid),
          _err(shifted, expected["pad_logits_shifted"], source_valid))
  print("dream padded: max |Δlogit| raw %.2e, position ids %.2e, shifted %.2e" % errs)
  assert max(errs) <= LOGIT_TOL
  assert valid.sum() < valid.size and source_valid.sum() < valid.sum()  # the masks do exclude


def test_loads_onto_a_sharded_mesh_with_the_same_logits(expected):
  """Biases carry logical axes: the load places them on a (data, fsdp, tensor) mesh."""
  from dllm_rl.parallel.mesh import make_mesh
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  m = hf.load_checkpoint(FIXTURE, mesh=mesh)
  q_bias = nnx.to_pure_dict(m.params)["blocks"][0]["attn"]["q_bias"]
  assert len(q_bias.sharding.device_set) == 8
  tokens = jnp.asarray(expected["input_ids"], jnp.int32)
  with jax.default_matmul_precision("highest"):
    raw, shifted = _raw_and_shifted(m.graphdef, m.params, tokens, _arange(tokens), None)
  assert _err(raw, expected["logits"]) <= LOGIT_TOL
  assert _err(shifted, expected["logits_shifted"]) <= LOGIT_TOL


def test_hidden_states_carry_the_shift_for_the_likelihood_path(loaded, expected):
  """``apply_hidden`` (estimators, SFT) is shifted before the head: log-probs from the
  hidden states equal those of the shifted logits."""
  _, _, graphdef, params, _ = loaded
  tokens = jnp.asarray(expected["input_ids"], jnp.int32)
  with jax.default_matmul_precision("highest"):
    h, head = T.apply_hidden(graphdef, params, tokens, _arange(tokens))
    logp, _ = logprob.logp_entropy(h, head, tokens, chunk=16)
  ref = logprob.token_log_probs(jnp.asarray(expected["logits_shifted"]), tokens)
  assert _err(logp, ref) <= LOGIT_TOL


WINDOW_STARTS = (0, 1, 9, 16)  # among the 24 new rows; 0 = no row before the window


@functools.partial(jax.jit, static_argnums=0)
def _cached(graphdef, params, tokens, starts):
  """As Dream's prefix-cache block sampler: a forward over the whole sequence fills the
  cache (block start), then rows [16, N) run against the cached keys of [0, 16): their
  logits, and those of ``window=(start, 8)`` for each (traced) start. The prefix
  keys/values are the whole forward's, so the new rows' raw outputs are the dense
  forward's rows [16, N). Returns (whole-sequence logits, new rows, windows)."""
  model = nnx.merge(graphdef, params)
  b, n = tokens.shape
  positions, none = _arange(tokens), jnp.zeros((b, n), bool)
  whole, cache = model.forward_cached(tokens, positions, T.init_kv_cache(model.cfg, b, n), none,
                                      0, write=True)
  valid = none.at[:, :16].set(True)
  rows = lambda **kw: model.forward_cached(tokens[:, 16:], positions[:, 16:], cache, valid, 16,
                                           write=False, **kw)[0]
  return whole, rows(), [rows(window=(s, 8)) for s in starts]


@pytest.fixture(scope="module")
def cached(loaded, expected):
  tokens = jnp.asarray(expected["input_ids"], jnp.int32)
  with jax.default_matmul_precision("highest"):
    return _cached(loaded.graphdef, loaded.params, tokens, jnp.asarray(WINDOW_STARTS))


def test_kv_cache_forward_shifts_among_the_new_rows(cached, expected):
  """As Dream's cached block sampler: the new rows' raw logits shifted among themselves
  (new row 0 keeps its own; the dense forward's row 0 of them reads the row before).
  From an empty cache that is the dense forward."""
  whole, new_rows, _ = cached
  assert _err(whole, expected["logits_shifted"]) <= LOGIT_TOL
  want = T.shift_rows(jnp.asarray(expected["logits"][:, 16:]))
  err = _err(new_rows, want)
  print(f"dream cached: max |Δlogit| {err:.2e}")
  assert err <= LOGIT_TOL
  assert _err(new_rows[:, 0], expected["logits_shifted"][:, 16]) > 1.0  # not the dense row


def test_kv_cache_window_equals_the_unwindowed_rows(cached):
  """``window=(start, 8)`` runs the last layer on rows [start - 1, start + 7) (or [0, 8)
  shifted among themselves at start 0), with a traced start as the samplers call it."""
  _, new_rows, windows = cached
  for start, window in zip(WINDOW_STARTS, windows):
    assert window.shape == (3, 8, 160)
    err = _err(window, new_rows[:, start:start + 8])
    print(f"dream window start {start}: max |Δlogit| vs un-windowed {err:.2e}")
    assert err <= 1e-5, start


def test_export_reproduces_the_checkpoint_bytes(loaded, tmp_path):
  cfg, ids, _, params, family = loaded
  hf_export.export_checkpoint(params, cfg, ids, family, str(tmp_path / "one"),
                              hf_config=hf.read_hf_config(FIXTURE))
  for name in ("model.safetensors", "config.json"):
    with open(os.path.join(FIXTURE, name), "rb") as a, open(tmp_path / "one" / name, "rb") as b:
      assert a.read() == b.read(), name
  # A config.json built from the family's keys (to_config) describes the same model.
  files = hf_export.export_checkpoint(params, cfg, ids, family, str(tmp_path / "sharded"),
                                      max_shard_bytes=100_000)
  assert sum(f.endswith(".safetensors") for f in files) > 1
  assert convert.compare_tensors(FIXTURE, str(tmp_path / "sharded")) == []
  cfg2, ids2, _, params2, family2 = hf.load_checkpoint(str(tmp_path / "sharded"))
  assert (cfg2, ids2, family2) == (cfg, ids, family)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    assert np.array_equal(a, b)


def test_convert_import_then_export_is_exact(tmp_path):
  """``python -m dllm_rl.convert`` folders: import (model.json + params), export back."""
  convert.import_hf(FIXTURE, str(tmp_path / "ckpt"))
  assert convert.read_meta(str(tmp_path / "ckpt"))["family"] == "dream"
  imported = convert.load_imported(str(tmp_path / "ckpt"))
  assert imported.model_cfg.qkv_bias and imported.model_cfg.logit_shift
  convert.export_hf(str(tmp_path / "ckpt"), str(tmp_path / "hf"))
  assert convert.compare_tensors(FIXTURE, str(tmp_path / "hf")) == []
  assert hf.read_hf_config(str(tmp_path / "hf")) == hf.read_hf_config(FIXTURE)


def _config_json(**changes):
  with open(os.path.join(FIXTURE, "config.json")) as f:
    c = json.load(f)
  c.update(changes)
  return c


@pytest.mark.parametrize("key,value", [("use_sliding_window", True), ("use_mrope", True),
                                       ("rope_scaling", {"type": "yarn", "factor": 4.0}),
                                       ("hidden_act", "gelu"), ("attention_bias", False),
                                       ("head_dim", 32)])
def test_unsupported_dream_options_are_named(key, value):
  with pytest.raises(ValueError, match=f"Dream option '{key}'"):
    hf.model_config_from_hf(_config_json(**{key: value}))


def test_detected_by_model_type_and_tied_head_is_supported(loaded, tmp_path):
  """``tie_word_embeddings: true``: no lm_head tensor is written or expected."""
  c = _config_json(architectures=None, tie_word_embeddings=True)
  cfg, ids = hf.model_config_from_hf(c)
  assert hf.detect_family(c) == "dream" and cfg.tie_embeddings
  pure = nnx.to_pure_dict(loaded.params)
  del pure["lm_head"]
  _, params = T.abstract_model(cfg)
  nnx.replace_by_pure_dict(params, pure)
  hf_export.export_checkpoint(params, cfg, ids, "dream", str(tmp_path))
  with safe_open(str(tmp_path / "model.safetensors"), framework="numpy") as f:
    assert len(list(f.keys())) == 26 and "lm_head.weight" not in f.keys()
  cfg2, ids2, _, params2, _ = hf.load_checkpoint(str(tmp_path))
  assert (cfg2, ids2) == (cfg, ids)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    assert np.array_equal(a, b)


def test_export_refuses_a_model_without_dream_features(loaded, tmp_path):
  cfg, ids, _, _, _ = loaded
  plain = T.ModelConfig(**{**cfg.__dict__, "logit_shift": False})
  _, params = T.abstract_model(plain)  # refused before any value is read
  with pytest.raises(ValueError, match="logit_shift"):
    hf_export.export_checkpoint(params, plain, ids, "dream", str(tmp_path))


def test_checkpoint_folder_with_an_unsupported_option_is_a_config_error(tmp_path):
  from dllm_rl.config import ConfigError
  from dllm_rl.train.hf_source import hf_model_config
  shutil.copytree(FIXTURE, tmp_path / "d")
  (tmp_path / "d" / "config.json").chmod(0o644)
  (tmp_path / "d" / "config.json").write_text(json.dumps(_config_json(use_sliding_window=True)))
  with pytest.raises(ConfigError, match="use_sliding_window"):
    hf_model_config(str(tmp_path / "d"), "float32", "float32")


def test_public_logits_are_the_official_raw_rows(loaded, expected):
  """``Pretrained.logits`` returns what the official forward returns: the raw rows, before
  the samplers' shift (built directly: the Dream generator is not in dllm_rl.zoo yet)."""
  from dllm_rl.zoo.pretrained import Pretrained
  cfg, ids, graphdef, params, family = loaded
  model = Pretrained(family, cfg, ids, hf.read_hf_config(FIXTURE), graphdef, params, FIXTURE,
                     generator="")
  valid = expected["pad_attention_mask_2d"]
  with jax.default_matmul_precision("highest"):
    plain = model.logits(expected["input_ids"])
    padded = model.logits(expected["pad_input_ids"], attention_mask_BL=valid)
  assert _err(plain, expected["logits"]) <= LOGIT_TOL
  assert _err(padded, expected["pad_logits"], valid.astype(bool)) <= LOGIT_TOL


# ------------------------------------------------------------------ config and runs

def test_config_model_keys_build_a_dream_shaped_model():
  """``--config.model.qkv_bias=True --config.model.logit_shift=True`` from the CLI: a
  from-scratch model with zero-initialised q/k/v biases that receive gradients."""
  from dllm_rl.config import cli
  from dllm_rl.train.context import model_config
  from tests.helpers import tiny_run_config
  config = tiny_run_config("sft")
  values = cli.typed_overrides(config, [("model.qkv_bias", "True"),
                                        ("model.logit_shift", "True")])
  assert values == {"model.qkv_bias": True, "model.logit_shift": True}
  config.model.qkv_bias = config.model.logit_shift = True
  cfg = model_config(config, vocab_size=20)
  assert cfg.qkv_bias and cfg.logit_shift
  attn = layers.Attention(cfg, nnx.Rngs(params=0))
  graphdef, params = nnx.split(attn, nnx.Param)
  for name, heads, axes in (("q_bias", cfg.n_heads, "heads"),
                            ("k_bias", cfg.n_kv_heads, "kv_heads"),
                            ("v_bias", cfg.n_kv_heads, "kv_heads")):
    bias = getattr(attn, name)
    assert bias.shape == (heads, cfg.head_dim) and not np.any(bias[...])
    assert bias.get_metadata("logical_axes") == (axes, "head_dim")
  x = jax.random.normal(jax.random.key(1), (2, 6, cfg.d_model))
  cos, sin = layers.rope_tables(_arange(x[..., 0]), cfg.head_dim, cfg.rope_theta)

  def loss(p):
    return jnp.sum(nnx.merge(graphdef, p)(x, cos, sin, None) ** 2)

  grads = nnx.to_pure_dict(jax.jit(jax.grad(loss))(params))
  assert all(np.any(grads[k]) for k in ("q_bias", "k_bias", "v_bias"))


@pytest.mark.slow
def test_sft_then_rl_on_a_dream_shaped_model_from_scratch(tmp_path):
  """The pipeline (SFT → RL with the default StableDRL loss → eval) with q/k/v biases and
  the logit shift on."""
  from dllm_rl.train import modes as run
  from tests.helpers import tiny_run_config
  config = tiny_run_config("pipeline", {
      "model.qkv_bias": True, "model.logit_shift": True, "data.batch_size": 16,
      "sft.steps": 2, "sft.eval_every": 0, "sft.log_every": 1, "rl.steps": 1,
      "rl.eval_every": 0, "rl.log_every": 1, "task.test_size": 8, "task.val_size": 8})
  assert config.rl.loss == "stabledrl"
  summary = run.run(config, str(tmp_path))
  assert summary["sft_steps"] == 2 and summary["rl_steps"] == 1
  assert np.isfinite(summary["rl_accuracy"])
  records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  for phase, key in (("sft", "loss"), ("rl", "grad_norm")):
    logged = [r[key] for r in records if r.get("phase") == phase and key in r]
    assert logged and all(np.isfinite(float(v)) for v in logged), phase


def _hf_dir(tmp_path):
  """The fixture plus a character-level HF tokenizer: ids < 150 characters and reserved
  tokens, 150 <|endoftext|> (EOS = pad), 151-155 chat tokens, 156 <|mask|>."""
  tokenizers = pytest.importorskip("tokenizers")
  d = tmp_path / "dream_tiny"
  d.mkdir()
  for f in ("config.json", "model.safetensors", "generation_config.json"):
    shutil.copy(os.path.join(FIXTURE, f), d / f)
  chars = [c for c in "0123456789+-=*/ ?\nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"]
  vocab = {c: i for i, c in enumerate(chars)}
  vocab.update({f"<|reserved_{i}|>": i for i in range(len(chars), 150)})
  special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|c3|>", "<|c4|>", "<|c5|>",
             "<|mask|>", "<|u7|>", "<|u8|>", "<|unk|>"]
  vocab.update({t: 150 + i for i, t in enumerate(special)})
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[], unk_token="<|unk|>"))
  tok.decoder = tokenizers.decoders.Fuse()
  tok.add_special_tokens(special[:7])
  tok.save(str(d / "tokenizer.json"))
  (d / "tokenizer_config.json").write_text(json.dumps({
      "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "mask_token": "<|mask|>",
      "chat_template": "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>"
                       "{% endfor %}{% if add_generation_prompt %}<|im_start|>{% endif %}"}))
  return d


@pytest.mark.slow
@pytest.mark.parametrize("advantage, kind", [("centered", "masked"), ("steprs", "dream")])
def test_rl_from_the_fixture_through_model_hf_checkpoint(tmp_path, capsys, advantage, kind):
  """``model.hf_checkpoint`` = the Dream fixture (with a tokenizer): the architecture, ids
  and weights come from it; one RL step with the default StableDRL loss (centered GRPO
  advantages, or StepRS's state-dependent risk-sensitive ones, whose states are the steps
  Dream's own sampler committed each token at: ``sampler.kind=dream``), then test eval."""
  from dllm_rl.train import modes as run
  from dllm_rl.train.context import build_context
  from tests.helpers import tiny_run_config
  config = tiny_run_config("rl", {
      "model.hf_checkpoint": str(_hf_dir(tmp_path)), "data.prompt_len": 24,
      "rl.steps": 1, "rl.eval_every": 0, "rl.log_every": 1, "task.test_size": 8,
      "task.val_size": 8, "rl.advantage": advantage, "sampler.kind": kind,
      "sampler.remasking": "entropy" if kind == "dream" else "low_confidence"})
  ctx = build_context(config, str(tmp_path / "ctx"))
  assert ctx.model_cfg.qkv_bias and ctx.model_cfg.logit_shift and ctx.model_cfg.vocab_size == 160
  assert (ctx.tokenizer.mask_id, ctx.tokenizer.eos_id) == (156, 150)
  capsys.readouterr()
  summary = run.run(config, str(tmp_path / "work"))
  assert summary["rl_steps"] == 1
  said = "a Dream model (its logit shift) with config.sampler.kind='masked' decodes with LLaDA's"
  assert (said in capsys.readouterr().err) == (kind == "masked")
  records = [json.loads(line) for line in open(tmp_path / "work" / "metrics.jsonl")]
  step = [r for r in records if r.get("phase") == "rl" and "reward_mean" in r]
  assert step and all(np.isfinite(float(step[0][k])) for k in ("loss", "grad_norm"))
