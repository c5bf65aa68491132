"""SDAR-8B-Chat's architecture (Qwen3-8B sizes) through the real loading code: an HF folder
holding only config.json, read by ``programs.model_and_tokens`` (hf_source.hf_model_config), gives
the 8B ModelConfig and its parameter count; every program of configs/sdar_tpu.py lowers from
abstract shapes on cpu:8 (compiling them takes minutes: the v5p-64 plan is in docs/scale.md)."""

import json
import os

import jax
import numpy as np
import pytest

from dllm_rl.planning import programs
from dllm_rl.config import load_config_file
from dllm_rl.models import transformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# SDAR-8B-Chat is trained from Qwen3-8B: these sizes are Qwen3-8B's; token ids are Qwen3's
# (<|endoftext|> 151643, <|im_end|> 151645) and SDAR's added mask token.
SDAR_8B = dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, intermediate_size=12288, vocab_size=151936,
               block_size=4, max_position_embeddings=40960, max_window_layers=36,
               torch_dtype="bfloat16", bos_token_id=151643, eos_token_id=151645,
               mask_token_id=151669)


def write_sdar_8b_config(directory, **overrides) -> str:
  """The sdar_tiny fixture's config.json (same keys and format) with SDAR-8B's sizes."""
  cfg = json.load(open(os.path.join(ROOT, "tests", "fixtures", "sdar_tiny", "config.json")))
  cfg.update(SDAR_8B, **overrides)
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as fh:
    json.dump(cfg, fh, indent=2)
  return str(directory)


def qwen3_param_count(d, layers, heads, kv_heads, head_dim, mlp, vocab) -> int:
  """Parameters of a Qwen3 decoder with an untied head: embedding and lm_head (V·D each),
  per layer q/o (D·H·Q each), k/v (D·K·Q each), SwiGLU gate/up/down (D·F each), two RMSNorm
  scales (D) and the q/k norms (Q each); the final norm (D)."""
  attn = 2 * d * heads * head_dim + 2 * d * kv_heads * head_dim
  per_layer = attn + 3 * d * mlp + 2 * d + 2 * head_dim
  return 2 * vocab * d + layers * per_layer + d


def _sdar_config(hf_dir):
  c = load_config_file(os.path.join(ROOT, "configs", "sdar_tpu.py"))
  c.model.hf_checkpoint = hf_dir
  return c


def test_sdar_8b_config_json_loads_to_the_8b_model(tmp_path):
  config = _sdar_config(write_sdar_8b_config(tmp_path / "sdar_8b"))
  model_cfg, mask_id, eos_id = programs.model_and_tokens(config)
  assert (model_cfg.d_model, model_cfg.n_layers, model_cfg.n_heads, model_cfg.n_kv_heads,
          model_cfg.head_dim, model_cfg.mlp_hidden, model_cfg.vocab_size) == (
              4096, 36, 32, 8, 128, 12288, 151936)
  assert model_cfg.qk_norm and not model_cfg.tie_embeddings
  assert model_cfg.scan_layers and model_cfg.remat == "full"  # as configs/llada_tpu.py
  assert model_cfg.param_dtype == np.float32 and model_cfg.dtype == jax.numpy.bfloat16
  assert (mask_id, eos_id) == (151669, 151645)

  _, abstract = transformer.abstract_model(model_cfg)
  count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract))
  assert count == qwen3_param_count(4096, 36, 32, 8, 128, 12288, 151936)
  assert 8.15e9 < count < 8.25e9  # Qwen3-8B: "8.2B" parameters


@pytest.mark.slow
def test_sdar_8b_programs_lower_from_abstract_shapes_on_cpu8(tmp_path):
  """configs/sdar_tpu.py's official batch (32 prompts × 16, P = L = 256), 8B widths and
  vocabulary, 2 of the 36 layers (36 take ~20 s to trace: the samplers' KV caches are per
  layer): rl_step and both samplers trace and lower for 8 CPU devices from shapes only. CPU
  has no compiled Pallas kernel, so the staircase attention is the dense reference here."""
  config = _sdar_config(write_sdar_8b_config(tmp_path / "sdar_8b", num_hidden_layers=2))
  config.estimator.attention_impl = "auto"
  progs, mesh, model_cfg = programs.build_programs(config, jax.devices("cpu")[:8])
  assert [p.name for p in progs] == ["rl_step", "rollout_sampler", "greedy_sampler"]
  assert model_cfg.n_layers == 2
  assert dict(mesh.shape) == {"data": 1, "fsdp": 8, "expert": 1, "tensor": 1}
  for p in progs:
    text = p.fn.lower(*p.args).as_text()
    assert "151936x4096" in text, p.name  # the 8B embedding reaches every program


def test_param_count_formula_matches_the_model_at_small_size():
  """The formula against the model's own count at a small, asymmetric shape (GQA, H·Q ≠ D)."""
  cfg = transformer.ModelConfig(vocab_size=96, d_model=48, n_layers=3, n_heads=6,
                                n_kv_heads=2, head_dim=16, mlp_hidden=80, qk_norm=True)
  _, abstract = transformer.abstract_model(cfg)
  count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract))
  assert count == qwen3_param_count(48, 3, 6, 2, 16, 80, 96)
