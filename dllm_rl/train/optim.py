"""Optimiser: optax AdamW with warm-up + decay schedule and global-norm clipping."""

from __future__ import annotations

import optax


def learning_rate_schedule(lr: float, steps: int, warmup_steps: int, kind: str) -> optax.Schedule:
  """Linear warm-up to ``lr`` then constant / cosine / linear decay to 0 at ``steps``."""
  decay_steps = max(steps - warmup_steps, 1)
  decay = {
      "constant": optax.constant_schedule(lr),
      "cosine": optax.cosine_decay_schedule(lr, decay_steps),
      "linear": optax.linear_schedule(lr, 0.0, decay_steps),
  }[kind]
  if warmup_steps == 0:
    return decay
  warm = optax.linear_schedule(0.0, lr, warmup_steps)
  return optax.join_schedules([warm, decay], [warmup_steps])


def make_optimizer(opt_cfg) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """From a section with lr, steps, warmup_steps, schedule, b1, b2, weight_decay, grad_clip."""
  schedule = learning_rate_schedule(opt_cfg.lr, opt_cfg.steps, opt_cfg.warmup_steps, opt_cfg.schedule)
  adamw = optax.adamw(schedule, b1=opt_cfg.b1, b2=opt_cfg.b2, weight_decay=opt_cfg.weight_decay)
  if opt_cfg.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(opt_cfg.grad_clip), adamw), schedule
  return adamw, schedule
