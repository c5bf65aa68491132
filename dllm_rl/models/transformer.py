"""LLaDA-architecture transformer (NNX): tokens, positions, attention mask → logits.

Pre-norm blocks ``h = x + attn(norm(x)); out = h + mlp(norm(h))``, RMSNorm,
SwiGLU, half-split RoPE (optionally partial, ``rotary_dim``), optional GQA,
qk-norm and q/k/v biases, no other biases, optional tied embeddings. With
``n_experts > 0`` the layers from ``first_dense_layers`` on replace the SwiGLU by
a mixture of experts (dllm_rl.models.moe, LLaDA2 MoE). Attention is
bidirectional unless a mask says otherwise, so block-causal variants reuse this
module with a different mask. The model knows nothing about diffusion or RL.

Logit shift (``logit_shift``, Dream): the checkpoint keeps its AR parent's
next-token alignment, raw output row i scoring token i + 1. Every consumer of
this module sees per-position predictions instead (row i scores token i):
:meth:`Transformer.output` moves the final hidden states one row down (row 0
keeps its own), which is the official samplers'
``cat([logits[:, :1], logits[:, :-1]], 1)`` done before the head (the head is
per row, so both orders give the same numbers, and callers that apply the
head to a few rows stay correct). ``shift=False`` / :func:`apply_raw` give the
raw rows, exactly what the official forward returns.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from dllm_rl.models import layers, lora, moe, scan
from dllm_rl.parallel.constraints import constrain_activations
from dllm_rl.parallel.shard import param_shardings
from dllm_rl.types import DTYPES

# Every logical axis name a parameter may carry (the sharding rules table maps these).
LOGICAL_AXES = ("vocab", "embed", "heads", "kv_heads", "head_dim", "mlp", "norm", "expert",
                "lora_rank")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Static model hyper-parameters (hashable; built from ``config.model``)."""

  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  mlp_hidden: int
  rope_theta: float = 500000.0
  rms_norm_eps: float = 1e-5
  tie_embeddings: bool = False
  qk_norm: bool = False
  init_std: float = 0.02
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  scan_layers: bool = False  # one lax.scan over the layers (dllm_rl.models.scan)
  remat: str = "none"        # rematerialisation policy per layer (scan.REMAT_POLICIES)
  qkv_bias: bool = False     # biases on the q/k/v projections (Qwen2 / Dream)
  logit_shift: bool = False  # raw row i predicts token i + 1 (Dream); realigned (module doc)
  # Mixture of experts (dllm_rl.models.moe); n_experts = 0: every layer dense.
  n_experts: int = 0
  experts_per_token: int = 0   # top-k
  moe_hidden: int = 0          # width of one routed expert
  n_shared_experts: int = 0    # shared expert width = moe_hidden · n_shared_experts
  n_expert_groups: int = 1     # contiguous expert groups for group-limited routing
  topk_groups: int = 1         # groups kept per token
  routed_scaling: float = 1.0  # combine weights sum to this
  first_dense_layers: int = 0  # layers [0, first_dense_layers) keep the dense SwiGLU
  moe_dispatch: str = "auto"   # the experts' grouped matmuls (dllm_rl.kernels.grouped_matmul)
  rotary_dim: int = 0          # rotated dims per head (partial RoPE); 0 = head_dim
  # LoRA adapters (dllm_rl.models.lora; set from config.lora): rank 0 = none.
  lora_rank: int = 0
  lora_alpha: float = 16.0
  lora_targets: tuple[str, ...] = ()

  def is_moe_layer(self, i: int) -> bool:
    return self.n_experts > 0 and i >= self.first_dense_layers

  @classmethod
  def from_config(cls, model_cfg: Mapping[str, Any]) -> "ModelConfig":
    """From the validated ``config.model`` (preset already applied)."""
    head_dim = model_cfg["head_dim"] or model_cfg["d_model"] // model_cfg["n_heads"]
    return cls(
        vocab_size=model_cfg["vocab_size"], d_model=model_cfg["d_model"],
        n_layers=model_cfg["n_layers"], n_heads=model_cfg["n_heads"],
        n_kv_heads=model_cfg["n_kv_heads"] or model_cfg["n_heads"],
        head_dim=head_dim, mlp_hidden=model_cfg["mlp_hidden"],
        rope_theta=model_cfg["rope_theta"], rms_norm_eps=model_cfg["rms_norm_eps"],
        tie_embeddings=model_cfg["tie_embeddings"], qk_norm=model_cfg["qk_norm"],
        init_std=model_cfg["init_std"], dtype=DTYPES[model_cfg["dtype"]],
        param_dtype=DTYPES[model_cfg["param_dtype"]],
        scan_layers=model_cfg.get("scan_layers", False), remat=model_cfg.get("remat", "none"),
        qkv_bias=model_cfg.get("qkv_bias", False),
        logit_shift=model_cfg.get("logit_shift", False),
        **{k: model_cfg.get(k, d) for k, d in _MOE_DEFAULTS.items()})


_MOE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)
                 if f.name in ("n_experts", "experts_per_token", "moe_hidden", "n_shared_experts",
                               "n_expert_groups", "topk_groups", "routed_scaling",
                               "first_dense_layers", "rotary_dim", "moe_dispatch")}


def moe_problems(cfg, head_dim: int) -> list[tuple[str, str]]:
  """(field, message) for MoE / partial-rotary settings the model cannot run. ``cfg``: a
  ModelConfig or the ``config.model`` section (same field names)."""
  rd = cfg.rotary_dim or head_dim
  out = []
  if cfg.rotary_dim < 0 or rd % 2 or rd > head_dim:
    out.append(("rotary_dim", f"{cfg.rotary_dim} must be even and in [0, head_dim={head_dim}]"
                              " (0 = head_dim)"))
  if cfg.n_experts < 0:
    out.append(("n_experts", f"must be >= 0 (0 = dense), got {cfg.n_experts}"))
  if cfg.n_experts <= 0:
    return out
  e, g, k = cfg.n_experts, cfg.n_expert_groups, cfg.experts_per_token
  per_group = e // g if g > 0 and e % g == 0 else 0
  checks = (
      ("experts_per_token", not 0 < k <= e, f"{k} must be in [1, n_experts={e}]"),
      ("moe_hidden", cfg.moe_hidden <= 0, f"must be > 0, got {cfg.moe_hidden}"),
      ("n_shared_experts", cfg.n_shared_experts < 0, f"must be >= 0, got {cfg.n_shared_experts}"),
      ("n_expert_groups", not per_group, f"{g} must divide n_experts={e}"),
      ("topk_groups", per_group and not 0 < cfg.topk_groups <= g,
       f"{cfg.topk_groups} must be in [1, n_expert_groups={g}]"),
      ("topk_groups", per_group and cfg.topk_groups < g and per_group < 2,
       "group-limited routing scores a group by its top 2 experts: groups need >= 2"),
      ("topk_groups", per_group and cfg.topk_groups * per_group < k,
       f"the kept groups hold {cfg.topk_groups * per_group} < experts_per_token={k} experts"),
      ("first_dense_layers", not 0 <= cfg.first_dense_layers <= cfg.n_layers,
       f"{cfg.first_dense_layers} must be in [0, n_layers={cfg.n_layers}]"))
  return out + [(field, msg) for field, bad, msg in checks if bad]


def check_moe(cfg: ModelConfig) -> None:
  """Fail fast (ValueError) on MoE / partial-rotary settings the model cannot run."""
  problems = moe_problems(cfg, cfg.head_dim)
  if problems:
    raise ValueError("model config: " + "; ".join(f"{f}: {m}" for f, m in problems))


class Block(nnx.Module):
  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, moe_layer: bool = False):
    self.attn_norm = layers.RMSNorm(cfg.d_model, eps=cfg.rms_norm_eps, param_dtype=cfg.param_dtype)
    self.attn = layers.Attention(cfg, rngs)
    self.mlp_norm = layers.RMSNorm(cfg.d_model, eps=cfg.rms_norm_eps, param_dtype=cfg.param_dtype)
    self.mlp = moe.MoE(cfg, rngs) if moe_layer else layers.SwiGLU(cfg, rngs)

  def __call__(self, x_BND, cos_BNQ, sin_BNQ, mask_BNM):
    return self.forward(x_BND, cos_BNQ, sin_BNQ, mask_BNM)[0]

  def forward(self, x_BND, cos_BNQ, sin_BNQ, mask_BNM):
    """(output, the MoE routing or None for a dense layer)."""
    h = x_BND + self.attn(self.attn_norm(x_BND), cos_BNQ, sin_BNQ, mask_BNM)
    if isinstance(self.mlp, moe.MoE):
      y, routing = self.mlp.forward(self.mlp_norm(h))
      return h + y, routing
    return h + self.mlp(self.mlp_norm(h)), None

  def cached(self, x_BTD, cos_BTQ, sin_BTQ, k_BMJQ, v_BMJQ, offset, mask_BTM):
    """``__call__`` for T new tokens against this layer's KV cache."""
    a, k_BMJQ, v_BMJQ = self.attn.cached(self.attn_norm(x_BTD), cos_BTQ, sin_BTQ,
                                         k_BMJQ, v_BMJQ, offset, mask_BTM)
    h = x_BTD + a
    return h + self.mlp(self.mlp_norm(h)), k_BMJQ, v_BMJQ


class Transformer(nnx.Module):
  """(tokens_BN, positions_BN, mask) → float32 logits_BNV."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    if cfg.n_heads % cfg.n_kv_heads:
      raise ValueError(f"n_heads={cfg.n_heads} is not a multiple of n_kv_heads={cfg.n_kv_heads}")
    if cfg.head_dim % 2:
      raise ValueError(f"head_dim={cfg.head_dim} must be even for RoPE")
    check_moe(cfg)
    self.cfg = cfg
    self.embed = nnx.Param(
        cfg.init_std * jax.random.normal(rngs.params(), (cfg.vocab_size, cfg.d_model),
                                         cfg.param_dtype),
        logical_axes=("vocab", "embed"))
    self.blocks = nnx.List([Block(cfg, rngs, cfg.is_moe_layer(i)) for i in range(cfg.n_layers)])
    self.final_norm = layers.RMSNorm(cfg.d_model, eps=cfg.rms_norm_eps, param_dtype=cfg.param_dtype)
    if not cfg.tie_embeddings:
      self.lm_head = nnx.Param(
          cfg.init_std * jax.random.normal(rngs.params(), (cfg.d_model, cfg.vocab_size),
                                           cfg.param_dtype),
          logical_axes=("embed", "vocab"))

  def __call__(self, tokens_BN: jax.Array, positions_BN: jax.Array,
               mask_BNM: jax.Array | None = None, *, shift: bool = True) -> jax.Array:
    """``mask_BNM``: bool, True = query n may attend key m; broadcastable to
    [B, N, N] (e.g. [B, 1, N] key padding); None = full bidirectional; or a
    ``layers.StaircaseSpec`` for the block-diffusion training layout.
    Row n of the logits scores token n; ``shift=False``: the raw rows of a
    ``logit_shift`` model (row n scores token n + 1; module docstring)."""
    return self.logits(self.hidden(tokens_BN, positions_BN, mask_BNM, shift=shift))

  def hidden(self, tokens_BN: jax.Array, positions_BN: jax.Array,
             mask_BNM: jax.Array | None = None, *, shift: bool = True) -> jax.Array:
    """The final hidden states [B, N, D] in ``dtype`` (:meth:`output`): what the
    head multiplies (``__call__`` = hidden @ head_weight). Callers that score a few
    rows apply the head to those rows only (dllm_rl.models.logprob)."""
    cfg = self.cfg
    x, cos, sin, mask_BNM = self._inputs(tokens_BN, positions_BN, mask_BNM)
    x = scan.run_blocks(self.blocks, x, cos, sin, mask_BNM, scan_layers=cfg.scan_layers,
                        remat=cfg.remat, dtype=cfg.dtype)
    return self.output(x, shift=shift)

  def output(self, x_BND: jax.Array, *, shift: bool = True) -> jax.Array:
    """The last block's output → what the head multiplies: the final norm, then
    (``logit_shift`` and ``shift``) row n takes row n - 1's state and row 0 keeps
    its own (:func:`shift_rows`). The one place the logit shift happens."""
    h_BND = self.final_norm(x_BND)
    return shift_rows(h_BND) if self.cfg.logit_shift and shift else h_BND

  def _inputs(self, tokens_BN, positions_BN, mask_BNM):
    """(embeddings in ``dtype``, RoPE cos/sin tables, the mask broadcast to [B, N, M])."""
    cfg = self.cfg
    x = jnp.take(self.embed[...], tokens_BN, axis=0).astype(cfg.dtype)
    cos, sin = layers.rope_tables(positions_BN, cfg.rotary_dim or cfg.head_dim, cfg.rope_theta)
    if mask_BNM is not None and not isinstance(mask_BNM, layers.StaircaseSpec):
      mask_BNM = jnp.broadcast_to(
          mask_BNM, (tokens_BN.shape[0], tokens_BN.shape[1], mask_BNM.shape[-1]))
    return x, cos, sin, mask_BNM

  def routing(self, tokens_BN: jax.Array, positions_BN: jax.Array,
              mask_BNM: jax.Array | None = None) -> tuple[jax.Array, list[moe.Routing]]:
    """(logits_BNV, the router decisions of every MoE layer in order) for the forward
    ``__call__`` runs (unrolled layers, same values): what load statistics
    (``moe.load_stats``) and routing tests read."""
    x, cos, sin, mask_BNM = self._inputs(tokens_BN, positions_BN, mask_BNM)
    routings = []
    for block in self.blocks:
      x, r = block.forward(x, cos, sin, mask_BNM)
      x = constrain_activations(x)
      if r is not None:
        routings.append(r)
    return self.logits(self.output(x)), routings

  def head_weight(self) -> jax.Array:
    """The LM head [D, V] in ``param_dtype`` (the embedding's transpose when tied)."""
    return self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]

  def logits(self, h_BND: jax.Array) -> jax.Array:
    """float32 logits [B, N, V] of final hidden states (matmul in ``dtype``)."""
    return jnp.einsum("bnd,dv->bnv", h_BND, self.head_weight().astype(self.cfg.dtype),
                      preferred_element_type=jnp.float32)

  def forward_cached(self, tokens_BT: jax.Array, positions_BT: jax.Array, cache: layers.KVCache,
                     cache_valid_BM: jax.Array, offset, *, new_valid_BT: jax.Array | None = None,
                     new_mask_TT: jax.Array | None = None, write: bool,
                     window: tuple | None = None) -> tuple[jax.Array, layers.KVCache]:
    """Logits_BTV for T new tokens that attend to the valid cached keys
    (``cache_valid_BM``) and to each other (bidirectionally; ``new_valid_BT``
    False = a new key nobody attends, e.g. prompt padding; ``new_mask_TT``
    [T, T], True = new token i may attend new token j, restricts that further,
    e.g. a block-causal prompt prefill).

    Every layer writes the new tokens' keys/values into cache slots
    [offset, offset + T) (traced offset, static shapes) and attends over the
    whole cache, so with slots laid out as the full sequence this computes
    what ``__call__`` computes for those rows under the matching mask. Returns
    (logits_BTV, cache): the written cache when ``write``, else the input one.
    Marking the written slots valid is the caller's business; offset + T must
    not exceed M (``dynamic_update_slice`` would clamp the offset).

    ``window=(start, length)`` (traced start, static length): the last layer's
    attention output and MLP, the final norm and the head run only for rows
    [start, start + length) (its keys/values still come from every row), and
    the logits are those rows' [B, length, V].

    Logit shift (``cfg.logit_shift``): among the T new rows, as Dream's cached
    block sampler does (new row 0 keeps its own prediction, new row t takes row
    t - 1's). With a window, shifted rows [start, start + length) read the
    unshifted rows [start - 1, start - 1 + length), which are computed instead;
    when start is 0 the rows [0, length) are computed and shifted among
    themselves (same static shape, ``jnp.where`` on the traced start). So the
    window always equals the matching rows of the un-windowed result.
    """
    cfg = self.cfg
    b, t = tokens_BT.shape
    m = cache_valid_BM.shape[1]
    if new_valid_BT is None:
      new_valid_BT = jnp.ones((b, t), bool)
    new_BTT = jnp.broadcast_to(new_valid_BT[:, None, :], (b, t, t))
    if new_mask_TT is not None:
      new_BTT = new_BTT & new_mask_TT[None]
    placed_BTM = jax.lax.dynamic_update_slice_in_dim(jnp.zeros((b, t, m), bool), new_BTT,
                                                     offset, axis=2)
    mask_BTM = cache_valid_BM[:, None, :] | placed_BTM
    x, cos, sin, _ = self._inputs(tokens_BT, positions_BT, None)
    ks, vs = [], []
    last = len(self.blocks) - 1
    if window is not None:
      start, length = window
      rows_start = jnp.maximum(start - 1, 0) if cfg.logit_shift else start
    for i, (block, k_BMJQ, v_BMJQ) in enumerate(zip(self.blocks, cache.k_BMJQ, cache.v_BMJQ)):
      if window is not None and i == last:
        x, k_BMJQ, v_BMJQ = _block_rows(block, x, cos, sin, k_BMJQ, v_BMJQ, offset, mask_BTM,
                                        rows_start, length)
      else:
        x, k_BMJQ, v_BMJQ = block.cached(x, cos, sin, k_BMJQ, v_BMJQ, offset, mask_BTM)
      x = constrain_activations(x)
      ks.append(k_BMJQ)
      vs.append(v_BMJQ)
    if window is None or not cfg.logit_shift:
      h_BTD = self.output(x)
    else:  # rows [start - 1, start - 1 + length) unshifted; shifted among themselves at start 0
      h_BTD = jnp.where(start > 0, self.output(x, shift=False), self.output(x))
    return self.logits(h_BTD), (layers.KVCache(tuple(ks), tuple(vs)) if write else cache)


def _block_rows(block: Block, x_BTD, cos_BTQ, sin_BTQ, k_BMJQ, v_BMJQ, offset, mask_BTM, start,
                length: int):
  """``Block.cached`` that returns only rows [start, start + length) of its output:
  keys/values of all T rows are written, queries, attention, MLP run on those rows."""
  sl = lambda a: jax.lax.dynamic_slice_in_dim(a, start, length, axis=1)
  h_BTD = block.attn_norm(x_BTD)
  _, k, v = block.attn._qkv(h_BTD, cos_BTQ, sin_BTQ)  # the unused q is dead code
  q, _, _ = block.attn._qkv(sl(h_BTD), sl(cos_BTQ), sl(sin_BTQ))
  k_BMJQ = jax.lax.dynamic_update_slice_in_dim(k_BMJQ, k.astype(k_BMJQ.dtype), offset, axis=1)
  v_BMJQ = jax.lax.dynamic_update_slice_in_dim(v_BMJQ, v.astype(v_BMJQ.dtype), offset, axis=1)
  out = layers.attention(q, k_BMJQ, v_BMJQ, sl(mask_BTM))
  h = sl(x_BTD) + block.attn.out_proj(out)
  return h + block.mlp(block.mlp_norm(h)), k_BMJQ, v_BMJQ


def shift_rows(x_BN: jax.Array) -> jax.Array:
  """Row n ← row n - 1 along axis 1, row 0 kept: ``cat([x[:, :1], x[:, :-1]], 1)``."""
  return jnp.concatenate([x_BN[:, :1], x_BN[:, :-1]], axis=1)


def positions_from_valid(valid_BN: jax.Array) -> jax.Array:
  """Position ids that start at 0 on the first valid (non-padding) token."""
  return jnp.maximum(jnp.cumsum(valid_BN.astype(jnp.int32), axis=-1) - 1, 0)


def init_model(cfg: ModelConfig, key: jax.Array) -> tuple[nnx.GraphDef, nnx.State]:
  """Initialise and split into (static graphdef, params state)."""
  model = Transformer(cfg, nnx.Rngs(params=key))
  graphdef, params = nnx.split(model, nnx.Param)
  return graphdef, params


def abstract_model(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
  """Shapes only (no allocation): for parameter counts and sharded init."""
  return nnx.eval_shape(lambda: nnx.split(Transformer(cfg, nnx.Rngs(params=0)), nnx.Param))


def apply(graphdef: nnx.GraphDef, params: nnx.State, tokens_BN, positions_BN, mask_BNM=None):
  """Pure forward: merge the params into the graph and run it (row n scores token n)."""
  return nnx.merge(graphdef, params)(tokens_BN, positions_BN, mask_BNM)


def apply_raw(graphdef: nnx.GraphDef, params: nnx.State, tokens_BN, positions_BN,
              mask_BNM=None):
  """:func:`apply` without the logit shift: exactly the official forward's logits
  (for a ``logit_shift`` model row n scores token n + 1; otherwise = :func:`apply`)."""
  return nnx.merge(graphdef, params)(tokens_BN, positions_BN, mask_BNM, shift=False)


def apply_routing(graphdef: nnx.GraphDef, params: nnx.State, tokens_BN, positions_BN,
                  mask_BNM=None):
  """Pure ``Transformer.routing``: (logits_BNV, [moe.Routing per MoE layer])."""
  return nnx.merge(graphdef, params).routing(tokens_BN, positions_BN, mask_BNM)


def apply_hidden(graphdef: nnx.GraphDef, params: nnx.State, tokens_BN, positions_BN,
                 mask_BNM=None):
  """Pure ``Transformer.hidden``: (final hidden states [B, N, D], head [D, V])."""
  model = nnx.merge(graphdef, params)
  return model.hidden(tokens_BN, positions_BN, mask_BNM), model.head_weight()


def init_kv_cache(cfg: ModelConfig, batch: int, max_len: int) -> layers.KVCache:
  """An empty (all-zero) cache of ``max_len`` slots per sequence, in ``cfg.dtype``."""
  shape = (batch, max_len, cfg.n_kv_heads, cfg.head_dim)
  zeros = tuple(jnp.zeros(shape, cfg.dtype) for _ in range(cfg.n_layers))
  return layers.KVCache(k_BMJQ=zeros, v_BMJQ=zeros)


def apply_cached(graphdef: nnx.GraphDef, params: nnx.State, tokens_BT, positions_BT, cache,
                 cache_valid_BM, offset, *, new_valid_BT=None, new_mask_TT=None, write: bool):
  """Pure ``Transformer.forward_cached``: (logits_BTV, cache)."""
  return nnx.merge(graphdef, params).forward_cached(
      tokens_BT, positions_BT, cache, cache_valid_BM, offset, new_valid_BT=new_valid_BT,
      new_mask_TT=new_mask_TT, write=write)


def apply_cached_window(graphdef: nnx.GraphDef, params: nnx.State, tokens_BT, positions_BT,
                        cache, cache_valid_BM, offset, *, new_valid_BT=None, write: bool, start,
                        length: int):
  """``Transformer.forward_cached`` with ``window=(start, length)``: (logits_B{length}V, cache)."""
  return nnx.merge(graphdef, params).forward_cached(
      tokens_BT, positions_BT, cache, cache_valid_BM, offset, new_valid_BT=new_valid_BT,
      write=write, window=(start, length))


def count_params(params: nnx.State) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))


@functools.lru_cache(maxsize=8)
def _sharded_initializer(cfg: ModelConfig, mesh):
  """(graphdef, the jitted key → params initialiser) for ``cfg`` on ``mesh``, built once per
  (config, mesh): a fresh lambda per call would recompile the whole initialiser (thousands of
  random-number kernels, seconds on a CPU) every time."""
  graphdef, abstract = abstract_model(cfg)
  shardings = param_shardings(abstract, mesh)
  return graphdef, jax.jit(lambda k: init_model(cfg, k)[1], out_shardings=shardings)


def init_params_sharded(cfg: ModelConfig, key: jax.Array, mesh):
  """(graphdef, params) initialised directly into their shardings (never on one device)."""
  graphdef, init = _sharded_initializer(cfg, mesh)
  return graphdef, init(key)


def abstract_params_sharded(cfg: ModelConfig, mesh):
  """(graphdef, params as ``jax.ShapeDtypeStruct`` leaves carrying their shardings on
  ``mesh``): the target of a restore that places each array straight onto its shards."""
  graphdef, abstract = abstract_model(cfg)
  target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, param_shardings(abstract, mesh))
  return graphdef, target



def init_adapters_sharded(cfg: ModelConfig, key: jax.Array, mesh) -> nnx.State:
  """The LoRA adapters alone (``lora.LoraParam``) of a fresh init from ``key``, on their
  shardings; the base's initialiser is dead code under ``jit`` (only adapters are returned)."""
  _, abstract = abstract_model(cfg)
  shardings = lora.split_adapters(param_shardings(abstract, mesh))[0]
  return jax.jit(lambda k: lora.split_adapters(init_model(cfg, k)[1])[0],
                 out_shardings=shardings)(key)
