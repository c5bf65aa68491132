"""The decision pieces of Dream's ``diffusion_generate`` samplers, on any per-position logits.

Dream (Dream-org/Dream-v0-Instruct-7B, ``generation_utils.py`` and the Fast-dLLM-style
``generation_utils_block.py``; semantics in shared/fixtures/dream_tiny/README.md, "Sampler
semantics") decides each step from the logits that predict every position (row i scores token i,
i.e. after the logit shift). Each piece here is a pure function of those logits, so the samplers
(:mod:`dllm_rl.sampling.dream`, :mod:`dllm_rl.sampling.dream_block`) differ only in how they get
them:

* :func:`timesteps` / :func:`transfer_fractions` — the schedule ``linspace(1, eps, steps + 1)``
  (float32, as torch computes it) and the fraction ``1 − s/t`` of the masked positions that a step
  unmasks (1 at the last step).
* :func:`num_transfer` — k = int(batch-MEAN mask count × fraction), one k for every row.
* :func:`propose` — ``sample_tokens``: temperature, top-p and top-k filtering, then x0 = the argmax
  of the probabilities over the whole vocabulary (mask id included) at temperature 0, else a
  categorical sample.
* ``ALGS`` — the registered confidence measures (``maskgit_plus``, ``topk_margin``, ``entropy``),
  read from the filtered probabilities.
* :func:`choose` — the k most confident masked positions (``alg_temp`` None/0), or k positions
  sampled without replacement from softmax(confidence / alg_temp) (Gumbel top-k).
* :func:`unmask_step` / :func:`origin_step` — one whole step of the confidence algorithms and of
  ``origin``.

Everything is float32 (the official code runs the softmax in the logits' dtype, bf16 for the
released 7B; here logits are float32, so confidences are float32 whatever the model dtype).

One deliberate difference, at the tie the README calls ``first_tie_step``: when a row has fewer
masked positions than k, torch's ``topk`` returns −inf entries too and the official code writes the
mask id over those (arbitrary, by torch's tie order) already decoded or prompt positions. Here
such a row unmasks all of its masked positions and touches nothing else. Rows with at least k
masked positions decide identically.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dllm_rl.parallel.topk import top_k as partitioned_top_k
from dllm_rl.registry import Registry
from dllm_rl.sampling.step import descending_rank

_NEG = -jnp.inf


@dataclasses.dataclass(frozen=True)
class DreamSamplerConfig:
  """Static settings of a Dream sampler run; the names and defaults are the official
  ``diffusion_generate`` kwargs (:func:`dllm_rl.sampling.dream.dream_generate` documents them;
  ``mask_id`` is ``mask_token_id``). ``block_length`` None = the plain sampler, else the block /
  KV-cache sampler."""

  max_new_tokens: int
  mask_id: int
  steps: int = 512
  eps: float = 1e-3
  alg: str = "origin"
  alg_temp: float | None = None
  temperature: float = 0.0
  top_p: float | None = None
  top_k: int | None = None
  block_length: int | None = None
  dual_cache: bool = False
  threshold: float = 0.9
  output_history: bool = False


class DreamOutput(NamedTuple):
  """``sequences_BN``: prompt + generated tokens [B, P + max_new_tokens] (int32);
  ``history_SBN``: the tokens after every forward (``output_history``), else None."""

  sequences_BN: jax.Array
  history_SBN: jax.Array | None


def timesteps(steps: int, eps: float) -> np.ndarray:
  """float32 ``torch.linspace(1, eps, steps + 1)`` as torch's CPU kernel computes it:
  step = (end − start)/(n − 1) in float32, ``start + step·i`` for the first half and
  ``end − step·(n − 1 − i)`` for the second. (torch's vectorised path can differ in the last bit
  for n > 16; the fixture's schedules agree either way.)"""
  n = steps + 1
  start, end = np.float32(1.0), np.float32(eps)
  if n == 1:
    return np.array([start], np.float32)
  step = (end - start) / np.float32(n - 1)
  half = n // 2
  return np.array([start + step * np.float32(i) if i < half
                   else end - step * np.float32(n - 1 - i) for i in range(n)], np.float32)


def transfer_fractions(steps: int, eps: float) -> np.ndarray:
  """float32 [steps]: ``1 − s/t`` with t = ts[i], s = ts[i + 1]; exactly 1 at the last step
  (``int(mean × 1) = int(mean)``, the official last-step rule)."""
  ts = timesteps(steps, eps)
  frac = np.float32(1.0) - ts[1:] / ts[:-1]
  frac[-1] = np.float32(1.0)
  return frac.astype(np.float32)


def num_transfer(open_BL, frac):
  """k = int(mean over rows of the open-position count × ``frac``) in float32, as
  ``int(mask_index.sum() / B * (1 − s/t))``: one k for the whole batch."""
  mean = jnp.sum(open_BL).astype(jnp.float32) / jnp.float32(open_BL.shape[0])
  return jnp.floor(mean * frac).astype(jnp.int32)


def filter_logits(logits_BLV, *, temperature: float, top_p: float | None, top_k: int | None):
  """``sample_tokens``' filtering, in float32: logits / T (T > 0); nucleus (``top_p`` < 1: drop
  the tokens after the cumulative probability passes top_p, always keeping the first); top-k
  (drop logits below the k-th largest). Dropped tokens get ``finfo.min``, as officially."""
  logits_BLV = logits_BLV.astype(jnp.float32)
  low = jnp.finfo(jnp.float32).min
  if temperature > 0:
    logits_BLV = logits_BLV / jnp.float32(temperature)
  if top_p is not None and top_p < 1:
    order_BLV = jnp.argsort(-logits_BLV, axis=-1)
    sorted_BLV = jnp.take_along_axis(logits_BLV, order_BLV, axis=-1)
    drop_BLV = jnp.cumsum(jax.nn.softmax(sorted_BLV, axis=-1), axis=-1) > top_p
    drop_BLV = jnp.concatenate([jnp.zeros_like(drop_BLV[..., :1]), drop_BLV[..., :-1]], axis=-1)
    drop_BLV = jnp.take_along_axis(drop_BLV, jnp.argsort(order_BLV, axis=-1), axis=-1)
    logits_BLV = jnp.where(drop_BLV, low, logits_BLV)
  if top_k is not None:
    kth_BL1 = partitioned_top_k(logits_BLV, min(top_k, logits_BLV.shape[-1]))[0][..., -1:]
    logits_BLV = jnp.where(logits_BLV < kth_BL1, low, logits_BLV)
  return logits_BLV


def propose(logits_BLV, key, *, temperature: float, top_p: float | None, top_k: int | None):
  """``sample_tokens``: (x0_BL, probs_BLV). probs = softmax of the filtered logits; x0 = the
  first argmax of probs over the whole vocabulary (the mask id included) at T = 0, else a
  categorical sample from probs (``key``)."""
  filtered_BLV = filter_logits(logits_BLV, temperature=temperature, top_p=top_p, top_k=top_k)
  probs_BLV = jax.nn.softmax(filtered_BLV, axis=-1)
  if temperature > 0:
    x0_BL = jax.random.categorical(key, filtered_BLV, axis=-1)
  else:
    x0_BL = jnp.argmax(probs_BLV, axis=-1)
  return x0_BL.astype(jnp.int32), probs_BLV


ALGS: Registry = Registry("Dream alg")
"""Dream confidence measures ``(probs_BLV, x0_BL) -> confidence_BL`` (higher = unmask earlier),
read from :func:`propose`'s filtered probabilities. Not the LLaDA ``REMASKING`` policies: those
take raw logits, and Dream's entropy has its own 1e-10."""


@ALGS.register("maskgit_plus")
def maskgit_plus(probs_BLV, x0_BL):
  """The probability of the proposal (the max probability at temperature 0)."""
  return jnp.take_along_axis(probs_BLV, x0_BL[..., None], axis=-1)[..., 0]


@ALGS.register("topk_margin")
def topk_margin(probs_BLV, x0_BL):
  """Top-1 minus top-2 probability."""
  del x0_BL
  top2_BL2 = partitioned_top_k(probs_BLV, 2)[0]
  return top2_BL2[..., 0] - top2_BL2[..., 1]


@ALGS.register("entropy")
def neg_entropy(probs_BLV, x0_BL):
  """Negative entropy ``Σ p·log(p + 1e-10)`` (the official epsilon; higher = surer)."""
  del x0_BL
  return jnp.sum(probs_BLV * jnp.log(probs_BLV + 1e-10), axis=-1)


def choose(conf_BL, open_BL, k, key, alg_temp: float | None):
  """Bool [B, L]: the ``k`` open positions of each row to unmask. ``alg_temp`` None/0: the k
  most confident (``torch.topk``; ties: lower index first); else k positions sampled without
  replacement from softmax(confidence / alg_temp) (``torch.multinomial``), as Gumbel top-k.
  Only open positions are chosen (a row with fewer than k takes them all; module docstring)."""
  score_BL = jnp.where(open_BL, conf_BL, _NEG)
  if alg_temp:
    gumbel_BL = jax.random.gumbel(key, score_BL.shape, jnp.float32)
    score_BL = jnp.where(open_BL, score_BL / jnp.float32(alg_temp) + gumbel_BL, _NEG)
  return open_BL & (descending_rank(score_BL) < k)


def threshold_pick(conf_BL, open_BL, budget, threshold: float):
  """The ``confidence_threshold`` choice: of the ``budget`` most confident open positions, the
  first always and each other only if its confidence ≥ ``threshold``. Returns (take_BL, the
  number rejected among the top ``budget``, −inf picks included as officially)."""
  score_BL = jnp.where(open_BL, conf_BL, _NEG)
  rank_BL = descending_rank(score_BL)
  top_BL = rank_BL < budget
  keep_BL = (rank_BL == 0) | (score_BL >= threshold)
  return top_BL & keep_BL & open_BL, jnp.sum(top_BL & ~keep_BL).astype(jnp.int32)


def unmask_step(x_BL, logits_BLV, open_BL, frac, key, *, cfg: DreamSamplerConfig,
                alg: str | None = None):
  """One step of ``maskgit_plus`` / ``topk_margin`` / ``entropy``: propose x0 everywhere, score
  it, unmask the k = :func:`num_transfer` chosen open positions (a chosen position whose x0 is
  the mask id stays masked). ``alg`` overrides ``cfg.alg`` (the block sampler always uses
  ``entropy``). ``key`` is split (proposal, choice). Returns x_BL after the step."""
  k_prop, k_choose = jax.random.split(key)
  x0_BL, probs_BLV = propose(logits_BLV, k_prop, temperature=cfg.temperature, top_p=cfg.top_p,
                             top_k=cfg.top_k)
  conf_BL = ALGS.get(alg or cfg.alg)(probs_BLV, x0_BL)
  chosen_BL = choose(conf_BL, open_BL, num_transfer(open_BL, frac), k_choose, cfg.alg_temp)
  return jnp.where(chosen_BL, x0_BL, x_BL)


def origin_step(x_BL, logits_BLV, open_BL, frac, key, *, cfg: DreamSamplerConfig):
  """One step of ``origin``: each open position independently takes its proposal with
  probability ``frac`` = 1 − s/t (1 at the last step). ``key`` is split (proposal, coin)."""
  k_prop, k_coin = jax.random.split(key)
  x0_BL, _ = propose(logits_BLV, k_prop, temperature=cfg.temperature, top_p=cfg.top_p,
                     top_k=cfg.top_k)
  transfer_BL = open_BL & (jax.random.uniform(k_coin, open_BL.shape, jnp.float32) < frac)
  return jnp.where(transfer_BL, x0_BL, x_BL)
