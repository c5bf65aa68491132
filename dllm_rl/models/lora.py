"""LoRA adapters (Hu et al. 2021, arXiv 2106.09685, eq. 3): ``h = x·W + (α/r)·(x·A)·B``.

A projection ``W`` with input dims ``I`` and output dims ``O`` (``q_proj`` [D, H, Q]: I = (D,),
O = (H, Q); ``o_proj`` [H, Q, D]: I = (H, Q), O = (D,)) gets ``A`` [*I, r] and ``B`` [r, *O],
both :class:`LoraParam`, stored in float32 whatever ``model.param_dtype``. Initialised as PEFT
does: ``A ~ U(±1/√fan_in)`` (``kaiming_uniform_(a=√5)``), ``B = 0``, so a fresh adapter
leaves every logit exactly as the base model computes it. ``A`` carries the base's input
logical axes and ``B`` its output axes, so the rules table shards adapters like their base
weights; the rank axis ``lora_rank`` takes the ``fsdp`` mesh axis where those axes leave it
free (``dllm_rl.parallel.rules``), so no adapter is whole on every device.

Which projections: :data:`TARGETS` (``config.lora.targets``). MoE routed experts are not
adapted (a SwiGLU shared expert is). With adapters present the base is frozen:
:func:`freeze_base` puts every other parameter behind ``stop_gradient`` (the steps call it in
their loss) and ``dllm_rl.train.optim`` gives only :class:`LoraParam` leaves optimizer state.
:func:`merge_adapters` folds ``W + (α/r)·A·B`` into the base (export).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dllm_rl.types import DTYPES

# config name → the projection attribute it adapts (attention: layers.Attention, MLP: SwiGLU)
TARGETS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj",
           "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
SUFFIX = "_lora"  # the adapter of ``q_proj`` is the submodule ``q_proj_lora``
RANK_AXIS = "lora_rank"
ADAPTER_DTYPE = jnp.float32


class LoraParam(nnx.Param):
  """An adapter matrix (A or B): the only parameters trained when LoRA is on."""


def is_adapter(x: Any) -> bool:
  return isinstance(x, LoraParam)


class Adapter(nnx.Module):
  """``a`` [*I, r], ``b`` [r, *O] and the scale α/r of one projection."""

  def __init__(self, in_shape, in_axes, out_shape, out_axes, *, rank: int, alpha: float,
               rngs: nnx.Rngs):
    bound = 1.0 / math.sqrt(math.prod(in_shape))
    a = jax.random.uniform(rngs.params(), (*in_shape, rank), ADAPTER_DTYPE, -bound, bound)
    self.a = LoraParam(a, logical_axes=(*in_axes, RANK_AXIS))
    self.b = LoraParam(jnp.zeros((rank, *out_shape), ADAPTER_DTYPE),
                       logical_axes=(RANK_AXIS, *out_axes))
    self.scale = alpha / rank

  def __call__(self, x, dtype):
    """(α/r)·(x·A)·B for x [..., *I] → [..., *O], matmuls in ``dtype``."""
    n_in = self.a.ndim - 1
    xa = jnp.tensordot(x.astype(dtype), self.a[...].astype(dtype), axes=n_in)
    return self.scale * jnp.tensordot(xa, self.b[...].astype(dtype), axes=1)


def adapter(cfg, name: str, weight: nnx.Param, n_in: int, rngs: nnx.Rngs) -> Adapter | None:
  """The adapter of projection ``name`` ("q_proj", ...) with ``n_in`` input dims, or None when
  LoRA is off (``cfg.lora_rank`` 0) or the projection is not in ``cfg.lora_targets``."""
  if not cfg.lora_rank or name not in {TARGETS[t] for t in cfg.lora_targets}:
    return None
  shape, axes = weight[...].shape, weight.get_metadata()["logical_axes"]
  return Adapter(shape[:n_in], axes[:n_in], shape[n_in:], axes[n_in:], rank=cfg.lora_rank,
                 alpha=cfg.lora_alpha, rngs=rngs)


def add(y, lora: Adapter | None, x, dtype):
  """``y`` (= x·W) plus the adapter's term; ``y`` itself when there is no adapter."""
  return y if lora is None else y + lora(x, dtype).astype(y.dtype)


def configure(model_cfg, lora_cfg):
  """``model_cfg`` (a ModelConfig) with the ``config.lora`` section applied: adapters of
  rank ``lora_cfg.rank`` on ``lora_cfg.targets`` and the base stored in ``base_dtype``;
  unchanged when the rank is 0."""
  if not lora_cfg.rank:
    return model_cfg
  return dataclasses.replace(model_cfg, lora_rank=lora_cfg.rank, lora_alpha=float(lora_cfg.alpha),
                             lora_targets=tuple(lora_cfg.targets),
                             param_dtype=DTYPES[lora_cfg.base_dtype])


_MLP_TARGETS = ("gate", "up", "down")


def targets_problem(model_cfg) -> str | None:
  """Why ``model_cfg``'s ``lora_targets`` adapt no projection of the model (None when some
  are adapted, or LoRA is off): MLP targets alone on a model whose every MLP is routed
  experts (not adapted) with no shared expert; such a run would train nothing."""
  if not model_cfg.lora_rank or not set(model_cfg.lora_targets) <= set(_MLP_TARGETS):
    return None
  dense = [i for i in range(model_cfg.n_layers) if not model_cfg.is_moe_layer(i)]
  if dense or model_cfg.n_shared_experts:
    return None
  return (f"{tuple(model_cfg.lora_targets)} adapt no projection of this model: every layer's"
          " MLP is routed experts, which LoRA does not adapt (no shared expert, no dense"
          " layer), so the run would train nothing; add attention targets (q, k, v, o)")


def without_lora(model_cfg):
  """The same model without adapters (the export / merged layout)."""
  return dataclasses.replace(model_cfg, lora_rank=0, lora_targets=())


def rank_bounds(params) -> dict[str, int]:
  """Projection name ("q_proj", ...) → min(input size, output size) of its base weight, for
  each adapted projection in ``params`` (abstract shapes will do): the rank above which
  (α/r)·A·B cannot grow (A [*I, r], B [r, *O])."""
  sizes: dict[str, dict[str, int]] = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    at = next((i for i, k in enumerate(keys) if k.endswith(SUFFIX)), None)
    if at is None or at + 1 >= len(keys) or keys[at + 1] not in ("a", "b"):
      continue
    shape = leaf.shape
    size = math.prod(shape[:-1]) if keys[at + 1] == "a" else math.prod(shape[1:])
    sizes.setdefault(keys[at][:-len(SUFFIX)], {})[keys[at + 1]] = size
  return {name: min(d.values()) for name, d in sizes.items()}


def has_adapters(params: nnx.State) -> bool:
  return any(is_adapter(v) for v in jax.tree.leaves(params, is_leaf=is_adapter))


def freeze_base(params: nnx.State) -> nnx.State:
  """Every non-adapter parameter behind ``stop_gradient`` when adapters are present (the
  base gets no gradient); ``params`` unchanged otherwise."""
  if not has_adapters(params):
    return params
  stop = lambda v: v if is_adapter(v) else v.replace(jax.lax.stop_gradient(v[...]))
  return jax.tree.map(stop, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def split_adapters(params: nnx.State) -> tuple[nnx.State, nnx.State]:
  """(adapters, everything else)."""
  return nnx.split_state(params, LoraParam, ...)


def delta_weight(a, b, scale: float) -> jax.Array:
  """(α/r)·A·B in float32, shaped like the base weight [*I, *O]."""
  return scale * jnp.tensordot(a.astype(jnp.float32), b.astype(jnp.float32), axes=1)


def merge_pure(tree: dict, scale: float) -> dict:
  """A pure-dict params tree with adapters → the same tree without them, every adapted
  weight replaced by ``W + scale·A·B`` in float32."""
  out = {}
  for key, value in tree.items():
    if isinstance(key, str) and key.endswith(SUFFIX):
      continue
    if isinstance(value, dict):
      value = merge_pure(value, scale)
    lora = tree.get(f"{key}{SUFFIX}") if isinstance(key, str) else None
    if lora is not None:  # float32: the delta is not rounded to the base's dtype
      value = value.astype(jnp.float32) + delta_weight(lora["a"], lora["b"], scale)
    out[key] = value
  return out


def merge_adapters(params: nnx.State, cfg, base_abstract: nnx.State) -> nnx.State:
  """Adapters folded into their base weights: a params state shaped like ``base_abstract``
  (the same model without LoRA, :func:`dllm_rl.models.transformer.abstract_model`)."""
  merged = merge_pure(nnx.to_pure_dict(params), cfg.lora_alpha / cfg.lora_rank)
  out = jax.tree.map(lambda x: x, base_abstract)
  nnx.replace_by_pure_dict(out, merged)
  return out
