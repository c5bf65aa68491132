"""Group-relative advantages, registered by name.

Rewards come as ``rewards_BG`` (B prompts, G completions per prompt; the group
is the last axis). Sequence-level advantages (GRPO, Dr. GRPO, RS-GRPO) are
functions of the group only; StepRS-GRPO gives every completion token its own
risk-sensitivity β, set by the denoising state in which the sampler unmasked
it, so its advantages are per token, ``[B, G, L]``.

Every registered advantage has the one signature

    fn(rewards_BG, progress_BGL, mask_BGL, cfg) -> float32 adv_BGL

where ``progress_BGL`` ∈ [0, 1] is the normalised unmasking state of each token
(:func:`progress_from_unmask_step`), ``mask_BGL`` marks the completion tokens
that carry loss (the output is 0 elsewhere) and ``cfg`` is an
:class:`AdvantageConfig` (or anything with its attributes). All math is float32
and free of Python control flow on traced values, so everything jits.

Group means are computed as r₀ + mean(r − r₀) (r₀ the group's first reward), so
a group of identical rewards gets advantages that are exactly 0.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Mapping, Protocol

import jax
import jax.numpy as jnp

from dllm_rl.registry import Registry

ArrayLike = Any

BETA_SCHEDULES = ("linear", "cosine", "step")
_SMALL_BETA = 1e-6   # |β| below this: the β → 0 limit (centered / w = 1) is used
_LSE_SWITCH = 30.0   # max β(r − r̄) above this: log-mean-exp via logsumexp


# ---------------------------------------------------------------- sequence level


def _group_mean(r_xG: jax.Array) -> jax.Array:
  """Mean over the last axis, shifted by the first element (exact for constant groups)."""
  r0 = r_xG[..., :1]
  return (r0 + jnp.mean(r_xG - r0, axis=-1, keepdims=True))[..., 0]


@jax.jit
def centered(rewards_BG: ArrayLike) -> jax.Array:
  """Dr. GRPO (Liu et al. 2025, eq. 2 without the std): A_i = r_i − mean_j r_j."""
  r = jnp.asarray(rewards_BG, jnp.float32)
  return r - _group_mean(r)[..., None]


@jax.jit
def leave_one_out(rewards_BG: ArrayLike) -> jax.Array:
  """RLOO (Ahmadian et al. 2024): A_i = r_i − mean_{j ≠ i} r_j = G/(G − 1)·(r_i − mean_j r_j),
  no std scaling — the advantages of the official ESPO and DiffuCoder coupled-GRPO code
  (``leave_one_out = True``, ``scale_rewards: false``). For G = 1 it is 0."""
  d = centered(rewards_BG)
  g = d.shape[-1]
  return d * (g / (g - 1) if g > 1 else 0.0)


@jax.jit
def grpo(rewards_BG: ArrayLike, eps: float = 1e-4) -> jax.Array:
  """GRPO (Shao et al. 2024, eq. 3): A_i = (r_i − mean r) / (std r + eps).

  std uses ddof = 1 (the unbiased estimate, as TRL's GRPOTrainer and d1 via
  ``torch.std``); for G = 1 the std is taken as 0.
  """
  d = centered(rewards_BG)
  g = d.shape[-1]
  std = jnp.sqrt(jnp.sum(d * d, axis=-1, keepdims=True) / max(g - 1, 1))
  return d / (std + eps)


def _log_mean_exp(e_xG: jax.Array) -> jax.Array:
  """log mean_j exp(e_j) over the last axis, accurate when all |e_j| ≪ 1 too.

  log1p(mean expm1(e)) keeps full relative precision for tiny e (logsumexp − log G
  would cancel against log G); logsumexp takes over when exp(e) could overflow.
  The small branch sees e clipped, so gradients are finite on both branches.
  """
  m = jnp.max(e_xG, axis=-1)
  small = jnp.log1p(jnp.mean(jnp.expm1(jnp.minimum(e_xG, _LSE_SWITCH)), axis=-1))
  large = jax.nn.logsumexp(e_xG, axis=-1) - math.log(e_xG.shape[-1])
  return jnp.where(m > _LSE_SWITCH, large, small)


def _rs(r_own: jax.Array, r_grp_xG: jax.Array, beta: jax.Array, *,
        reciprocal: bool = False) -> jax.Array:
  """Risk-sensitive advantage of ``r_own`` in group ``r_grp_xG`` at ``beta``.

  ``r_own`` and ``beta`` have the output shape; ``r_grp_xG`` broadcasts against
  it with the group appended. With r̄ the group mean and e_j = β(r_j − r̄),
  β(r_i − Z) = e_i − log mean_j exp(e_j), so A = expm1(e_i − lme(e)) / β.

  ``reciprocal``: A = expm1(·)·(1/β) instead, the arithmetic XLA compiles x / β into
  when β is a constant (it rewrites x / c as x·(1/c)): a β passed as an input then
  gives the advantages of the same β compiled in, bit for bit (:func:`risk_sensitive`).
  """
  mean = _group_mean(r_grp_xG)
  small = jnp.abs(beta) < _SMALL_BETA
  safe_beta = jnp.where(small, 1.0, beta)
  e_xG = safe_beta[..., None] * (r_grp_xG - mean[..., None])
  e_own = safe_beta * (r_own - mean)
  expm1_own = jnp.expm1(e_own - _log_mean_exp(e_xG))
  adv = expm1_own * (1.0 / safe_beta) if reciprocal else expm1_own / safe_beta
  return jnp.where(small, r_own - mean, adv)


@jax.jit
def risk_sensitive(rewards_BG: ArrayLike, beta: ArrayLike) -> jax.Array:
  """RS-GRPO (arXiv 2509.24261): A_i = (1/β)(e^{β r_i} / mean_j e^{β r_j} − 1).

  Computed as expm1(β(r_i − Z))/β with Z = (logsumexp_j(β r_j) − log G)/β, in a
  mean-shifted form that is accurate for tiny |β| and finite for large |β|.
  ``beta`` is a scalar or broadcastable to ``rewards_BG``: completion g of
  prompt b is transformed with β[b, g] (its normaliser Z uses that β over the
  whole group). |β| < 1e-6 returns :func:`centered` (the β → 0 limit; exact at
  β = 0, NaN-free gradients). Zero-sum within a group for every β.

  The last step multiplies by 1/β rather than dividing by β: the two round differently,
  and the first is what XLA made of the RL step's β when it was a compiled-in constant,
  so the step's β as an input (``dllm_rl.rl.step.StepHyper``) reproduces those runs.
  """
  r = jnp.asarray(rewards_BG, jnp.float32)
  beta_BG = jnp.broadcast_to(jnp.asarray(beta, jnp.float32), r.shape)
  return _rs(r, r[..., None, :], beta_BG, reciprocal=True)


@jax.jit
def rs_weight(beta: ArrayLike, p: ArrayLike) -> jax.Array:
  """w_β(p) = (e^β − 1) / (β(1 + p(e^β − 1))), with w → 1 as β → 0.

  For binary rewards with group success rate p̂, RS-GRPO equals
  w_β(p̂)·(r − p̂). With a = |β|, e = e^{−a} and q = p (β > 0) or 1 − p (β < 0)
  (the symmetry w_β(p) = w_{−β}(1 − p)) it is evaluated as

      w = (1 − e) / (a·(e + q·(1 − e))),

  a sum of two non-negative terms in the denominator: no e^β overflow and no
  cancellation (at p = 0, β = 16 the naive 1 + q·expm1(−a) loses every digit).
  |β| < 1e-6 gives 1.
  """
  beta = jnp.asarray(beta, jnp.float32)
  p = jnp.asarray(p, jnp.float32)
  a = jnp.abs(beta)
  small = a < _SMALL_BETA
  safe_a = jnp.where(small, 1.0, a)
  q = jnp.where(beta > 0, p, 1.0 - p)
  one_minus_e = -jnp.expm1(-safe_a)
  e = jnp.exp(-safe_a)
  return jnp.where(small, 1.0, one_minus_e / (safe_a * (e + q * one_minus_e)))


# ---------------------------------------------------------------- StepRS-GRPO


@functools.partial(jax.jit, static_argnames="schedule")
def beta_schedule(progress: ArrayLike, beta_start: ArrayLike, beta_end: ArrayLike,
                  schedule: str) -> jax.Array:
  """β(u) = β_start + (β_end − β_start)·g(u) (StepRS-GRPO, arXiv 2610.00661).

  g(u) = u ("linear"), (1 − cos πu)/2 ("cosine") or 1[u ≥ 0.5] ("step");
  u = 0 is the first (most-masked) denoising state.

  g is computed apart from the endpoints (an optimization barrier): with β_start and
  β_end as inputs of a program, XLA would otherwise fold β_end − β_start into the
  constant factor 1/(S − 1) of u = s/(S − 1) and round β differently from the program
  with the endpoints compiled in (β 2 → 0 over 16 states: −1e-7, not 0, at the last).
  """
  if schedule not in BETA_SCHEDULES:
    raise ValueError(f"unknown beta schedule {schedule!r}; choices: {', '.join(BETA_SCHEDULES)}")
  u = jnp.asarray(progress, jnp.float32)
  if schedule == "linear":
    g = u
  elif schedule == "cosine":
    g = 0.5 * (1.0 - jnp.cos(jnp.pi * u))
  else:
    g = (u >= 0.5).astype(jnp.float32)
  g = jax.lax.optimization_barrier(g)
  b0 = jnp.asarray(beta_start, jnp.float32)
  b1 = jnp.asarray(beta_end, jnp.float32)
  return b0 + (b1 - b0) * g


@jax.jit
def progress_from_unmask_step(unmask_step_BGL: ArrayLike, num_states: int) -> jax.Array:
  """u = s / (S − 1) ∈ [0, 1] (float32) for the state s a token was unmasked in.

  States are numbered 0..S−1 in the order they happen (0 = first, most masked);
  s is clipped into [0, S − 1] (e.g. −1 for never-unmasked padding → 0), and
  u = 0 when S = 1.
  """
  s = jnp.asarray(unmask_step_BGL).astype(jnp.float32)
  last = jnp.asarray(num_states, jnp.float32) - 1.0
  return jnp.clip(s, 0.0, jnp.maximum(last, 0.0)) / jnp.maximum(last, 1.0)


@jax.jit
def progress_per_row(unmask_step_BGL: ArrayLike, action_BGL: ArrayLike) -> jax.Array:
  """u = s_i / (S_i − 1) per row, for samplers whose rows pass through different
  numbers of states (threshold / dynamic mode; DESIGN "Advantages", steprs).

  The batch sampler runs one shared step counter, and a row whose block is
  already complete commits nothing while others finish theirs; every step in
  which a row does act commits at least one token. So the states a row went
  through are the distinct unmask steps of its action tokens (``action_BGL``),
  s_i is the rank of a token's step among them and S_i their number. Positions
  outside the action, or never committed (step −1), get 0.

  A step whose commits all lie after the row's first EOS is therefore not one of
  its states: the action ends at the first EOS, and nothing after it changes the
  update (tests/rl/test_rl_step.py pins that for this mode too). Fixed-step mode
  (:func:`progress_from_unmask_step`) counts every sampler step instead, so the
  two differ for a row that fills its EOS tail in a step of its own.
  """
  s_BGL = jnp.asarray(unmask_step_BGL, jnp.int32)
  act_BGL = jnp.asarray(action_BGL, bool) & (s_BGL >= 0)  # −1: never committed, no state
  big = jnp.iinfo(jnp.int32).max
  srt_BGL = jnp.sort(jnp.where(act_BGL, s_BGL, big), axis=-1)
  first_BGL = jnp.concatenate(  # first occurrence of each distinct step in sorted order
      [jnp.ones_like(srt_BGL[..., :1], bool), srt_BGL[..., 1:] != srt_BGL[..., :-1]], axis=-1)
  first_BGL &= srt_BGL != big
  num_states_BG = first_BGL.sum(-1)
  # rank of s = number of distinct steps strictly below s
  below_BGLL = first_BGL[..., None, :] & (srt_BGL[..., None, :] < s_BGL[..., :, None])
  rank_BGL = below_BGLL.sum(-1).astype(jnp.float32)
  last_BG1 = jnp.maximum(num_states_BG - 1, 1).astype(jnp.float32)[..., None]
  return jnp.where(act_BGL, rank_BGL / last_BG1, 0.0)


@functools.partial(jax.jit, static_argnames="schedule")
def steprs(rewards_BG: ArrayLike, progress_BGL: ArrayLike, beta_start: ArrayLike,
           beta_end: ArrayLike, schedule: str = "linear") -> jax.Array:
  """StepRS-GRPO (arXiv 2610.00661): per-token risk-sensitive advantages [B, G, L].

  Token (b, g, l) gets risk_sensitive(rewards[b], β_bgl)[g] with
  β_bgl = beta_schedule(progress[b, g, l]): its normaliser Z uses its own β over
  the whole group of prompt b. Vectorised as r_B11G against β_BGL (an
  intermediate of B·G·L·G floats). β_start == β_end gives RS-GRPO over L.
  """
  r = jnp.asarray(rewards_BG, jnp.float32)
  beta_BGL = beta_schedule(progress_BGL, beta_start, beta_end, schedule)
  beta_BGL = jnp.broadcast_to(beta_BGL, jnp.broadcast_shapes(beta_BGL.shape, r[..., None].shape))
  r_own_BGL = jnp.broadcast_to(r[..., None], beta_BGL.shape)
  return _rs(r_own_BGL, r[..., None, None, :], beta_BGL)


def _batch_rescale(adv_BGL: jax.Array, rewards_BG: ArrayLike, mask_BGL: ArrayLike,
                   stat: Callable[[jax.Array], jax.Array], power: float, state_BGL=None,
                   num_states: int = 1) -> jax.Array:
  """Scale the whole batch — or, with ``state_BGL``, each denoising state across the
  batch — so that Σ_valid stat(adv) matches Σ_valid stat(centered), to the power.

  One scale for all prompts: a per-prompt scale would cancel w_β(p̂), the
  prompt-dependent rescaling StepRS is about (DESIGN "Advantages", Controls).
  """
  adv = jnp.asarray(adv_BGL, jnp.float32)
  m = jnp.broadcast_to(jnp.asarray(mask_BGL, bool), adv.shape)
  ref = jnp.broadcast_to(centered(rewards_BG)[..., None], adv.shape)
  seg = (jnp.zeros(adv.shape, jnp.int32) if state_BGL is None
         else jnp.broadcast_to(jnp.asarray(state_BGL, jnp.int32), adv.shape))
  n = num_states if state_BGL is not None else 1
  s_adv = jax.ops.segment_sum(jnp.where(m, stat(adv), 0.0).ravel(), seg.ravel(), n)
  s_ref = jax.ops.segment_sum(jnp.where(m, stat(ref), 0.0).ravel(), seg.ravel(), n)
  ok = (s_adv > 0) & (s_ref > 0)
  scale = jnp.where(ok, (s_ref / jnp.where(ok, s_adv, 1.0)) ** power, 1.0)
  return adv * scale[seg]


def state_of_progress(progress_BGL: ArrayLike, num_states: int) -> jax.Array:
  """The state index round(u·(S − 1)) of a progress u (exact for fixed-step samplers)."""
  u = jnp.asarray(progress_BGL, jnp.float32)
  return jnp.clip(jnp.round(u * (num_states - 1)), 0, num_states - 1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames="num_states")
def rms_matched(adv_BGL: ArrayLike, rewards_BG: ArrayLike, mask_BGL: ArrayLike,
                state_BGL=None, num_states: int = 1) -> jax.Array:
  """Control: A ← A·sqrt(Σ_{b,g,l} m(A^c)² / Σ_{b,g,l} m A²) over the whole batch.

  Matches the batch RMS of centered advantages A^c = r − r̄ over the same
  tokens, isolating how StepRS distributes the signal (across prompts, through
  w_β(p̂), and across states) from its overall magnitude. With ``state_BGL``
  each state gets its own scale. A scale whose sums are 0 is 1.
  """
  return _batch_rescale(adv_BGL, rewards_BG, mask_BGL, jnp.square, 0.5, state_BGL, num_states)


@functools.partial(jax.jit, static_argnames="num_states")
def mass_matched(adv_BGL: ArrayLike, rewards_BG: ArrayLike, mask_BGL: ArrayLike,
                 state_BGL=None, num_states: int = 1) -> jax.Array:
  """Control: like :func:`rms_matched` with the L1 mass Σ m|A| instead of the RMS."""
  return _batch_rescale(adv_BGL, rewards_BG, mask_BGL, jnp.abs, 1.0, state_BGL, num_states)


# ---------------------------------------------------------------- calibration


def _p_of_beta(beta: float) -> float:
  """p(β) = 1/β − 1/(e^β − 1), float64; the series 1/2 − β/12 + β³/720 near 0."""
  if abs(beta) < 1e-4:
    return 0.5 - beta / 12.0 + beta ** 3 / 720.0
  em = math.expm1(beta) if beta < 700 else math.inf
  return 1.0 / beta - 1.0 / em


def calibrated_beta(p_bar: float) -> float:
  """The β with w_β(p̄) = 1, i.e. the root of p̄ = 1/β − 1/(e^β − 1) (host-side).

  p(β) decreases from 1 (β → −∞) through 1/2 (β = 0) to 0 (β → +∞), so
  p̄ < 1/2 gives β > 0. Bracketed, then bisected to |Δβ| ≤ 1e-12·max(1, |β|).

  The identity behind it, A = w_β(p̂)(r − r̄), is for 0/1 rewards. Rewards a + s·c
  (c ∈ {0, 1}: a wrong, a + s right) see e^{βr} ∝ e^{sβc}, i.e. w_{sβ}(p̂): their β with
  w = 1 is this β / s (±1 rewards, s = 2: half of it). Rewards with more than two values
  have no single w.
  """
  p_bar = float(p_bar)
  if not (0.0 < p_bar < 1.0):
    raise ValueError(f"p_bar must lie in (0, 1), got {p_bar}")
  if p_bar == 0.5:
    return 0.0
  lo, hi = -1.0, 1.0
  while _p_of_beta(lo) <= p_bar:
    lo *= 2.0
  while _p_of_beta(hi) >= p_bar:
    hi *= 2.0
  for _ in range(400):
    mid = 0.5 * (lo + hi)
    if _p_of_beta(mid) > p_bar:
      lo = mid
    else:
      hi = mid
    if hi - lo <= 1e-12 * max(1.0, abs(mid)):
      break
  return 0.5 * (lo + hi)


# ---------------------------------------------------------------- registry


class AdvantageFn(Protocol):
  """``fn(rewards_BG, progress_BGL, mask_BGL, cfg) -> float32 adv_BGL`` (0 off the mask)."""

  def __call__(self, rewards_BG: jax.Array, progress_BGL: jax.Array, mask_BGL: jax.Array,
               cfg: Any) -> jax.Array:
    ...


ADVANTAGES: Registry[AdvantageFn] = Registry("advantage", key="rl.advantage")


def checked_output(name: str, adv_BGL, mask_BGL) -> jax.Array:
  """``adv_BGL`` of the registered advantage ``name`` (``rl.advantage``), checked against the
  contract of this module's docstring: float32, the shape of ``mask_BGL`` ([B, G, L]: a
  sequence-level advantage is broadcast over the tokens, :func:`_per_token`). Checked when
  the step is traced, with a TypeError naming ``rl.advantage`` (a [B, G] array otherwise
  fails inside the loss as a broadcasting error, and a bfloat16 one is accepted silently)."""
  if jnp.shape(adv_BGL) != jnp.shape(mask_BGL) or jnp.result_type(adv_BGL) != jnp.float32:
    raise TypeError(
        f"rl.advantage={name!r} (registered in ADVANTAGES, dllm_rl/rl/advantages.py) returned"
        f" {jnp.result_type(adv_BGL)} of shape {jnp.shape(adv_BGL)}; it must be float32 of"
        f" the mask's shape [B, G, L] = {jnp.shape(mask_BGL)} (broadcast a sequence-level"
        " advantage over the tokens, 0 off the mask)")
  return adv_BGL


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
  """Options (from ``config.advantage``); each advantage reads what it needs. The RL step
  replaces ``beta``, ``beta_start`` and ``beta_end`` with its traced inputs
  (``dllm_rl.rl.step.StepHyper``): there the numbers are float32 scalars, not constants."""

  beta: float = 1.0             # risk_sensitive: β
  beta_start: float = 0.0       # steprs*: β at the first (most-masked) state
  beta_end: float = 2.0         # steprs*: β at the last state
  beta_schedule: str = "linear"  # steprs*: one of BETA_SCHEDULES
  control_per_state: bool = False  # steprs_*_matched: one scale per denoising state, not per batch
  num_states: int = 1           # steprs_*_matched with control_per_state: the sampler's states

  def __post_init__(self):
    if self.beta_schedule not in BETA_SCHEDULES:
      raise ValueError(f"unknown beta schedule {self.beta_schedule!r}; "
                       f"choices: {', '.join(BETA_SCHEDULES)}")

  @classmethod
  def from_config(cls, section: Mapping[str, Any]) -> "AdvantageConfig":
    d = dict(section)
    d.pop("name", None)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"unknown advantage options {unknown}; known: {sorted(known)}")
    return cls(**d)


@jax.jit
def zscore(rewards_BG: ArrayLike) -> jax.Array:
  """TraceRL's group z-score (Gen-Verse/dLLM-RL ``reward/rl_reward.py``
  ``z_score_normalize``): A_i = (r_i − mean r) / std r with the population std (ddof = 0) and
  no ε; 0 for a group whose rewards are all equal (std = 0). It is √(G/(G − 1)) times
  :func:`grpo` without its ε (any rewards: the two stds differ by that factor)."""
  d = centered(rewards_BG)
  std = jnp.sqrt(jnp.mean(d * d, axis=-1, keepdims=True))
  return jnp.where(std > 0, d / jnp.where(std > 0, std, 1.0), 0.0)


def _per_token(adv_BG: jax.Array, progress_BGL: ArrayLike, mask_BGL: ArrayLike) -> jax.Array:
  shape = jnp.broadcast_shapes(jnp.shape(progress_BGL), jnp.shape(mask_BGL))
  adv_BGL = jnp.broadcast_to(adv_BG[..., None], shape)
  return jnp.where(jnp.asarray(mask_BGL, bool), adv_BGL, 0.0)


@ADVANTAGES.register("grpo")
def grpo_tokens(rewards_BG, progress_BGL, mask_BGL, cfg) -> jax.Array:
  """:func:`grpo` broadcast over the completion tokens."""
  del cfg
  return _per_token(grpo(rewards_BG), progress_BGL, mask_BGL)


@ADVANTAGES.register("zscore")
def zscore_tokens(rewards_BG, progress_BGL, mask_BGL, cfg) -> jax.Array:
  """:func:`zscore` broadcast over the completion tokens."""
  del cfg
  return _per_token(zscore(rewards_BG), progress_BGL, mask_BGL)


@ADVANTAGES.register("centered")
def centered_tokens(rewards_BG, progress_BGL, mask_BGL, cfg) -> jax.Array:
  """:func:`centered` broadcast over the completion tokens."""
  del cfg
  return _per_token(centered(rewards_BG), progress_BGL, mask_BGL)


@ADVANTAGES.register("leave_one_out")
def leave_one_out_tokens(rewards_BG, progress_BGL, mask_BGL, cfg) -> jax.Array:
  """:func:`leave_one_out` broadcast over the completion tokens."""
  del cfg
  return _per_token(leave_one_out(rewards_BG), progress_BGL, mask_BGL)


@ADVANTAGES.register("risk_sensitive")
def risk_sensitive_tokens(rewards_BG, progress_BGL, mask_BGL, cfg) -> jax.Array:
  """:func:`risk_sensitive` at ``cfg.beta`` broadcast over the completion tokens."""
  return _per_token(risk_sensitive(rewards_BG, cfg.beta), progress_BGL, mask_BGL)


def _steprs_cfg(rewards_BG, progress_BGL, cfg) -> jax.Array:
  return steprs(rewards_BG, progress_BGL, cfg.beta_start, cfg.beta_end, cfg.beta_schedule)


@ADVANTAGES.register("steprs")
def steprs_tokens(rewards_BG, progress_BGL, mask_BGL, cfg) -> jax.Array:
  """:func:`steprs` with ``cfg.beta_start/beta_end/beta_schedule``."""
  adv = _steprs_cfg(rewards_BG, progress_BGL, cfg)
  return jnp.where(jnp.asarray(mask_BGL, bool), adv, 0.0)


def _control(rescale, rewards_BG, progress_BGL, mask_BGL, cfg) -> jax.Array:
  adv = _steprs_cfg(rewards_BG, progress_BGL, cfg)
  if cfg.control_per_state:
    state_BGL = state_of_progress(progress_BGL, cfg.num_states)
    adv = rescale(adv, rewards_BG, mask_BGL, state_BGL, num_states=cfg.num_states)
  else:
    adv = rescale(adv, rewards_BG, mask_BGL)
  return jnp.where(jnp.asarray(mask_BGL, bool), adv, 0.0)


@ADVANTAGES.register("steprs_rms_matched")
def steprs_rms_matched_tokens(rewards_BG, progress_BGL, mask_BGL, cfg) -> jax.Array:
  """:func:`steprs` rescaled to the batch RMS of centered advantages
  (:func:`rms_matched`; per state with ``cfg.control_per_state``)."""
  return _control(rms_matched, rewards_BG, progress_BGL, mask_BGL, cfg)


@ADVANTAGES.register("steprs_mass_matched")
def steprs_mass_matched_tokens(rewards_BG, progress_BGL, mask_BGL, cfg) -> jax.Array:
  """:func:`steprs` rescaled to the batch L1 mass of centered advantages
  (:func:`mass_matched`; per state with ``cfg.control_per_state``)."""
  return _control(mass_matched, rewards_BG, progress_BGL, mask_BGL, cfg)
