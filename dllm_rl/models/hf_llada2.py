"""The ``"llada2"`` Hugging Face family: inclusionAI LLaDA2.0 / 2.1-mini
(``LLaDA2MoeModelLM``, model_type ``llada2_moe``; tests/fixtures/llada2_moe_tiny/README.md).

Names ``model.{word_embeddings, layers.i.*, norm}``, ``lm_head``; per layer a fused
``attention.query_key_value`` (rows q | k | v, split into the framework's q/k/v on import
and fused back on export), ``query_layernorm`` / ``key_layernorm`` (qk-norm) and
``attention.dense`` (o_proj); layers < ``first_k_dense_replace`` have a dense SwiGLU
``mlp``, the others ``mlp.gate.{weight, expert_bias}``, ``mlp.experts.{e}.*`` (stacked
into ``[E, ...]`` parameters) and ``mlp.shared_experts.*``.

The official code never reads use_qk_norm, norm_topk_prob, score_function, router_dtype,
rotary_dim, moe_router_enable_expert_bias, ... (qk-norm, normalised sigmoid routing with
the bias, an fp32 router and the rotary width int(head_dim * partial_rotary_factor) are
hard-wired), so neither does this port; the options checked below change the forward and
have one supported value.
"""

from __future__ import annotations

from dllm_rl.models.hf_spec import (COPY, IN, OUT, Family, Part, TokenIds, check_options, first,
                                    get)
from dllm_rl.models.transformer import ModelConfig

_LLADA2_OPTIONS = {
    "use_qkv_bias": ((False,), False), "use_bias": ((False,), False),
    "rope_scaling": ((None,), None), "hidden_act": (("silu",), "silu"),
}


def _llada2_parse(c: dict) -> tuple[dict, TokenIds]:
  check_options(c, "LLaDA2", _LLADA2_OPTIONS)
  d, heads = int(get(c, "hidden_size")), int(get(c, "num_attention_heads"))
  head_dim = int(c.get("head_dim") or d // heads)
  kwargs = dict(vocab_size=int(get(c, "vocab_size")), d_model=d,
                n_layers=int(get(c, "num_hidden_layers")), n_heads=heads,
                n_kv_heads=int(c.get("num_key_value_heads") or heads), head_dim=head_dim,
                mlp_hidden=int(get(c, "intermediate_size")),
                rope_theta=float(get(c, "rope_theta")), rms_norm_eps=float(get(c, "rms_norm_eps")),
                tie_embeddings=bool(c.get("tie_word_embeddings", False)), qk_norm=True,
                n_experts=int(get(c, "num_experts")),
                experts_per_token=int(get(c, "num_experts_per_tok")),
                moe_hidden=int(get(c, "moe_intermediate_size")),
                n_shared_experts=int(c.get("num_shared_experts") or 0),
                n_expert_groups=int(get(c, "n_group")), topk_groups=int(get(c, "topk_group")),
                routed_scaling=float(get(c, "routed_scaling_factor")),
                first_dense_layers=int(get(c, "first_k_dense_replace")),
                rotary_dim=int(head_dim * float(c.get("partial_rotary_factor", 1.0))))
  # config.json holds only pad_token_id; eos and mask are the official generate()
  # defaults: eos = pad = <|endoftext|> (156892), mask = <|mask|> = pad + 3 (156895).
  pad = first(c.get("pad_token_id"))
  eos = first(c.get("eos_token_id")) if c.get("eos_token_id") is not None else pad
  if c.get("mask_token_id") is None and pad is None:
    raise ValueError("config.json: LLaDA2 needs 'pad_token_id' (the mask id defaults to "
                     "pad_token_id + 3) or 'mask_token_id'")
  mask = int(c["mask_token_id"]) if c.get("mask_token_id") is not None else pad + 3
  ids = TokenIds(mask_id=mask, eos_id=eos, pad_id=pad, bos_id=first(c.get("bos_token_id")),
                 block_size=None)
  return kwargs, ids


def _llada2_config(m: ModelConfig, ids: TokenIds) -> dict:
  c = {k: default for k, (_, default) in _LLADA2_OPTIONS.items()}
  c.update(architectures=["LLaDA2MoeModelLM"], model_type="llada2_moe",
           auto_map={"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                     "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
                     "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
           hidden_size=m.d_model, num_attention_heads=m.n_heads,
           num_key_value_heads=m.n_kv_heads, head_dim=m.head_dim, num_hidden_layers=m.n_layers,
           intermediate_size=m.mlp_hidden, vocab_size=m.vocab_size, rope_theta=m.rope_theta,
           rms_norm_eps=m.rms_norm_eps, tie_word_embeddings=m.tie_embeddings,
           num_experts=m.n_experts, num_experts_per_tok=m.experts_per_token,
           moe_intermediate_size=m.moe_hidden, num_shared_experts=m.n_shared_experts,
           n_group=m.n_expert_groups, topk_group=m.topk_groups,
           routed_scaling_factor=m.routed_scaling, first_k_dense_replace=m.first_dense_layers,
           partial_rotary_factor=(m.rotary_dim or m.head_dim) / m.head_dim,
           rotary_dim=m.rotary_dim or m.head_dim, use_qk_norm=True, score_function="sigmoid",
           norm_topk_prob=True, moe_router_enable_expert_bias=True, router_dtype="fp32",
           use_cache=False, pad_token_id=ids.pad_id)
  if ids.eos_id != ids.pad_id:
    c["eos_token_id"] = ids.eos_id
  if ids.pad_id is None or ids.mask_id != ids.pad_id + 3:
    c["mask_token_id"] = ids.mask_id
  if ids.bos_id is not None:
    c["bos_token_id"] = ids.bos_id
  return c


def _llada2_tensors(m: ModelConfig) -> list[tuple]:
  out: list[tuple] = [("model.word_embeddings.weight", ("embed",), COPY)]
  for i in range(m.n_layers):
    b, p = f"model.layers.{i}.", ("blocks", i)
    a, f = b + "attention.", b + "mlp."
    out += [(b + "input_layernorm.weight", p + ("attn_norm", "scale"), COPY),
            (a + "query_key_value.weight",  # rows [q | k | v]
             tuple(Part(p + ("attn", n), IN) for n in ("q_proj", "k_proj", "v_proj"))),
            (a + "query_layernorm.weight", p + ("attn", "q_norm", "scale"), COPY),
            (a + "key_layernorm.weight", p + ("attn", "k_norm", "scale"), COPY),
            (a + "dense.weight", p + ("attn", "o_proj"), OUT),
            (b + "post_attention_layernorm.weight", p + ("mlp_norm", "scale"), COPY)]
    q = p + ("mlp",)
    dense = [(f + "gate_proj.weight", "gate_proj", IN), (f + "up_proj.weight", "up_proj", IN),
             (f + "down_proj.weight", "down_proj", OUT)]
    if not m.is_moe_layer(i):
      out += [(name, q + (n,), kind) for name, n, kind in dense]
      continue
    out += [(f + "gate.weight", q + ("router",), IN),
            (f + "gate.expert_bias", q + ("expert_bias",), COPY)]
    for e in range(m.n_experts):
      out += [(name.replace(f, f"{f}experts.{e}."), (Part(q + (n,), kind, e),))
              for name, n, kind in dense]
    if m.n_shared_experts:
      out += [(name.replace(f, f + "shared_experts."), q + ("shared", n), kind)
              for name, n, kind in dense]
  out.append(("model.norm.weight", ("final_norm", "scale"), COPY))
  if not m.tie_embeddings:
    out.append(("lm_head.weight", ("lm_head",), IN))
  return out


FAMILY = Family("llada2", "LLaDA2MoeModelLM", "llada2_moe", _llada2_parse, _llada2_config,
                _llada2_tensors)
