"""SPG block-wise likelihood bounds: the ELBO and the EUBO of ``spg_block``.

Sandwiched Policy Gradient (SPG, Wang et al. 2025, facebookresearch/SPG;
``SPGTrainer.forward_process`` with ``forward_type="block_random"`` and
``SPGTrainer._get_per_seq_logps``), the estimator the official StableDRL code
reuses (JianyuanZhong/StableDRL, ``networks/llada_svpo.py``:
``forward_process_spg`` and ``_get_per_seq_logps_spg``).

Masking, one draw k of K (``num_samples``, SPG's ``num_t``), per sequence:

* the completion is cut into blocks of ``block_len`` positions; block b_k is
  the k-th entry of a random permutation of the ``ceil(L / block_len)`` blocks,
  taken modulo the number of blocks that hold valid tokens,
  n_c = (len − 1) // block_len + 1 (``indices[randperm] % completion_num_blocks``);
* blocks < b_k clean, except that every valid prompt token and every token of
  those blocks is masked with probability ``prompt_mask_prob`` (SPG's
  ``p_mask_prompt``, applied to ``~is_mask``: prompt *and* earlier blocks);
* block b_k: m_k ~ U{1, …, len_b} of its len_b = min(block_len, len − b_k·block_len)
  valid positions, chosen uniformly, are masked (``min_t = 0, max_t = 1``);
* blocks > b_k and every invalid completion position are masked
  (``| ~completion_mask_append``: positions after the first EOS are always masks).

Scored set M_k = masked ∩ valid completion positions (this includes the
earlier-block tokens hit by the ``prompt_mask_prob`` noise), t_k = |M_k| / len
(SPG's ``empirical_t``) and p_kj = p_θ(o_j | noisy_k):

    ELBO = (1/K) Σ_k (1/|M_k|) Σ_{j∈M_k} log p_kj                  (no 1/t weight)
    EUBO = (1/β) (1/|J|) Σ_{j∈J} log( (1/K) Σ_k 1[j∈M_k] p_kj^β / t_k ),
           J = ∪_k M_k (SPG's ``loss_mask``: tokens with a non-zero average)

Both are sums of per-token terms, returned as ``token_BL`` (ELBO) and
``extra["eubo_token_BL"]`` (EUBO). The EUBO average is computed in log space
(β·log p − log t through a logsumexp), so unlike SPG's ``p.pow(β)`` it cannot
underflow to 0 and drop a token from J; otherwise the values are SPG's.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from dllm_rl.diffusion.estimators import (
  ESTIMATORS,
  Estimator,
  EstimatorConfig,
  Likelihood,
  draws_entropy,
  masked_forward,
)
from dllm_rl.types import SequenceBatch

DEFAULT_BLOCK_LEN = 32  # SPG / StableDRL block_length (= the sampler's block size)


@struct.dataclass
class SpgMasks:
  """Masks of K block-wise draws (True = replaced by the mask id in the input).

  ``block_KB``: the block b_k of each draw; ``prompt_KBP``: prompt noise;
  ``completion_KBL``: completion positions fed as masks (including invalid ones;
  the scored set is ``completion_KBL & completion_valid_BL``).
  """

  block_KB: jax.Array
  prompt_KBP: jax.Array
  completion_KBL: jax.Array


def spg_block_masks(key: jax.Array, seqs: SequenceBatch, num_samples: int, block_len: int,
                    prompt_mask_prob: float = 0.0) -> SpgMasks:
  """Draw the K block-wise masks of SPG ``forward_process(block_random)``.

  Depends only on ``key`` and the batch layout, never on parameters, so θ,
  θ_old and a reference given the same key see the same masks. Assumes that
  ``completion_valid_BL`` is a prefix (valid through the first EOS), as SPG does.
  SPG requires L % block_len == 0 and K ≤ #blocks; here a ragged last block is
  allowed and, when K exceeds the number of blocks, the permutation is followed
  by fresh independent permutations (identical to SPG whenever SPG runs).
  """
  b, l = seqs.completion_BL.shape
  p = seqs.prompt_BP.shape[1]
  k = num_samples
  valid_BL = seqs.completion_valid_BL
  num_blocks = -(-l // block_len)
  reps = -(-k // num_blocks)
  # One uniform draw, sliced per use: (block order, m_k, positions in the block).
  u = jax.random.uniform(key, (b * reps * num_blocks + k * b + k * b * l,), jnp.float32)
  u_blk, u_num, u_pos = jnp.split(u, [b * reps * num_blocks, b * reps * num_blocks + k * b])

  perm = jnp.argsort(u_blk.reshape(b, reps, num_blocks), axis=-1)
  len_B = valid_BL.sum(-1).astype(jnp.int32)
  used_blocks_B = jnp.maximum((len_B - 1) // block_len + 1, 1)
  block_KB = (perm.reshape(b, reps * num_blocks)[:, :k] % used_blocks_B[:, None]).T

  pos_L = jnp.arange(l)
  blk_L, off_L = pos_L // block_len, pos_L % block_len
  blk_KBL = blk_L[None, None, :]
  block_KB1 = block_KB[..., None]
  # m_k ~ U{1..len_b} masked among the len_b valid positions of block b_k: the
  # m_k eligible positions of lowest rank under random scores (a uniform subset).
  len_b_KB = jnp.clip(len_B[None, :] - block_len * block_KB, 0, block_len)
  m_KB = jnp.minimum(jnp.floor(u_num.reshape(k, b) * len_b_KB).astype(jnp.int32) + 1, len_b_KB)
  eligible_KBL = (blk_KBL == block_KB1) & (off_L < len_b_KB[..., None])
  score_KBL = jnp.where(eligible_KBL, u_pos.reshape(k, b, l), 2.0)
  rank_KBL = jnp.argsort(jnp.argsort(score_KBL, axis=-1), axis=-1)
  in_block_KBL = eligible_KBL & (rank_KBL < m_KB[..., None])

  completion_KBL = (blk_KBL > block_KB1) | in_block_KBL | ~valid_BL[None]
  prompt_KBP = jnp.zeros((k, b, p), bool)
  if prompt_mask_prob > 0:
    hit_KBN = jax.random.bernoulli(jax.random.fold_in(key, 1), prompt_mask_prob, (k, b, p + l))
    prompt_KBP = hit_KBN[..., :p] & seqs.prompt_valid_BP[None]
    completion_KBL = completion_KBL | (hit_KBN[..., p:] & (blk_KBL < block_KB1))
  return SpgMasks(block_KB=block_KB, prompt_KBP=prompt_KBP, completion_KBL=completion_KBL)


def spg_bounds(logp_KBL: jax.Array, scored_KBL: jax.Array, valid_BL: jax.Array, beta: float):
  """Per-token ELBO and EUBO terms from per-draw log-probs (see module docstring).

  SPG ``_get_per_seq_logps``: ``per_seq_logps`` (ELBO, mean over draws) and
  ``per_token_avg_ps`` / ``loss_mask`` / ``eubo_beta`` (EUBO). Returns
  (elbo_token_BL, eubo_token_BL); each sums over L to the per-sequence bound.
  """
  k = logp_KBL.shape[0]
  n_KB = scored_KBL.sum(-1).astype(jnp.float32)
  len_B = jnp.maximum(valid_BL.sum(-1), 1).astype(jnp.float32)
  elbo_BL = (jnp.where(scored_KBL, logp_KBL, 0.0) / jnp.maximum(n_KB, 1.0)[..., None]).mean(0)

  log_t_KB = jnp.log(jnp.maximum(n_KB / len_B, 1e-8))
  in_j_BL = scored_KBL.any(0)
  x_KBL = jnp.where(scored_KBL, beta * logp_KBL - log_t_KB[..., None], -jnp.inf)
  x_KBL = jnp.where(in_j_BL[None], x_KBL, 0.0)  # keeps tokens outside J finite
  log_avg_BL = jax.nn.logsumexp(x_KBL, axis=0) - math.log(k)
  n_j_B = jnp.maximum(in_j_BL.sum(-1), 1).astype(jnp.float32)
  eubo_BL = jnp.where(in_j_BL, log_avg_BL / (beta * n_j_B[:, None]), 0.0)
  return elbo_BL, eubo_BL


def _spg_reduce(logp_KBL, ent_KBL, seqs: SequenceBatch, draws: dict,
                cfg: EstimatorConfig) -> Likelihood:
  """SPG's ELBO (``token_BL``/``seq_B``) and EUBO (``extra``) from the per-draw
  log-probs, β = ``cfg.spg_beta`` (:func:`spg_bounds`)."""
  scored_KBL = draws["scored_BL"]
  elbo_BL, eubo_BL = spg_bounds(logp_KBL, scored_KBL, seqs.completion_valid_BL, cfg.spg_beta)
  return Likelihood(token_BL=elbo_BL, seq_B=elbo_BL.sum(-1),
                    entropy_B=draws_entropy(ent_KBL, scored_KBL),
                    extra={"eubo_B": eubo_BL.sum(-1), "eubo_token_BL": eubo_BL})


def _spg_draw(key, seqs: SequenceBatch, cfg: EstimatorConfig, mask_id: int,
              block_len: int | None = None) -> dict:
  """The K inputs of :func:`spg_block_masks` (``block_len`` or ``cfg.spg_block_len``)."""
  masks = spg_block_masks(key, seqs, cfg.num_samples, block_len or cfg.spg_block_len,
                          cfg.prompt_mask_prob)
  return {"prompt_BP": jnp.where(masks.prompt_KBP, mask_id, seqs.prompt_BP[None]),
          "noisy_BL": jnp.where(masks.completion_KBL, mask_id, seqs.completion_BL[None]),
          "scored_BL": masks.completion_KBL & seqs.completion_valid_BL[None]}


_SPG_DOC = """SPG block-wise ELBO (``token_BL``/``seq_B``) and EUBO (``extra``).

K = ``cfg.num_samples`` draws of :func:`spg_block_masks`, one forward each;
β = ``cfg.spg_beta``. ``extra["eubo_B"]`` is the per-sequence EUBO and
``extra["eubo_token_BL"]`` its per-token terms; ``entropy_B`` the mean
predictive entropy over scored positions, averaged over draws."""


def make_spg_block(block_len: int) -> Estimator:
  """The ``spg_block`` estimator for a fixed (static) block length."""
  return Estimator(draw=lambda key, seqs, cfg, mask_id: _spg_draw(key, seqs, cfg, mask_id,
                                                                   block_len),
                   forward=masked_forward, reduce=_spg_reduce, doc=_SPG_DOC)


spg_block = ESTIMATORS.register("spg_block")(
    Estimator(draw=_spg_draw, forward=masked_forward, reduce=_spg_reduce,
              doc=_SPG_DOC + " Block length ``cfg.spg_block_len`` (default 32, SPG's and"
              " StableDRL's ``block_length``)."))
