"""Dream (DreamModel: Dream-v0 7B, DiffuCoder): the Qwen2-shaped bidirectional model with
q/k/v biases and the logit shift, against the PyTorch reference (tests/fixtures/dream_tiny).

The reference's raw row i scores token i + 1; its samplers realign with
``cat([raw[:, :1], raw[:, :-1]], 1)``. The framework's forwards return the realigned rows
(``logits_shifted``); ``apply_raw`` returns the raw ones (``logits``).
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dllm_rl.models import convert, hf, logprob
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


def test_raw_and_per_position_logits_match_the_reference(loaded, expected):
  _, _, graphdef, params, _ = loaded
  tokens = jnp.asarray(expected["input_ids"], jnp.int32)
  with jax.default_matmul_precision("highest"):
    raw = jax.jit(T.apply_raw, static_argnums=0)(graphdef, params, tokens, _arange(tokens))
    shifted = jax.jit(T.apply, static_argnums=0)(graphdef, params, tokens, _arange(tokens))
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
    raw = T.apply_raw(graphdef, params, tokens, _arange(tokens), mask)
    shifted = T.apply(graphdef, params, tokens, _arange(tokens), mask)
    posids = T.apply_raw(graphdef, params, tokens,
                         jnp.asarray(expected["pad_position_ids"], jnp.int32), mask)
  source_valid = np.asarray(T.shift_rows(jnp.asarray(valid))) & valid
  errs = (_err(raw, expected["pad_logits"], valid),
          _err(posids, expected["pad_logits_posids"], valid),
          _err(shifted, expected["pad_logits_shifted"], source_valid))
  print("dream padded: max |Δlogit| raw %.2e, position ids %.2e, shifted %.2e" % errs)
  assert max(errs) <= LOGIT_TOL
  assert valid.sum() < valid.size and source_valid.sum() < valid.sum()  # the masks do exclude


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


def _cached(graphdef, params, tokens, prefix, **kw):
  """As Dream's prefix-cache block sampler: a forward over the whole sequence fills the
  cache (block start), then rows [prefix, N) run against the cached keys of [0, prefix).
  The prefix keys/values are the whole forward's, so the new rows' raw outputs are the
  dense forward's rows [prefix, N)."""
  model = nnx.merge(graphdef, params)
  b, n = tokens.shape
  positions, none = _arange(tokens), jnp.zeros((b, n), bool)
  first, cache = model.forward_cached(tokens, positions, T.init_kv_cache(model.cfg, b, n), none,
                                      0, write=True)
  if not prefix:
    return first
  valid = none.at[:, :prefix].set(True)
  return model.forward_cached(tokens[:, prefix:], positions[:, prefix:], cache, valid, prefix,
                              write=False, **kw)[0]


def test_kv_cache_forward_shifts_among_the_new_rows(loaded, expected):
  """As Dream's cached block sampler: the new rows' raw logits shifted among themselves
  (new row 0 keeps its own; the dense forward's row 0 of them reads the row before).
  From an empty cache that is the dense forward."""
  _, _, graphdef, params, _ = loaded
  tokens = jnp.asarray(expected["input_ids"], jnp.int32)
  with jax.default_matmul_precision("highest"):
    whole = _cached(graphdef, params, tokens, 0)
    new_rows = _cached(graphdef, params, tokens, 16)
  assert _err(whole, expected["logits_shifted"]) <= LOGIT_TOL
  want = T.shift_rows(jnp.asarray(expected["logits"][:, 16:]))
  err = _err(new_rows, want)
  print(f"dream cached: max |Δlogit| {err:.2e}")
  assert err <= LOGIT_TOL
  assert _err(new_rows[:, 0], expected["logits_shifted"][:, 16]) > 1.0  # not the dense row


@pytest.mark.parametrize("start", [0, 1, 9, 16])
def test_kv_cache_window_equals_the_unwindowed_rows(loaded, expected, start):
  """``window=(start, 8)`` runs the last layer on rows [start - 1, start + 7) (or [0, 8)
  shifted among themselves at start 0); traced start, as the samplers call it."""
  _, _, graphdef, params, _ = loaded
  tokens = jnp.asarray(expected["input_ids"], jnp.int32)
  with jax.default_matmul_precision("highest"):
    full = _cached(graphdef, params, tokens, 16)
    window = jax.jit(lambda s: _cached(graphdef, params, tokens, 16, window=(s, 8)))(start)
  assert window.shape == (3, 8, 160)
  assert _err(window, full[:, start:start + 8]) <= 1e-5


def test_export_reproduces_the_checkpoint_bytes(loaded, tmp_path):
  cfg, ids, _, params, family = loaded
  hf.export_checkpoint(params, cfg, ids, family, str(tmp_path / "one"),
                       hf_config=hf.read_hf_config(FIXTURE))
  for name in ("model.safetensors", "config.json"):
    with open(os.path.join(FIXTURE, name), "rb") as a, open(tmp_path / "one" / name, "rb") as b:
      assert a.read() == b.read(), name
  # A config.json built from the family's keys (to_config) describes the same model.
  files = hf.export_checkpoint(params, cfg, ids, family, str(tmp_path / "sharded"),
                               max_shard_bytes=100_000)
  assert sum(f.endswith(".safetensors") for f in files) > 1
  assert convert.compare_tensors(FIXTURE, str(tmp_path / "sharded")) == []
  cfg2, ids2, _, params2, family2 = hf.load_checkpoint(str(tmp_path / "sharded"))
  assert (cfg2, ids2, family2) == (cfg, ids, family)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    assert np.array_equal(a, b)


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


def test_detected_by_model_type_and_tied_head_is_supported(tmp_path):
  c = _config_json(architectures=None, tie_word_embeddings=True)
  cfg, _ = hf.model_config_from_hf(c)
  assert hf.detect_family(c) == "dream" and cfg.tie_embeddings
  _, params = T.init_model(cfg, jax.random.key(0))
  _, ids = hf.model_config_from_hf(c)
  hf.export_checkpoint(params, cfg, ids, "dream", str(tmp_path))
  cfg2, ids2, _, params2, _ = hf.load_checkpoint(str(tmp_path))
  assert (cfg2, ids2) == (cfg, ids)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    assert np.array_equal(a, b)


def test_export_refuses_a_model_without_dream_features(loaded, tmp_path):
  cfg, ids, _, _, _ = loaded
  plain = T.ModelConfig(**{**cfg.__dict__, "logit_shift": False})
  _, params = T.init_model(plain, jax.random.key(0))
  with pytest.raises(ValueError, match="logit_shift"):
    hf.export_checkpoint(params, plain, ids, "dream", str(tmp_path))


def test_checkpoint_folder_with_an_unsupported_option_is_a_config_error(tmp_path):
  from dllm_rl.config import ConfigError
  from dllm_rl.train.context import hf_model_config
  shutil.copytree(FIXTURE, tmp_path / "d")
  (tmp_path / "d" / "config.json").chmod(0o644)
  (tmp_path / "d" / "config.json").write_text(json.dumps(_config_json(use_sliding_window=True)))
  with pytest.raises(ConfigError, match="use_sliding_window"):
    hf_model_config(str(tmp_path / "d"), "float32", "float32")

