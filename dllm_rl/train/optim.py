"""Optimiser: optax AdamW with warm-up + decay schedule and global-norm clipping, wrapped so
that an update with a non-finite gradient is skipped (`skip_nonfinite`)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dllm_rl.config.choices import LR_SCHEDULES
from dllm_rl.models import lora
from dllm_rl.models.layers import FrozenParam


def learning_rate_schedule(lr: float, steps: int, warmup_steps: int, kind: str) -> optax.Schedule:
  """Linear warm-up to ``lr`` then constant / cosine / linear decay to 0 at ``steps``."""
  decay_steps = max(steps - warmup_steps, 1)
  decays = {
      "constant": lambda: optax.constant_schedule(lr),
      "cosine": lambda: optax.cosine_decay_schedule(lr, decay_steps),
      "linear": lambda: optax.linear_schedule(lr, 0.0, decay_steps),
  }
  assert tuple(decays) == LR_SCHEDULES, "config.choices.LR_SCHEDULES and the decays differ"
  if kind not in decays:
    raise ValueError(f"unknown learning-rate schedule {kind!r}; choose from {LR_SCHEDULES}")
  decay = decays[kind]()
  if warmup_steps == 0:
    return decay
  warm = optax.linear_schedule(0.0, lr, warmup_steps)
  return optax.join_schedules([warm, decay], [warmup_steps])


class SkipNonFiniteState(NamedTuple):
  """The wrapped optimiser's state and two counters of skipped (non-finite) updates."""
  inner: optax.OptState
  consecutive: jax.Array  # int32: skipped updates since the last applied one
  total: jax.Array        # int32: skipped updates over the whole phase


def skip_nonfinite(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """Skip an update whose gradients are not all finite: zero update, ``inner`` state unchanged.

  A non-finite loss (e.g. a NaN reward reaching the advantages) makes the gradient norm
  non-finite, so checking the gradients covers both. The parameters and the optimiser moments
  are then exactly those before the step; only the counters move. Unlike
  ``optax.apply_if_finite`` the update is never forced through after many failures: stopping
  the run is the training loop's decision (``train.max_consecutive_nonfinite``).
  """

  def init(params):
    zero = jnp.zeros((), jnp.int32)
    return SkipNonFiniteState(inner.init(params), zero, zero)

  def update(grads, state, params=None):
    finite = jnp.all(jnp.asarray([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
    updates, new_inner = inner.update(grads, state.inner, params)
    pick = lambda new, old: jnp.where(finite, new, old)
    updates = jax.tree.map(lambda u: jnp.where(finite, u, jnp.zeros_like(u)), updates)
    new_inner = jax.tree.map(pick, new_inner, state.inner)
    bad = 1 - finite.astype(jnp.int32)
    return updates, SkipNonFiniteState(new_inner, (state.consecutive + bad) * bad,
                                       state.total + bad)

  return optax.GradientTransformation(init, update)


def keep_frozen() -> optax.GradientTransformation:
  """Zero the update of every :class:`~dllm_rl.models.layers.FrozenParam` (e.g. the MoE
  routing bias): Adam moments of a zero gradient are zero, but weight decay would still
  move it. Stateless; other parameters pass through unchanged."""

  def update(updates, state, params=None):
    del params
    frozen = lambda u: (u.replace(jnp.zeros_like(u[...])) if isinstance(u, FrozenParam) else u)
    return jax.tree.map(frozen, updates, is_leaf=lambda x: isinstance(x, nnx.Variable)), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def skip_counters(opt_state) -> tuple[int, int]:
  """(consecutive, total) skipped updates from a `skip_nonfinite` state (host ints)."""
  return int(opt_state.consecutive), int(opt_state.total)


def adapters_only(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """``inner`` on the LoRA adapters (:class:`~dllm_rl.models.lora.LoraParam`) alone: it holds
  state (Adam moments) for them only, clips their norm alone, and every other parameter's
  update is zero (the frozen base)."""

  def labels(params):
    return jax.tree.map(lambda v: "adapter" if lora.is_adapter(v) else "base", params,
                        is_leaf=lambda x: isinstance(x, nnx.Variable))

  return optax.multi_transform({"adapter": inner, "base": optax.set_to_zero()}, labels)


def make_optimizer(opt_cfg, *, lora_only: bool = False
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """From a section with lr, steps, warmup_steps, schedule, b1, b2, weight_decay, grad_clip.

  The result is wrapped in `skip_nonfinite`, so its state is a `SkipNonFiniteState`;
  frozen parameters (`keep_frozen`) never move. ``lora_only``: only the LoRA adapters are
  optimised (:func:`adapters_only`)."""
  schedule = learning_rate_schedule(opt_cfg.lr, opt_cfg.steps, opt_cfg.warmup_steps, opt_cfg.schedule)
  tx = optax.chain(
      optax.adamw(schedule, b1=opt_cfg.b1, b2=opt_cfg.b2, weight_decay=opt_cfg.weight_decay),
      keep_frozen())
  if opt_cfg.grad_clip > 0:
    tx = optax.chain(optax.clip_by_global_norm(opt_cfg.grad_clip), tx)
  return skip_nonfinite(adapters_only(tx) if lora_only else tx), schedule
