"""Hugging Face checkpoints ⇄ :class:`~dllm_rl.models.transformer.Transformer` params.

Supported families (detected from ``config.json`` ``architectures`` / ``model_type``):

* ``"llada"`` — ``LLaDAModelLM`` (GSAI-ML LLaDA-8B, OLMo-style names
  ``model.transformer.{wte, blocks.i.*, ln_f, ff_out}``), bidirectional.
* ``"sdar"`` — ``SDARForCausalLM`` (JetLM SDAR, Qwen3-style names
  ``model.{embed_tokens, layers.i.*, norm}``, ``lm_head``) with qk-norm; the
  caller passes the block-causal mask (``block_size`` in :class:`TokenIds`).
* ``"dream"`` — ``DreamModel`` (Dream-org Dream-v0 7B, DiffuCoder; Qwen2-style
  names) with q/k/v biases, bidirectional, and the logit shift (raw row i
  scores token i + 1; ``ModelConfig.logit_shift``, dllm_rl.models.transformer).

Layouts: HF stores torch ``(out, in)`` matrices. The framework stores
``x @ W`` kernels with heads split out: q ``[D, H, Q]``, k/v ``[D, K, Q]``,
o ``[H, Q, D]``, gate/up ``[D, F]``, down ``[F, D]``, lm_head ``[D, V]``, q bias
``[H, Q]``, k/v biases ``[K, Q]``. Every mapping is one of four kinds: ``copy``
(embeddings, norm scales), ``in`` (HF ``(prod(rest), D0)`` →
``W.T.reshape(D0, *rest)``), ``out`` (HF ``(Dlast, prod(rest))`` →
``W.T.reshape(*rest, Dlast)``) and ``flat`` (HF ``(prod(shape),)`` →
``b.reshape(shape)``: the per-head biases).

Loading streams tensor by tensor: every name and shape is checked from the
safetensors headers first, then each tensor is read, viewed in the framework
layout and placed straight onto its sharding (each device copies only its
slice), so the model is never held twice in host memory. Export gathers one
parameter at a time and writes safetensors files itself (header first, then
the data), in the byte layout ``safetensors`` uses (tensors sorted by dtype
then name, ``{"format": "pt"}`` metadata), so an import → export round trip
reproduces the original file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from typing import Any, Callable, NamedTuple

import jax
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import safe_open

from dllm_rl.models.transformer import ModelConfig, abstract_model
from dllm_rl.parallel.mesh import make_mesh
from dllm_rl.parallel.shard import param_shardings
from dllm_rl.types import DTYPES

COPY, IN, OUT, FLAT = "copy", "in", "out", "flat"
# safetensors dtype code → numpy dtype; the order is safetensors' own (files are
# sorted by dtype, highest first, then by name).
ST_DTYPES = {"F16": np.float16, "BF16": ml_dtypes.bfloat16, "F32": np.float32, "F64": np.float64}
_ST_RANK = {code: i for i, code in enumerate(ST_DTYPES)}
_ST_CODE = {np.dtype(v).name: k for k, v in ST_DTYPES.items()}
_MISSING = object()


class LoadedModel(NamedTuple):
  """A Hugging Face checkpoint loaded by :func:`load_checkpoint`."""

  model_cfg: ModelConfig
  token_ids: "TokenIds"
  graphdef: Any
  params: Any          # nnx.State placed on its shardings
  family: str          # "llada" | "sdar" | "dream"


@dataclasses.dataclass(frozen=True)
class TokenIds:
  """Special token ids read from the checkpoint's config.json (None = absent)."""

  mask_id: int
  eos_id: int | None
  pad_id: int | None
  bos_id: int | None
  block_size: int | None  # SDAR decoding block length; None for LLaDA and Dream


@dataclasses.dataclass(frozen=True)
class Family:
  name: str
  architecture: str
  model_type: str
  parse: Callable[[dict], tuple[dict, TokenIds]]            # config.json → ModelConfig kwargs
  to_config: Callable[[ModelConfig, TokenIds], dict]         # inverse (a fresh config.json)
  tensors: Callable[[ModelConfig], list[tuple[str, tuple, str]]]  # (HF name, param path, kind)


# ----------------------------------------------------------------------------- config.json

def _get(c: dict, key: str, default: Any = _MISSING) -> Any:
  value = c.get(key, default)
  if value is _MISSING:
    raise ValueError(f"config.json: required key {key!r} is missing")
  return value


def _check_options(c: dict, family: str, allowed: dict[str, tuple[tuple, Any]]) -> None:
  """``allowed``: key → (supported values, value assumed when the key is absent)."""
  for key, (ok, default) in allowed.items():
    value = c.get(key, default)
    if value not in ok:
      shown = "absent (reference default differs)" if value is _MISSING else repr(value)
      raise ValueError(f"config.json: {family} option {key!r} = {shown} is not supported "
                       f"(supported: {', '.join(map(repr, ok))})")


def _first(value: Any) -> int | None:
  """An id that HF may give as a list (several EOS ids): the first one."""
  if isinstance(value, (list, tuple)):
    return int(value[0]) if value else None
  return None if value is None else int(value)


_LLADA_OPTIONS = {
    "alibi": ((False,), False), "include_bias": ((False,), _MISSING),
    "include_qkv_bias": ((False,), False), "bias_for_layer_norm": ((False, None), None),
    "layer_norm_type": (("rms",), _MISSING), "layer_norm_with_affine": ((True,), True),
    "block_type": (("llama",), _MISSING), "activation_type": (("silu",), _MISSING),
    "rope": ((True,), _MISSING), "scale_logits": ((False,), False),
    "input_emb_norm": ((False,), False), "attention_layer_norm": ((False,), False),
    "block_group_size": ((1,), 1), "clip_qkv": ((None,), None),
}


def _llada_parse(c: dict) -> tuple[dict, TokenIds]:
  _check_options(c, "LLaDA", _LLADA_OPTIONS)
  d, heads = int(_get(c, "d_model")), int(_get(c, "n_heads"))
  kv, mqa = c.get("n_kv_heads"), c.get("multi_query_attention")
  if mqa is not None and kv is not None and int(kv) != (1 if mqa else heads):
    raise ValueError(f"config.json: 'n_kv_heads'={kv} contradicts 'multi_query_attention'={mqa}")
  kv = int(kv) if kv is not None else (1 if mqa else heads)
  if d % heads:
    raise ValueError(f"config.json: 'd_model'={d} is not a multiple of 'n_heads'={heads}")
  mlp = c.get("mlp_hidden_size") or int(_get(c, "mlp_ratio")) * d
  vocab = c.get("embedding_size") or _get(c, "vocab_size")  # wte rows = embedding_size
  kwargs = dict(vocab_size=int(vocab), d_model=d, n_layers=int(_get(c, "n_layers")),
                n_heads=heads, n_kv_heads=kv, head_dim=d // heads, mlp_hidden=int(mlp),
                rope_theta=float(c.get("rope_theta", 10000.0)),
                rms_norm_eps=float(c.get("rms_norm_eps", 1e-5)),
                tie_embeddings=bool(c.get("weight_tying", True)), qk_norm=False)
  ids = TokenIds(mask_id=int(_get(c, "mask_token_id")), eos_id=_first(c.get("eos_token_id")),
                 pad_id=_first(c.get("pad_token_id")), bos_id=_first(c.get("bos_token_id")),
                 block_size=None)
  return kwargs, ids


def _llada_config(m: ModelConfig, ids: TokenIds) -> dict:
  c = {k: (ok[0] if default is _MISSING else default) for k, (ok, default) in _LLADA_OPTIONS.items()}
  c.update(architectures=["LLaDAModelLM"], model_type="llada",
           auto_map={"AutoConfig": "configuration_llada.LLaDAConfig",
                     "AutoModel": "modeling_llada.LLaDAModelLM",
                     "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
           d_model=m.d_model, n_heads=m.n_heads, n_kv_heads=m.n_kv_heads, n_layers=m.n_layers,
           mlp_hidden_size=m.mlp_hidden, mlp_ratio=4, vocab_size=m.vocab_size,
           embedding_size=m.vocab_size, rope_theta=m.rope_theta, rms_norm_eps=m.rms_norm_eps,
           weight_tying=m.tie_embeddings, rope_full_precision=True, multi_query_attention=None,
           attention_dropout=0.0, embedding_dropout=0.0, residual_dropout=0.0, use_cache=False,
           mask_token_id=ids.mask_id, eos_token_id=ids.eos_id, pad_token_id=ids.pad_id)
  if ids.bos_id is not None:
    c["bos_token_id"] = ids.bos_id
  return c


def _llada_tensors(m: ModelConfig) -> list[tuple[str, tuple, str]]:
  t = "model.transformer."
  out = [(t + "wte.weight", ("embed",), COPY)]
  for i in range(m.n_layers):
    b, p = f"{t}blocks.{i}.", ("blocks", i)
    out += [(b + "attn_norm.weight", p + ("attn_norm", "scale"), COPY),
            (b + "q_proj.weight", p + ("attn", "q_proj"), IN),
            (b + "k_proj.weight", p + ("attn", "k_proj"), IN),
            (b + "v_proj.weight", p + ("attn", "v_proj"), IN),
            (b + "attn_out.weight", p + ("attn", "o_proj"), OUT),
            (b + "ff_norm.weight", p + ("mlp_norm", "scale"), COPY),
            (b + "ff_proj.weight", p + ("mlp", "gate_proj"), IN),
            (b + "up_proj.weight", p + ("mlp", "up_proj"), IN),
            (b + "ff_out.weight", p + ("mlp", "down_proj"), OUT)]
  out.append((t + "ln_f.weight", ("final_norm", "scale"), COPY))
  if not m.tie_embeddings:
    out.append((t + "ff_out.weight", ("lm_head",), IN))
  return out


_SDAR_OPTIONS = {
    "attention_bias": ((False,), False), "hidden_act": (("silu",), "silu"),
    "rope_scaling": ((None,), None), "use_sliding_window": ((False,), False),
}


def _sdar_parse(c: dict) -> tuple[dict, TokenIds]:
  _check_options(c, "SDAR", _SDAR_OPTIONS)
  d, heads = int(_get(c, "hidden_size")), int(_get(c, "num_attention_heads"))
  kwargs = dict(vocab_size=int(_get(c, "vocab_size")), d_model=d,
                n_layers=int(_get(c, "num_hidden_layers")), n_heads=heads,
                n_kv_heads=int(c.get("num_key_value_heads") or heads),
                head_dim=int(c.get("head_dim") or d // heads),
                mlp_hidden=int(_get(c, "intermediate_size")),
                rope_theta=float(c.get("rope_theta", 10000.0)),
                rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
                tie_embeddings=bool(c.get("tie_word_embeddings", False)), qk_norm=True)
  block = c.get("block_size")
  ids = TokenIds(mask_id=int(_get(c, "mask_token_id")), eos_id=_first(c.get("eos_token_id")),
                 pad_id=_first(c.get("pad_token_id")), bos_id=_first(c.get("bos_token_id")),
                 block_size=None if block is None else int(block))
  return kwargs, ids


def _sdar_config(m: ModelConfig, ids: TokenIds) -> dict:
  c = {k: default for k, (_, default) in _SDAR_OPTIONS.items()}
  c.update(architectures=["SDARForCausalLM"], model_type="sdar",
           auto_map={"AutoConfig": "configuration_sdar.SDARConfig",
                     "AutoModel": "modeling_sdar.SDARModel",
                     "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
           hidden_size=m.d_model, num_attention_heads=m.n_heads,
           num_key_value_heads=m.n_kv_heads, head_dim=m.head_dim, num_hidden_layers=m.n_layers,
           intermediate_size=m.mlp_hidden, vocab_size=m.vocab_size, rope_theta=m.rope_theta,
           rms_norm_eps=m.rms_norm_eps, tie_word_embeddings=m.tie_embeddings,
           attention_dropout=0.0, sliding_window=None, use_cache=False,
           mask_token_id=ids.mask_id, eos_token_id=ids.eos_id, bos_token_id=ids.bos_id)
  if ids.pad_id is not None:
    c["pad_token_id"] = ids.pad_id
  if ids.block_size is not None:
    c["block_size"] = ids.block_size
  return c


def _sdar_tensors(m: ModelConfig) -> list[tuple[str, tuple, str]]:
  out = [("model.embed_tokens.weight", ("embed",), COPY)]
  for i in range(m.n_layers):
    b, p = f"model.layers.{i}.", ("blocks", i)
    a = b + "self_attn."
    out += [(b + "input_layernorm.weight", p + ("attn_norm", "scale"), COPY),
            (a + "q_proj.weight", p + ("attn", "q_proj"), IN),
            (a + "k_proj.weight", p + ("attn", "k_proj"), IN),
            (a + "v_proj.weight", p + ("attn", "v_proj"), IN),
            (a + "q_norm.weight", p + ("attn", "q_norm", "scale"), COPY),
            (a + "k_norm.weight", p + ("attn", "k_norm", "scale"), COPY),
            (a + "o_proj.weight", p + ("attn", "o_proj"), OUT),
            (b + "post_attention_layernorm.weight", p + ("mlp_norm", "scale"), COPY),
            (b + "mlp.gate_proj.weight", p + ("mlp", "gate_proj"), IN),
            (b + "mlp.up_proj.weight", p + ("mlp", "up_proj"), IN),
            (b + "mlp.down_proj.weight", p + ("mlp", "down_proj"), OUT)]
  out.append(("model.norm.weight", ("final_norm", "scale"), COPY))
  if not m.tie_embeddings:
    out.append(("lm_head.weight", ("lm_head",), IN))
  return out


_DREAM_OPTIONS = {
    "hidden_act": (("silu",), "silu"), "rope_scaling": ((None,), None),
    "use_sliding_window": ((False,), False), "use_mrope": ((False,), False),
}


def _dream_parse(c: dict) -> tuple[dict, TokenIds]:
  _check_options(c, "Dream", _DREAM_OPTIONS)
  if "attention_bias" in c:  # Dream's attention always has q/k/v biases and no o_proj bias
    raise ValueError(f"config.json: Dream option 'attention_bias' = {c['attention_bias']!r} is "
                     "not supported (Dream has no such key: q/k/v always carry biases, o_proj "
                     "never does)")
  d, heads = int(_get(c, "hidden_size")), int(_get(c, "num_attention_heads"))
  if d % heads:
    raise ValueError(f"config.json: 'hidden_size'={d} is not a multiple of "
                     f"'num_attention_heads'={heads}")
  if c.get("head_dim") not in (None, d // heads):  # DreamAttention uses hidden // heads
    raise ValueError(f"config.json: Dream option 'head_dim' = {c['head_dim']!r} is not supported "
                     f"(Dream's attention uses hidden_size // num_attention_heads = {d // heads})")
  kwargs = dict(vocab_size=int(_get(c, "vocab_size")), d_model=d,
                n_layers=int(_get(c, "num_hidden_layers")), n_heads=heads,
                n_kv_heads=int(c.get("num_key_value_heads") or heads), head_dim=d // heads,
                mlp_hidden=int(_get(c, "intermediate_size")),
                rope_theta=float(c.get("rope_theta", 10000.0)),
                rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
                tie_embeddings=bool(c.get("tie_word_embeddings", False)), qk_norm=False,
                qkv_bias=True, logit_shift=True)
  ids = TokenIds(mask_id=int(_get(c, "mask_token_id")), eos_id=_first(c.get("eos_token_id")),
                 pad_id=_first(c.get("pad_token_id")), bos_id=_first(c.get("bos_token_id")),
                 block_size=None)
  return kwargs, ids


def _dream_config(m: ModelConfig, ids: TokenIds) -> dict:
  c = {k: default for k, (_, default) in _DREAM_OPTIONS.items()}
  c.update(architectures=["DreamModel"], model_type="Dream",
           auto_map={"AutoConfig": "configuration_dream.DreamConfig",
                     "AutoModel": "modeling_dream.DreamModel"},
           hidden_size=m.d_model, num_attention_heads=m.n_heads,
           num_key_value_heads=m.n_kv_heads, num_hidden_layers=m.n_layers,
           intermediate_size=m.mlp_hidden, vocab_size=m.vocab_size, rope_theta=m.rope_theta,
           rms_norm_eps=m.rms_norm_eps, tie_word_embeddings=m.tie_embeddings,
           attention_dropout=0.0, sliding_window=None, max_window_layers=m.n_layers,
           initializer_range=m.init_std, max_position_embeddings=131072, use_cache=False,
           mask_token_id=ids.mask_id, eos_token_id=ids.eos_id, pad_token_id=ids.pad_id,
           bos_token_id=ids.bos_id)
  return c


def _dream_tensors(m: ModelConfig) -> list[tuple[str, tuple, str]]:
  if not (m.qkv_bias and m.logit_shift and not m.qk_norm):
    raise ValueError("a Dream model has qkv_bias=True, logit_shift=True, qk_norm=False; this "
                     f"one has {m.qkv_bias}, {m.logit_shift}, {m.qk_norm}")
  out = [("model.embed_tokens.weight", ("embed",), COPY)]
  for i in range(m.n_layers):
    b, p = f"model.layers.{i}.", ("blocks", i)
    a = b + "self_attn."
    out += [(b + "input_layernorm.weight", p + ("attn_norm", "scale"), COPY),
            (a + "q_proj.weight", p + ("attn", "q_proj"), IN),
            (a + "q_proj.bias", p + ("attn", "q_bias"), FLAT),
            (a + "k_proj.weight", p + ("attn", "k_proj"), IN),
            (a + "k_proj.bias", p + ("attn", "k_bias"), FLAT),
            (a + "v_proj.weight", p + ("attn", "v_proj"), IN),
            (a + "v_proj.bias", p + ("attn", "v_bias"), FLAT),
            (a + "o_proj.weight", p + ("attn", "o_proj"), OUT),
            (b + "post_attention_layernorm.weight", p + ("mlp_norm", "scale"), COPY),
            (b + "mlp.gate_proj.weight", p + ("mlp", "gate_proj"), IN),
            (b + "mlp.up_proj.weight", p + ("mlp", "up_proj"), IN),
            (b + "mlp.down_proj.weight", p + ("mlp", "down_proj"), OUT)]
  out.append(("model.norm.weight", ("final_norm", "scale"), COPY))
  if not m.tie_embeddings:
    out.append(("lm_head.weight", ("lm_head",), IN))
  return out


FAMILIES: dict[str, Family] = {
    "llada": Family("llada", "LLaDAModelLM", "llada", _llada_parse, _llada_config, _llada_tensors),
    "sdar": Family("sdar", "SDARForCausalLM", "sdar", _sdar_parse, _sdar_config, _sdar_tensors),
    "dream": Family("dream", "DreamModel", "Dream", _dream_parse, _dream_config, _dream_tensors),
}


def detect_family(hf_config: dict) -> str:
  """The family name from ``architectures`` (first match), else ``model_type``."""
  archs = hf_config.get("architectures") or []
  for fam in FAMILIES.values():
    if fam.architecture in archs:
      return fam.name
  for fam in FAMILIES.values():
    if hf_config.get("model_type") == fam.model_type:
      return fam.name
  supported = ", ".join(f"{f.architecture} (model_type {f.model_type!r})" for f in FAMILIES.values())
  raise ValueError(f"unsupported architecture: config.json has architectures={archs!r}, "
                   f"model_type={hf_config.get('model_type')!r}; supported: {supported}")


def model_config_from_hf(hf_config: dict, *, dtype: str = "float32",
                         param_dtype: str | None = None) -> tuple[ModelConfig, TokenIds]:
  """(ModelConfig, TokenIds) for a checkpoint's config.json. ``dtype`` is the compute
  dtype, ``param_dtype`` (default: ``dtype``) the storage dtype of the loaded params."""
  for name in (dtype, param_dtype or dtype):
    if name not in DTYPES:
      raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
  kwargs, ids = FAMILIES[detect_family(hf_config)].parse(hf_config)
  if not 0 <= ids.mask_id < kwargs["vocab_size"]:
    raise ValueError(f"config.json: 'mask_token_id'={ids.mask_id} is outside the vocabulary "
                     f"({kwargs['vocab_size']})")
  cfg = ModelConfig(**kwargs, dtype=DTYPES[dtype], param_dtype=DTYPES[param_dtype or dtype])
  return cfg, ids


# ----------------------------------------------------------------------------- layouts

def hf_shape(fw_shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
  """The torch shape of a framework parameter of shape ``fw_shape``."""
  if kind == IN:
    return (math.prod(fw_shape[1:]), fw_shape[0])
  if kind == OUT:
    return (fw_shape[-1], math.prod(fw_shape[:-1]))
  if kind == FLAT:
    return (math.prod(fw_shape),)
  return tuple(fw_shape)


def to_framework(w: np.ndarray, fw_shape: tuple[int, ...], kind: str) -> np.ndarray:
  """HF tensor → framework layout (a view when numpy can make one)."""
  if kind == COPY:
    return w
  return w.reshape(fw_shape) if kind == FLAT else w.T.reshape(fw_shape)


def to_hf(x: np.ndarray, kind: str) -> np.ndarray:
  """Framework parameter → HF (torch ``(out, in)``) layout."""
  if kind == IN:
    return x.reshape(x.shape[0], -1).T
  if kind == OUT:
    return x.reshape(-1, x.shape[-1]).T
  if kind == FLAT:
    return x.reshape(-1)
  return x


def _lookup(tree: Any, path: tuple) -> Any:
  for p in path:
    tree = tree[p]
  return tree


# ----------------------------------------------------------------------------- import

def read_hf_config(ckpt_dir: str) -> dict:
  path = os.path.join(ckpt_dir, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} not found (an HF checkpoint folder needs config.json)")
  with open(path) as f:
    return json.load(f)


def tensor_index(ckpt_dir: str) -> tuple[dict[str, str], str]:
  """(tensor name → safetensors file, the file or index naming them)."""
  index = os.path.join(ckpt_dir, "model.safetensors.index.json")
  single = os.path.join(ckpt_dir, "model.safetensors")
  if os.path.isfile(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    return {k: os.path.join(ckpt_dir, v) for k, v in weight_map.items()}, index
  if os.path.isfile(single):
    with safe_open(single, framework="numpy") as f:
      return {k: single for k in f.keys()}, single
  raise FileNotFoundError(f"{ckpt_dir}: neither model.safetensors nor "
                          "model.safetensors.index.json found")


def _check_tensors(files: dict[str, str], source: str, family: str,
                   plan: list[tuple[str, tuple, str, tuple]]) -> None:
  """Names, shapes and dtypes from the headers, before any tensor is read."""
  wanted = {name for name, *_ in plan}
  for name, *_ in plan:
    if name not in files:
      raise ValueError(f"tensor {name!r} is missing from {source}")
  extra = sorted(set(files) - wanted)
  if extra:
    raise ValueError(f"{source} has {len(extra)} unexpected tensor(s) that the {family} model "
                     f"with this config.json does not use: {extra[:10]}")
  by_file: dict[str, list] = {}
  for entry in plan:
    by_file.setdefault(files[entry[0]], []).append(entry)
  for path, entries in by_file.items():
    if not os.path.isfile(path):
      raise FileNotFoundError(f"{path} (listed in {source}) not found")
    with safe_open(path, framework="numpy") as f:
      present = set(f.keys())
      for name, _, kind, fw_shape in entries:
        if name not in present:
          raise ValueError(f"tensor {name!r} is missing from {path} (listed in {source})")
        sl = f.get_slice(name)
        shape, want = tuple(sl.get_shape()), hf_shape(fw_shape, kind)
        if shape != want:
          raise ValueError(f"tensor {name!r} in {path} has shape {shape}, expected {want} "
                           "from config.json")
        if sl.get_dtype() not in ST_DTYPES:
          raise ValueError(f"tensor {name!r} in {path} has dtype {sl.get_dtype()}; "
                           f"supported: {sorted(ST_DTYPES)}")


def _place(w: np.ndarray, fw_shape, kind, sharding, dtype) -> jax.Array:
  view = to_framework(w, fw_shape, kind)
  return jax.make_array_from_callback(
      tuple(fw_shape), sharding, lambda idx: np.ascontiguousarray(view[idx], dtype=dtype))


def load_checkpoint(ckpt_dir: str, *, mesh: jax.sharding.Mesh | None = None,
                    dtype: str = "float32", param_dtype: str | None = None) -> LoadedModel:
  """Loads an HF folder → :class:`LoadedModel` (model_cfg, token_ids, graphdef, params, family).

  ``params`` is an ``nnx.State`` whose arrays already carry ``param_shardings``
  on ``mesh`` (default: one device). Raises ValueError naming the tensor for a
  missing/unexpected tensor or a shape mismatch, and for unsupported configs.
  """
  hf_config = read_hf_config(ckpt_dir)
  family = detect_family(hf_config)
  cfg, ids = model_config_from_hf(hf_config, dtype=dtype, param_dtype=param_dtype)
  mesh = mesh if mesh is not None else make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
  graphdef, abstract = abstract_model(cfg)
  shapes, shardings = nnx.to_pure_dict(abstract), nnx.to_pure_dict(param_shardings(abstract, mesh))
  plan = [(name, path, kind, tuple(_lookup(shapes, path).shape))
          for name, path, kind in FAMILIES[family].tensors(cfg)]
  files, source = tensor_index(ckpt_dir)
  _check_tensors(files, source, family, plan)
  np_dtype = np.dtype(cfg.param_dtype)
  values = shapes  # the pure dict of shapes, filled in place with placed arrays
  for path_file in dict.fromkeys(files[name] for name, *_ in plan):
    with safe_open(path_file, framework="numpy") as f:
      for name, path, kind, fw_shape in plan:
        if files[name] == path_file:
          _lookup(values, path[:-1])[path[-1]] = _place(
              f.get_tensor(name), fw_shape, kind, _lookup(shardings, path), np_dtype)
  nnx.replace_by_pure_dict(abstract, values)
  return LoadedModel(cfg, ids, graphdef, abstract, family)


# ----------------------------------------------------------------------------- export

def _to_host(x: jax.Array) -> np.ndarray:
  if getattr(x, "is_fully_addressable", True):
    return np.asarray(x)
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _write_safetensors(path: str | None, entries: list, pure: dict, np_dtype) -> None:
  """One safetensors file, header first, then tensor by tensor (a single gathered
  parameter on the host at a time). ``path`` None: gather only (non-primary process)."""
  code = _ST_CODE[np.dtype(np_dtype).name]
  entries = sorted(entries, key=lambda e: (-_ST_RANK[code], e[0]))
  header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
  offset = 0
  for name, _, _, shape in entries:
    size = math.prod(shape) * np.dtype(np_dtype).itemsize
    header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + size]}
    offset += size
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  f = open(path, "wb") if path is not None else None
  try:
    if f is not None:
      f.write(struct.pack("<Q", len(blob)) + blob)
    for name, path_, kind, shape in entries:
      w = np.ascontiguousarray(to_hf(_to_host(_lookup(pure, path_)), kind), dtype=np_dtype)
      if f is not None:
        f.write(w.reshape(-1).view(np.uint8).data)
  finally:
    if f is not None:
      f.close()


def _check_config(hf_config: dict, cfg: ModelConfig, ids: TokenIds) -> None:
  got_cfg, got_ids = model_config_from_hf(hf_config)
  got_cfg = dataclasses.replace(got_cfg, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                                init_std=cfg.init_std, scan_layers=cfg.scan_layers,
                                remat=cfg.remat)
  diff = [f"{f.name}: config.json {getattr(a, f.name)!r} vs model {getattr(b, f.name)!r}"
          for a, b in ((got_cfg, cfg), (got_ids, ids)) for f in dataclasses.fields(a)
          if getattr(a, f.name) != getattr(b, f.name)]
  if diff:
    raise ValueError("hf_config does not describe this model: " + "; ".join(diff))


def export_checkpoint(params: nnx.State, model_cfg: ModelConfig, token_ids: TokenIds,
                      family: str, out_dir: str, *, hf_config: dict | None = None,
                      max_shard_bytes: float = 5e9, dtype: str | None = None) -> list[str]:
  """Writes ``params`` as an HF folder (safetensors + config.json); returns the files.

  Tensors keep the original HF names and torch layouts, stored in ``dtype``
  (default: the params' dtype). ``hf_config`` (e.g. the imported config.json)
  is written back with ``torch_dtype`` updated; it must describe ``model_cfg``
  and ``token_ids``. Without it a config.json is built from the family's keys.
  More than ``max_shard_bytes`` of tensors → ``model-0000i-of-0000n.safetensors``
  plus ``model.safetensors.index.json``. In a multi-process run every process
  must call this (parameters are gathered collectively); process 0 writes.
  """
  if family not in FAMILIES:
    raise ValueError(f"unknown family {family!r}; supported: {sorted(FAMILIES)}")
  _, abstract = abstract_model(model_cfg)
  shapes, pure = nnx.to_pure_dict(abstract), nnx.to_pure_dict(params)
  entries = []
  for name, path, kind in FAMILIES[family].tensors(model_cfg):
    want, got = _lookup(shapes, path).shape, _lookup(pure, path).shape
    if tuple(want) != tuple(got):
      raise ValueError(f"parameter {'/'.join(map(str, path))} has shape {tuple(got)}, "
                       f"the model config needs {tuple(want)}")
    entries.append((name, path, kind, hf_shape(tuple(want), kind)))
  if len(entries) != len(jax.tree_util.tree_leaves(pure)):
    raise ValueError("params hold leaves that the exported model does not use")
  dtype = dtype or np.dtype(jax.tree_util.tree_leaves(pure)[0].dtype).name
  if dtype not in _ST_CODE:
    raise ValueError(f"export dtype must be one of {sorted(_ST_CODE)}, got {dtype!r}")
  np_dtype = np.dtype(ST_DTYPES[_ST_CODE[dtype]])
  if hf_config is not None:
    _check_config(hf_config, model_cfg, token_ids)
    config = dict(hf_config)
  else:
    config = FAMILIES[family].to_config(model_cfg, token_ids)
  config["torch_dtype"] = dtype

  shards: list[list] = [[]]
  used = 0
  for e in entries:
    size = math.prod(e[3]) * np_dtype.itemsize
    if shards[-1] and used + size > max_shard_bytes:
      shards.append([])
      used = 0
    shards[-1].append(e)
    used += size
  n = len(shards)
  names = (["model.safetensors"] if n == 1 else
           [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])
  primary = jax.process_index() == 0
  if primary:
    os.makedirs(out_dir, exist_ok=True)
  written = []
  for fname, shard in zip(names, shards):
    path = os.path.join(out_dir, fname)
    _write_safetensors(path if primary else None, shard, pure, np_dtype)
    written.append(path)
  if primary:
    if n > 1:
      total = sum(math.prod(e[3]) for e in entries) * np_dtype.itemsize
      index = {"metadata": {"total_size": total},
               "weight_map": {e[0]: f for f, s in zip(names, shards) for e in sorted(s)}}
      written.append(os.path.join(out_dir, "model.safetensors.index.json"))
      with open(written[-1], "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")
    written.append(os.path.join(out_dir, "config.json"))
    with open(written[-1], "w") as f:
      json.dump(config, f, indent=2, sort_keys=True)
      f.write("\n")
  return written
