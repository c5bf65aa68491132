"""The pure, jitted RL step: ``rl_step(state, batch, key) -> (state, metrics)``.

One call consumes one rollout batch (B prompts × G completions, rewards from
the host verifiers) and performs μ = ``inner_steps`` policy updates:

1. advantages from the rewards (and, for StepRS, the denoising progress of the
   state in which each token was unmasked);
2. ℓ̂_old under θ_old = the parameters at entry, once per inner iteration key,
   without gradient (and ℓ̂_ref under the reference when ``kl_coef > 0``);
3. μ updates, each with fresh estimator masks: ℓ̂_θ → log ρ̂ = ℓ̂_θ − ℓ̂_old →
   policy loss (+ KL) → grads → optax.

The action of a completion is its tokens through the first EOS
(:func:`flatten_groups`): later positions are never scored, masked by the
estimators' random draws or trained, and they are fed as EOS whatever the
sampler wrote there, so nothing after the first EOS changes any loss, gradient
or metric (DESIGN "Masked diffusion basics").

Noise (DESIGN "Likelihood estimators"), one of two schemes:

* independent (``antithetic=False``, the official StableDRL code): ℓ̂_old is
  estimated once per rollout batch with its own key; inner iteration m draws a
  fresh, independent key for ℓ̂_θ (and ℓ̂_ref). At m = 0, θ = θ_old and
  log ρ̂ = ℓ̂_θ − ℓ̂_old is pure estimator noise — the regime StableDRL is for.
* antithetic (``antithetic=True``, this project's variance reduction):
  iteration m's key is shared by ℓ̂_θ, ℓ̂_old and ℓ̂_ref, so the mask noise
  cancels in the ratio (1 before the first update, up to float rounding); ℓ̂_old is then
  estimated once per inner iteration.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct

from dllm_rl.diffusion.estimators import ESTIMATORS, EstimatorConfig, batch_entropy
from dllm_rl.diffusion.scoring import ModelScorer
from dllm_rl.models import lora
from dllm_rl.parallel.constraints import jit_sharded
from dllm_rl.parallel.shard import replicated
from dllm_rl.rl import advantages as adv_lib
from dllm_rl.rl import micro
from dllm_rl.rl.losses import (LOSSES, LossConfig, kl_penalty, kl_penalty_tokens,
                               ratio_metrics)
from dllm_rl.rl.losses import checked_output as checked_loss_output
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


@struct.dataclass
class StepHyper:
  """Hyperparameters the jitted step takes as traced float32 scalars, not constants: runs that
  differ only in them (a learning-rate grid, StepRS's β schedules) share one compiled
  program, and the persistent compilation cache serves every run after the first.

  ``lr`` is the peak learning rate, passed to the optimizer's ``update`` as the extra
  argument ``lr`` (``dllm_rl.train.optim.make_optimizer``): the same arithmetic as the lr
  compiled in (the embedded default's RL metrics are bit-identical). ``beta``,
  ``beta_start`` and ``beta_end`` replace those numbers of ``RLStepConfig.advantage_cfg``
  (its ``beta_schedule`` stays static); the advantages are computed so that β as an input
  gives those of the same β compiled in, bit for bit (``dllm_rl.rl.advantages``)."""

  lr: jax.Array
  beta: jax.Array
  beta_start: jax.Array
  beta_end: jax.Array

  @classmethod
  def of(cls, lr: float, advantage_cfg) -> "StepHyper":
    """``lr`` and the ``beta``, ``beta_start`` and ``beta_end`` of ``advantage_cfg`` (an
    ``AdvantageConfig``, or the config's ``rl`` section) as float32 scalars."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    a = advantage_cfg
    return cls(lr=f32(lr), beta=f32(a.beta), beta_start=f32(a.beta_start),
               beta_end=f32(a.beta_end))

  def advantage_config(self, advantage_cfg):
    """``advantage_cfg`` (an ``AdvantageConfig``) with this step's β numbers."""
    return dataclasses.replace(advantage_cfg, beta=self.beta, beta_start=self.beta_start,
                               beta_end=self.beta_end)


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
  dynamic_states: bool = False  # threshold sampler: StepRS progress per row (u = s_i/(S_i − 1))
  kl_coef: float = 0.0
  kl_estimator: str = "k3"
  kl_level: str = "sequence"  # sequence: on ℓ̂ per sequence | token: per action token
  ref_sync_every: int = 0     # optimizer updates between reference syncs (0 = fixed reference)
  ref_sync_alpha: float = 0.6  # a sync: π_ref ← α·π_θ + (1 − α)·π_ref (TR-DPO, TRL)
  mask_id: int = 2
  eos_id: int = 1
  micro_batch: int = 0   # sequences per forward/backward (dllm_rl.rl.micro); 0 = one pass


def action_mask(completion_BxL, eos_id: int):
  """True on the action: the tokens through the first EOS (all L without EOS)."""
  before_BxL = jnp.cumsum(completion_BxL == eos_id, axis=-1) - (completion_BxL == eos_id) == 0
  return before_BxL


def flatten_groups(batch: RolloutBatch, eos_id: int) -> SequenceBatch:
  """[B, G] groups → B·G sequences (prompts repeated G times).

  The action — the tokens through the first EOS — is ``completion_valid_BL``;
  every later position is set to EOS (the sampler's fill), so what the sampler
  committed there reaches no estimator. The unmask steps travel along (the
  ``trajectory`` estimator replays the states from them).
  """
  b, g, l = batch.completion_BGL.shape
  rep = lambda a: jnp.repeat(a, g, axis=0)
  completion_BL = batch.completion_BGL.reshape(b * g, l)
  valid_BL = action_mask(completion_BL, eos_id)
  return SequenceBatch(prompt_BP=rep(batch.prompt_BP), prompt_valid_BP=rep(batch.prompt_valid_BP),
                       completion_BL=jnp.where(valid_BL, completion_BL, eos_id),
                       completion_valid_BL=valid_BL,
                       unmask_step_BL=batch.unmask_step_BGL.reshape(b * g, l))


def uniform_reward_groups(rewards_BG: jax.Array) -> jax.Array:
  """The fraction of the B prompts whose G rewards are all equal: centered or normalised
  advantages are 0 there, so they give no policy gradient (DAPO's dynamic sampling drops
  such groups)."""
  return (rewards_BG == rewards_BG[:, :1]).all(-1).mean()


def completion_lengths(completion_BGL, eos_id: int):
  """Tokens up to and including the first EOS (L when there is none)."""
  return action_mask(completion_BGL, eos_id).sum(-1).astype(jnp.float32)


def sync_reference(ref_params, params, updates, every: int, alpha: float):
  """The reference after optimizer update number ``updates`` (1-based): α·θ + (1 − α)·ref
  when ``updates`` is a multiple of ``every`` (TRL's ``SyncRefModelCallback``: TR-DPO's
  soft update at ``global_step % ref_model_sync_steps == 0``), else unchanged; each leaf
  keeps its dtype. The batch's reference log-probabilities were taken before its updates,
  so a sync reaches the next rollout batch, as in TRL (they are computed at generation)."""
  due = (updates % every) == 0

  def mix(r, p):
    mixed = alpha * p.astype(jnp.float32) + (1.0 - alpha) * r.astype(jnp.float32)
    return jnp.where(due, mixed.astype(r.dtype), r)

  return jax.tree.map(mix, ref_params, params)


def _group(tree, b: int, g: int):
  return jax.tree.map(lambda a: a.reshape((b, g) + a.shape[1:]), tree)


def make_rl_step(graphdef, optimizer: optax.GradientTransformation, schedule: optax.Schedule,
                 cfg: RLStepConfig, *, mesh=None, state_sharding=None) -> Callable:
  """Build the jitted ``rl_step(state, batch, key, hyper=None)`` (state donated). With a
  ``mesh``, the new state keeps ``state_sharding`` and the metrics are replicated.

  ``hyper`` (:class:`StepHyper`): the learning rate and the advantages' β numbers as traced
  inputs (``cfg.advantage_cfg``'s are then unused: the program does not depend on them);
  ``optimizer`` must then take ``update(..., lr=)`` and ``schedule(step, lr)``
  (``train.optim``). None: the optimizer and schedule as given and ``cfg``'s β, compiled in
  as constants."""
  estimator = ESTIMATORS.get(cfg.estimator)
  loss_fn_ = LOSSES.get(cfg.loss)
  advantage_fn = adv_lib.ADVANTAGES.get(cfg.advantage)
  est_cfg = cfg.estimator_cfg
  # LoRA: the base behind stop_gradient, so gradients reach the adapters only
  make_scorer = lambda params: ModelScorer(graphdef, lora.freeze_base(params), est_cfg.logits_chunk)

  def rl_step(state: TrainState, batch: RolloutBatch, key: jax.Array,
              hyper: StepHyper | None = None):
    b, g, l = batch.completion_BGL.shape
    opt_args = {} if hyper is None else {"lr": hyper.lr}
    adv_cfg = cfg.advantage_cfg if hyper is None else hyper.advantage_config(cfg.advantage_cfg)
    seqs = flatten_groups(batch, cfg.eos_id)
    n_micro = b * g // cfg.micro_batch if cfg.micro_batch else 0

    def score_micro(params, key):
      """(draws, logp_KBL, entropy_KBL) of every sequence, micro-batch by micro-batch,
      without gradient."""
      draws = estimator.draw(key, seqs, est_cfg, cfg.mask_id)
      return (draws,) + micro.score_micro(estimator, make_scorer, params, seqs, draws, est_cfg,
                                          n_micro)

    def reduce(draws, logp_KBL, ent_KBL):
      return _group(estimator.reduce(logp_KBL, ent_KBL, seqs, draws, est_cfg), b, g)

    def estimate(params, key):
      """ℓ̂ of every sequence, [B, G]-grouped (no-grad use in micro-batched mode)."""
      if not n_micro:
        return _group(estimator(make_scorer(params), seqs, key, est_cfg, cfg.mask_id), b, g)
      return reduce(*score_micro(params, key))

    mask_BGL = seqs.completion_valid_BL.reshape(b, g, l)
    if cfg.dynamic_states:
      progress_BGL = adv_lib.progress_per_row(batch.unmask_step_BGL, mask_BGL)
    else:
      progress_BGL = adv_lib.progress_from_unmask_step(batch.unmask_step_BGL, cfg.num_states)
    rewards_BG = batch.rewards_BG.astype(jnp.float32)
    adv_BGL = adv_lib.checked_output(
        cfg.advantage, advantage_fn(rewards_BG, progress_BGL, mask_BGL, adv_cfg), mask_BGL)
    lengths_BG = mask_BGL.sum(-1).astype(jnp.float32)
    k_old, k_inner = jax.random.split(key)
    keys_M = jax.random.split(k_inner, cfg.inner_steps)
    params_old = jax.lax.stop_gradient(state.params)
    if est_cfg.antithetic:  # ℓ̂_old per inner iteration, on that iteration's masks
      old = jax.lax.map(lambda k: estimate(params_old, k), keys_M)
      old_at = lambda m: jax.tree.map(lambda a: a[m], old)
    else:  # ℓ̂_old once, on masks of its own
      old_once = estimate(params_old, k_old)
      old_at = lambda m: old_once
    # What the KL term reads of an estimate: per-token log-probabilities or ℓ̂ per sequence.
    kl_of = (lambda lik: lik.token_BL) if cfg.kl_level == "token" else (lambda lik: lik.seq_B)
    ref = None
    if cfg.kl_coef > 0:  # on θ's masks of each inner step, before this batch's updates
      ref = jax.lax.map(lambda k: kl_of(estimate(state.ref_params, k)), keys_M)

    def objective(lik, lik_old, m):
      """(loss, metrics) of the [B, G]-grouped estimate ``lik`` at inner step m."""
      loss, aux = checked_loss_output(
          cfg.loss, loss_fn_(lik, lik_old, adv_BGL, mask_BGL, lengths_BG, cfg.loss_cfg))
      # the loss's own metrics win: its bypass_fraction where it clips another ratio (ESPO)
      aux = {**ratio_metrics(lik.seq_B - lik_old.seq_B, adv_BGL, mask_BGL, cfg.loss_cfg.eps),
             **aux}
      aux["entropy"] = batch_entropy(lik.entropy_B)
      aux["policy_loss"] = loss
      if ref is not None:
        kl = (kl_penalty_tokens(kl_of(lik), ref[m], mask_BGL, cfg.kl_estimator)
              if cfg.kl_level == "token" else kl_penalty(kl_of(lik), ref[m], cfg.kl_estimator))
        loss = loss + cfg.kl_coef * kl
        aux["kl"] = kl
      return loss, aux

    def loss_and_grads(params, k_theta, lik_old, m):
      if not n_micro:
        return jax.value_and_grad(lambda p: objective(estimate(p, k_theta), lik_old, m),
                                  has_aux=True)(params)
      # Micro-batched: per-draw log-probs without gradient, the loss's cotangent on them,
      # then one backward per (micro-batch, draw) — exactly the full-batch gradient.
      draws, logp_KBL, ent_KBL = score_micro(params, k_theta)
      (loss, aux), cot_KBL = jax.value_and_grad(
          lambda logp: objective(reduce(draws, logp, ent_KBL), lik_old, m), has_aux=True)(logp_KBL)
      grads = micro.accumulate_grads(estimator, make_scorer, params, seqs, draws, cot_KBL,
                                     est_cfg, n_micro)
      return (loss, aux), grads

    def inner(carry, m):
      params, opt_state, step, ref_params = carry
      (loss, aux), grads = loss_and_grads(params, keys_M[m], old_at(m), m)
      updates, opt_state = optimizer.update(grads, opt_state, params, **opt_args)
      params = optax.apply_updates(params, updates)
      aux = dict(aux, loss=loss, grad_norm=optax.tree.norm(grads), lr=schedule(step, **opt_args))
      if cfg.ref_sync_every and ref_params is not None:
        ref_params = sync_reference(ref_params, params, step + 1, cfg.ref_sync_every,
                                    cfg.ref_sync_alpha)
      return (params, opt_state, step + 1, ref_params), aux

    (params, opt_state, step, ref_params), inner_M = jax.lax.scan(
        inner, (state.params, state.opt_state, state.step, state.ref_params),
        jnp.arange(cfg.inner_steps))
    metrics = {k: v.mean() for k, v in inner_M.items()}
    metrics["ratio_max"] = inner_M["ratio_max"].max()
    metrics["grad_norm_max"] = inner_M["grad_norm"].max()
    metrics["log_ratio_max"] = inner_M["log_ratio_max"].max()
    metrics["ratio_max_first"] = inner_M["ratio_max"][0]  # 1 with antithetic masks (float rounding)
    metrics["abs_log_ratio_max"] = inner_M["abs_log_ratio_max"].max()
    for q in ("p50", "p90", "p99", "max"):  # the first inner step: θ = θ_old, pure noise
      metrics[f"abs_log_ratio_{q}_first"] = inner_M[f"abs_log_ratio_{q}"][0]
    metrics.update(
        reward_mean=rewards_BG.mean(), accuracy=batch.correct_BG.astype(jnp.float32).mean(),
        reward_std_within_group=rewards_BG.std(-1).mean(),
        uniform_reward_groups=uniform_reward_groups(rewards_BG),
        adv_abs_mean=jnp.abs(adv_BGL).mean(),  # over B·G·L positions, 0 after EOS (the mass)
        completion_length=lengths_BG.mean())
    new_state = state.replace(step=step, params=params, opt_state=opt_state,
                              ref_params=ref_params)
    return new_state, metrics

  out = None if mesh is None else (state_sharding, replicated(mesh))
  return jit_sharded(rl_step, mesh, out_shardings=out, donate_argnums=0)
