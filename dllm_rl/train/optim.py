"""Optimiser: optax AdamW with warm-up + decay schedule and global-norm clipping, wrapped so
that an update with a non-finite gradient is skipped (`skip_nonfinite`).

The peak learning rate may be passed to ``update`` as the extra argument ``lr`` (a traced
scalar): the jitted RL step then takes it as an input, and runs that differ only in their
learning rate share one compiled program (``dllm_rl.rl.step.StepHyper``). Without it the
config's ``lr`` is used; both give the same arithmetic."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dllm_rl.config.choices import LR_SCHEDULES
from dllm_rl.models import lora
from dllm_rl.models.layers import FrozenParam


def learning_rate_schedule(lr, steps: int, warmup_steps: int, kind: str,
                           min_ratio: float = 0.0) -> optax.Schedule:
  """Linear warm-up to ``lr`` then constant / cosine / linear decay to ``min_ratio · lr`` at
  ``steps`` (``lr``: a float or a traced float32 scalar). The cosine with a floor is HF's
  ``cosine_with_min_lr`` (``min_lr_rate`` = ``min_ratio``): min + (lr − min)·½(1 + cos πu)."""
  decay_steps = max(steps - warmup_steps, 1)
  decays = {
      "constant": lambda: optax.constant_schedule(lr),
      "cosine": lambda: optax.cosine_decay_schedule(lr, decay_steps, alpha=min_ratio),
      "linear": lambda: optax.linear_schedule(lr, lr * min_ratio, decay_steps),
  }
  assert tuple(decays) == LR_SCHEDULES, "config.choices.LR_SCHEDULES and the decays differ"
  if kind not in decays:
    raise ValueError(f"unknown learning-rate schedule {kind!r}; choose from {LR_SCHEDULES}")
  decay = decays[kind]()
  if warmup_steps == 0:
    return decay
  warm = optax.linear_schedule(0.0, lr, warmup_steps)
  return optax.join_schedules([warm, decay], [warmup_steps])


class PeakSchedule:
  """``schedule(count, lr=None)``: the learning rate at update ``count`` of a schedule whose
  peak is ``lr`` (default: the config's)."""

  def __init__(self, lr: float, of_peak: Callable[[object], optax.Schedule]):
    self._of_peak, self._default = of_peak, of_peak(lr)

  def __call__(self, count, lr=None):
    return self._default(count) if lr is None else self._of_peak(lr)(count)


def scale_by_peak_schedule(schedule: PeakSchedule) -> optax.GradientTransformationExtraArgs:
  """``optax.scale_by_learning_rate(schedule)`` (the same state and arithmetic: updates ×
  −schedule(count)) whose ``update`` takes the peak lr as the extra argument ``lr``."""

  def init(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update(updates, state, params=None, *, lr=None, **extra_args):
    del params, extra_args
    step_size = -1 * schedule(state.count, lr)
    updates = jax.tree.map(lambda g: jnp.array(step_size, dtype=g.dtype) * g, updates)
    return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

  return optax.GradientTransformationExtraArgs(init, update)


class SkipNonFiniteState(NamedTuple):
  """The wrapped optimiser's state and two counters of skipped (non-finite) updates."""
  inner: optax.OptState
  consecutive: jax.Array  # int32: skipped updates since the last applied one
  total: jax.Array        # int32: skipped updates over the whole phase


def skip_nonfinite(inner: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
  """Skip an update whose gradients are not all finite: zero update, ``inner`` state unchanged.

  A non-finite loss (e.g. a NaN reward reaching the advantages) makes the gradient norm
  non-finite, so checking the gradients covers both. The parameters and the optimiser moments
  are then exactly those before the step; only the counters move. Unlike
  ``optax.apply_if_finite`` the update is never forced through after many failures: stopping
  the run is the training loop's decision (``train.max_consecutive_nonfinite``). Extra
  arguments of ``update`` (the peak ``lr``) reach ``inner``.
  """
  inner = optax.with_extra_args_support(inner)

  def init(params):
    zero = jnp.zeros((), jnp.int32)
    return SkipNonFiniteState(inner.init(params), zero, zero)

  def update(grads, state, params=None, **extra_args):
    finite = jnp.all(jnp.asarray([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
    updates, new_inner = inner.update(grads, state.inner, params, **extra_args)
    pick = lambda new, old: jnp.where(finite, new, old)
    updates = jax.tree.map(lambda u: jnp.where(finite, u, jnp.zeros_like(u)), updates)
    new_inner = jax.tree.map(pick, new_inner, state.inner)
    bad = 1 - finite.astype(jnp.int32)
    return updates, SkipNonFiniteState(new_inner, (state.consecutive + bad) * bad,
                                       state.total + bad)

  return optax.GradientTransformationExtraArgs(init, update)


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
                   ) -> tuple[optax.GradientTransformationExtraArgs, PeakSchedule]:
  """From a section with lr, steps, warmup_steps, schedule, min_lr_ratio, b1, b2,
  weight_decay, grad_clip.

  The result is wrapped in `skip_nonfinite`, so its state is a `SkipNonFiniteState`;
  frozen parameters (`keep_frozen`) never move. ``lora_only``: only the LoRA adapters are
  optimised (:func:`adapters_only`). ``update(..., lr=x)`` scales the schedule to peak
  ``x`` (a traced scalar; :class:`PeakSchedule`). The AdamW chain is ``optax.adamw``'s
  (Adam, decoupled weight decay, −lr(t)), with the same state."""
  schedule = PeakSchedule(opt_cfg.lr, lambda lr: learning_rate_schedule(
      lr, opt_cfg.steps, opt_cfg.warmup_steps, opt_cfg.schedule,
      getattr(opt_cfg, "min_lr_ratio", 0.0)))
  adamw = optax.chain(optax.scale_by_adam(b1=opt_cfg.b1, b2=opt_cfg.b2),
                      optax.add_decayed_weights(opt_cfg.weight_decay),
                      scale_by_peak_schedule(schedule))
  tx = optax.chain(adamw, keep_frozen())
  if opt_cfg.grad_clip > 0:
    tx = optax.chain(optax.clip_by_global_norm(opt_cfg.grad_clip), tx)
  return skip_nonfinite(adapters_only(tx) if lora_only else tx), schedule
