"""The pure, jitted RL step: ``rl_step(state, batch, key) -> (state, metrics)``.

One call consumes one rollout batch (B prompts × G completions, rewards from
the host verifiers) and performs μ = ``inner_steps`` policy updates:

1. advantages from the rewards (and, for StepRS, the denoising progress of the
   state in which each token was unmasked);
2. ℓ̂_old under θ_old = the parameters at entry, once per inner iteration key,
   without gradient (and ℓ̂_ref under the reference when ``kl_coef > 0``);
3. μ updates, each with fresh estimator masks: ℓ̂_θ → log ρ̂ = ℓ̂_θ − ℓ̂_old →
   policy loss (+ KL) → grads → optax.

Noise sharing: inner iteration m draws its masks from key_m. ℓ̂_old (and
ℓ̂_ref) for iteration m use key_m; ℓ̂_θ uses key_m too when ``antithetic`` (so
the ratio is exactly 1 before the first update) and an independent key
otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct

from dllm_rl.diffusion.estimators import ESTIMATORS, EstimatorConfig
from dllm_rl.models import transformer
from dllm_rl.parallel.constraints import jit_sharded
from dllm_rl.parallel.shard import replicated
from dllm_rl.rl import advantages as adv_lib
from dllm_rl.rl.losses import LOSSES, LossConfig, kl_penalty, ratio_metrics
from dllm_rl.types import SequenceBatch, TrainState


@struct.dataclass
class RolloutBatch:
  """One rollout batch: prompts [B, P], completions and unmask steps [B, G, L],
  rewards and correctness [B, G] (host verifiers)."""

  prompt_BP: jax.Array
  prompt_valid_BP: jax.Array
  completion_BGL: jax.Array
  unmask_step_BGL: jax.Array
  rewards_BG: jax.Array
  correct_BG: jax.Array


@dataclasses.dataclass(frozen=True)
class RLStepConfig:
  """Static options of the step (hashable)."""

  loss: str
  advantage: str
  estimator: str
  estimator_cfg: EstimatorConfig
  loss_cfg: LossConfig
  advantage_cfg: Any
  inner_steps: int
  num_states: int        # denoising states of the sampler (StepRS progress)
  kl_coef: float = 0.0
  kl_estimator: str = "k3"
  mask_id: int = 2
  eos_id: int = 1


def flatten_groups(batch: RolloutBatch) -> SequenceBatch:
  """[B, G] groups → B·G sequences (prompts repeated G times); all L completion
  tokens (answer, EOS and EOS fill) form the action."""
  b, g, l = batch.completion_BGL.shape
  rep = lambda a: jnp.repeat(a, g, axis=0)
  return SequenceBatch(prompt_BP=rep(batch.prompt_BP), prompt_valid_BP=rep(batch.prompt_valid_BP),
                       completion_BL=batch.completion_BGL.reshape(b * g, l),
                       completion_valid_BL=jnp.ones((b * g, l), bool))


def completion_lengths(completion_BGL, eos_id: int):
  """Tokens up to and including the first EOS (L when there is none)."""
  is_eos = completion_BGL == eos_id
  first = jnp.where(is_eos.any(-1), jnp.argmax(is_eos, axis=-1) + 1, completion_BGL.shape[-1])
  return first.astype(jnp.float32)


def _group(tree, b: int, g: int):
  return jax.tree.map(lambda a: a.reshape((b, g) + a.shape[1:]), tree)


def make_rl_step(graphdef, optimizer: optax.GradientTransformation, schedule: optax.Schedule,
                 cfg: RLStepConfig, *, mesh=None, state_sharding=None) -> Callable:
  """Build the jitted step (state donated). With a ``mesh``, the new state keeps
  ``state_sharding`` and the metrics are replicated."""
  estimator = ESTIMATORS.get(cfg.estimator)
  loss_fn_ = LOSSES.get(cfg.loss)
  advantage_fn = adv_lib.ADVANTAGES.get(cfg.advantage)

  def estimate(params, seqs, key):
    logits_fn = lambda *a: transformer.apply(graphdef, params, *a)
    return estimator(logits_fn, seqs, key, cfg.estimator_cfg, cfg.mask_id)

  def rl_step(state: TrainState, batch: RolloutBatch, key: jax.Array):
    b, g, l = batch.completion_BGL.shape
    seqs = flatten_groups(batch)
    mask_BGL = seqs.completion_valid_BL.reshape(b, g, l)
    progress_BGL = adv_lib.progress_from_unmask_step(batch.unmask_step_BGL, cfg.num_states)
    rewards_BG = batch.rewards_BG.astype(jnp.float32)
    adv_BGL = advantage_fn(rewards_BG, progress_BGL, mask_BGL, cfg.advantage_cfg)
    lengths_BG = completion_lengths(batch.completion_BGL, cfg.eos_id)
    keys_M = jax.random.split(key, cfg.inner_steps)
    params_old = jax.lax.stop_gradient(state.params)
    old = jax.lax.map(lambda k: _group(estimate(params_old, seqs, k), b, g), keys_M)
    ref = None
    if cfg.kl_coef > 0:
      ref = jax.lax.map(lambda k: _group(estimate(state.ref_params, seqs, k), b, g).seq_B, keys_M)

    def inner(carry, m):
      params, opt_state, step = carry
      k_theta = keys_M[m] if cfg.estimator_cfg.antithetic else jax.random.fold_in(keys_M[m], 1)
      lik_old = jax.tree.map(lambda a: a[m], old)

      def loss_fn(p):
        lik = _group(estimate(p, seqs, k_theta), b, g)
        loss, aux = loss_fn_(lik, lik_old, adv_BGL, mask_BGL, lengths_BG, cfg.loss_cfg)
        aux = dict(aux, **ratio_metrics(lik.seq_B - lik_old.seq_B, adv_BGL, mask_BGL,
                                        cfg.loss_cfg.eps))
        aux["entropy"] = lik.entropy_B.mean()
        aux["policy_loss"] = loss
        if ref is not None:
          kl = kl_penalty(lik.seq_B, ref[m], cfg.kl_estimator)
          loss = loss + cfg.kl_coef * kl
          aux["kl"] = kl
        return loss, aux

      (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
      updates, opt_state = optimizer.update(grads, opt_state, params)
      params = optax.apply_updates(params, updates)
      aux = dict(aux, loss=loss, grad_norm=optax.tree.norm(grads), lr=schedule(step))
      return (params, opt_state, step + 1), aux

    (params, opt_state, step), inner_M = jax.lax.scan(
        inner, (state.params, state.opt_state, state.step), jnp.arange(cfg.inner_steps))
    metrics = {k: v.mean() for k, v in inner_M.items()}
    metrics["ratio_max"] = inner_M["ratio_max"].max()
    metrics["grad_norm_max"] = inner_M["grad_norm"].max()
    metrics["ratio_max_first"] = inner_M["ratio_max"][0]  # 1 exactly with antithetic masks
    metrics.update(
        reward_mean=rewards_BG.mean(), accuracy=batch.correct_BG.astype(jnp.float32).mean(),
        reward_std_within_group=rewards_BG.std(-1).mean(),
        adv_abs_mean=jnp.abs(adv_BGL).mean(),
        completion_length=lengths_BG.mean())
    new_state = state.replace(step=step, params=params, opt_state=opt_state)
    return new_state, metrics

  out = None if mesh is None else (state_sharding, replicated(mesh))
  return jit_sharded(rl_step, mesh, out_shardings=out, donate_argnums=0)
