"""The dense families of Hugging Face checkpoints: LLaDA (OLMo-style names), SDAR (Qwen3-style,
qk-norm) and Dream (Qwen2-style, q/k/v biases, logit shift). Each is a
:class:`~dllm_rl.models.hf_spec.Family`: its config.json parser (options checked against
the values this framework implements), its config.json writer and its tensor table
(HF name, framework path, layout kind). ``dllm_rl.models.hf`` registers them beside
LLaDA2 (``dllm_rl.models.hf_llada2``) and does the loading and export.
"""

from __future__ import annotations

from dllm_rl.models.hf_spec import (COPY, FLAT, IN, OUT, MISSING as _MISSING, Family,
                                    TokenIds,
                                    check_options as _check_options, first as _first, get as _get)
from dllm_rl.models.transformer import ModelConfig

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
  c = {k: (ok[0] if default is _MISSING else default)
       for k, (ok, default) in _LLADA_OPTIONS.items()}
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
           mask_token_id=ids.mask_id, eos_token_id=ids.eos_id, bos_token_id=ids.bos_id,
           # read by every official SDARForCausalLM.forward (SDARConfig has no default:
           # AttributeError without it); False: plain logits in training too
           fuse_cross_entropy=False)
  if ids.pad_id is not None:
    c["pad_token_id"] = ids.pad_id
  if ids.block_size is not None:
    c["block_size"] = ids.block_size
  return c


def _qwen_tensors(m: ModelConfig) -> list[tuple[str, tuple, str]]:
  """Qwen-style names (``model.{embed_tokens, layers.i.*, norm}``, ``lm_head``), shared by
  SDAR (qk-norm) and Dream (q/k/v biases); each layer in the HF state-dict order."""
  out = [("model.embed_tokens.weight", ("embed",), COPY)]
  for i in range(m.n_layers):
    b, p = f"model.layers.{i}.", ("blocks", i)
    a = b + "self_attn."
    out.append((b + "input_layernorm.weight", p + ("attn_norm", "scale"), COPY))
    for x in "qkv":
      out.append((a + f"{x}_proj.weight", p + ("attn", f"{x}_proj"), IN))
      if m.qkv_bias:
        out.append((a + f"{x}_proj.bias", p + ("attn", f"{x}_bias"), FLAT))
    if m.qk_norm:
      out += [(a + "q_norm.weight", p + ("attn", "q_norm", "scale"), COPY),
              (a + "k_norm.weight", p + ("attn", "k_norm", "scale"), COPY)]
    out += [(a + "o_proj.weight", p + ("attn", "o_proj"), OUT),
            (b + "post_attention_layernorm.weight", p + ("mlp_norm", "scale"), COPY),
            (b + "mlp.gate_proj.weight", p + ("mlp", "gate_proj"), IN),
            (b + "mlp.up_proj.weight", p + ("mlp", "up_proj"), IN),
            (b + "mlp.down_proj.weight", p + ("mlp", "down_proj"), OUT)]
  out.append(("model.norm.weight", ("final_norm", "scale"), COPY))
  if not m.tie_embeddings:
    out.append(("lm_head.weight", ("lm_head",), IN))
  return out


def _sdar_tensors(m: ModelConfig) -> list[tuple[str, tuple, str]]:
  if not (m.qk_norm and not m.qkv_bias):
    raise ValueError("an SDAR model has qk_norm=True, qkv_bias=False; this one has "
                     f"{m.qk_norm}, {m.qkv_bias}")
  return _qwen_tensors(m)


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
  return _qwen_tensors(m)


LLADA = Family("llada", "LLaDAModelLM", "llada", _llada_parse, _llada_config, _llada_tensors)
SDAR = Family("sdar", "SDARForCausalLM", "sdar", _sdar_parse, _sdar_config, _sdar_tensors)
DREAM = Family("dream", "DreamModel", "Dream", _dream_parse, _dream_config, _dream_tensors)
