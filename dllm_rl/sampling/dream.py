"""Dream's official ``diffusion_generate``, jitted and batched, and its kwargs front.

:func:`dream_generate` takes the official keyword arguments (names and defaults of
``DreamGenerationConfig``: steps 512, eps 1e-3, alg "origin") and runs one of

* the plain sampler (``generation_utils.py``, ``block_length=None``): x = prompt followed by
  ``max_new_tokens`` mask ids; exactly ``steps`` full forwards; each step decides every masked
  position of the whole row from the per-position logits (:mod:`dllm_rl.sampling.dream_ops`):
  ``origin`` (each masked position unmasked with probability 1 − s/t), or the k most confident
  under ``maskgit_plus`` / ``topk_margin`` / ``entropy`` (k = int(batch-mean mask count ×
  (1 − s/t)), all remaining at the last step), positions sampled instead when ``alg_temp`` > 0;
* ``alg="confidence_threshold"`` (the DARE / Fast-dLLM addition, batch 1): ``masks / steps``
  positions a step by max probability, the first always and the rest only above ``threshold``,
  the rejected carried on, extra steps until the carry is spent (:func:`denoise_threshold`);
* the block / KV-cache sampler (``generation_utils_block.py``, ``block_length`` set,
  ``dual_cache``, entropy or ``confidence_threshold``): :mod:`dllm_rl.sampling.dream_block`.

Greedy runs (temperature 0, ``alg_temp`` None/0) reproduce the official outputs and per-step
histories token for token (tests/sampling/test_dream_sampler.py, fixture
tests/fixtures/dream_tiny/sampler_parity.npz); the stochastic ones (``origin``, temperature,
``alg_temp``) draw from the same distributions with JAX keys, ``fold_in(key, step)`` per step.

Padding: ``attention_mask`` (1 = token, 0 = pad) must be LEFT padding. Pad keys are never
attended, and positions count from each row's first token, so a padded row generates what the
prompt alone would. The official copy ignores its position ids (RoPE at ``arange``), which agrees
with this for left padding only (it is relative); other padding layouts are refused.

EOS gets no special treatment (as officially): nothing stops at it and nothing is filled after it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dllm_rl.models import transformer
from dllm_rl.sampling import dream_block
from dllm_rl.sampling.dream_ops import (ALGS, DreamOutput, DreamSamplerConfig, maskgit_plus,
                                        origin_step, propose, threshold_pick, transfer_fractions,
                                        unmask_step)

_OTHER_ALGS = ("origin", "confidence_threshold")


def initial_sequence(prompt_BP, valid_BP, *, max_new_tokens: int, mask_id: int):
  """(x_BN, valid_BN, positions_BN): the prompt followed by ``max_new_tokens`` mask ids, the key
  mask (False = pad) and positions counted from each row's first valid token."""
  b = prompt_BP.shape[0]
  x_BN = jnp.concatenate([prompt_BP.astype(jnp.int32),
                          jnp.full((b, max_new_tokens), mask_id, jnp.int32)], axis=1)
  valid_BN = jnp.concatenate([valid_BP.astype(bool), jnp.ones((b, max_new_tokens), bool)], axis=1)
  return x_BN, valid_BN, transformer.positions_from_valid(valid_BN)


def denoise(logits_fn, x_BN, key, *, cfg: DreamSamplerConfig, start: int = 0) -> DreamOutput:
  """The plain sampler's ``cfg.steps`` steps from ``x_BN`` (``lax.scan``) on the rows
  ``[start, N)``: ``logits_fn(x_BN) -> logits`` of those rows, row i predicting token i. Every
  mask id there is open. The official sampler decides over the whole row (``start=0``), mask ids
  in the prompt included; with none in the prompt, ``start = P`` decides the same."""
  frac_S = jnp.asarray(transfer_fractions(cfg.steps, cfg.eps))

  def body(x_BN, i):
    x_BL = x_BN[:, start:]
    open_BL = x_BL == cfg.mask_id
    logits_BLV = logits_fn(x_BN)
    step_key = jax.random.fold_in(key, i)
    if cfg.alg == "origin":
      x_BL = origin_step(x_BL, logits_BLV, open_BL, frac_S[i], step_key, cfg=cfg)
    else:
      x_BL = unmask_step(x_BL, logits_BLV, open_BL, frac_S[i], step_key, cfg=cfg)
    x_BN = jnp.concatenate([x_BN[:, :start], x_BL], axis=1)
    return x_BN, (x_BN if cfg.output_history else None)

  x_BN, history_SBN = jax.lax.scan(body, x_BN, jnp.arange(cfg.steps))
  return DreamOutput(x_BN, history_SBN)


def denoise_threshold(logits_fn, x_BN, key, *, cfg: DreamSamplerConfig,
                      start: int = 0) -> DreamOutput:
  """``alg="confidence_threshold"`` (batch 1; ``lax.while_loop``). n = masks // steps; each step
  ranks the masked positions by max probability and takes the top ``n + carry``: the first always,
  each other only if its probability ≥ ``cfg.threshold``; the rejected become the next carry. At
  the last step, rejections set n = 0 and add one step each, so the loop runs until the carry is
  spent (the fixture's 8 steps took 16 forwards). History: one entry per forward, mask-filled
  beyond the forwards that ran (at most ``steps + N``). ``logits_fn`` and ``start``: as
  :func:`denoise`."""
  b, n_len = x_BN.shape
  if b != 1:
    raise ValueError(f"confidence_threshold is batch 1 only (as officially), got batch {b}")
  per_step = jnp.sum(x_BN == cfg.mask_id).astype(jnp.int32) // cfg.steps
  hist_len = cfg.steps + n_len if cfg.output_history else 0
  history_SBN = jnp.full((hist_len, b, n_len), cfg.mask_id, jnp.int32)

  def body(state):
    x_BN, i, steps, n, carry, history_SBN = state
    x_BL = x_BN[:, start:]
    open_BL = x_BL == cfg.mask_id
    x0_BL, probs_BLV = propose(logits_fn(x_BN), jax.random.fold_in(key, i),
                               temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)
    take_BL, rejected = threshold_pick(maskgit_plus(probs_BLV, x0_BL), open_BL, n + carry,
                                       cfg.threshold)
    last = i == steps - 1
    n = jnp.where(last & (rejected > 0), 0, n)
    steps = jnp.where(last, steps + rejected, steps)
    x_BL = jnp.where(take_BL, x0_BL, x_BL)
    x_BN = jnp.concatenate([x_BN[:, :start], x_BL], axis=1)
    if cfg.output_history:  # else the buffer is empty: indexing it fails even with "drop"
      history_SBN = history_SBN.at[i].set(x_BN, mode="drop")
    return x_BN, i + 1, steps, n, rejected, history_SBN

  x_BN, *_, history_SBN = jax.lax.while_loop(
      lambda s: s[1] < s[2], body,
      (x_BN, jnp.int32(0), jnp.int32(cfg.steps), per_step, jnp.int32(0), history_SBN))
  return DreamOutput(x_BN, history_SBN if cfg.output_history else None)


def sample(graphdef, params, prompt_BP, valid_BP, key, *, cfg: DreamSamplerConfig,
           prompt_has_masks: bool = True) -> DreamOutput:
  """The plain sampler (or ``confidence_threshold``) on the model: full bidirectional forwards
  with pad keys masked. With ``prompt_has_masks`` False (no mask id in the prompt) only the
  completion can hold masks, so the last layer, the head and the decisions run on its rows only
  (``Transformer.forward_cached`` with a window); the tokens are the same. Pure; jit with
  ``graphdef``, ``cfg`` and ``prompt_has_masks`` static."""
  x_BN, valid_BN, positions_BN = initial_sequence(
      prompt_BP, valid_BP, max_new_tokens=cfg.max_new_tokens, mask_id=cfg.mask_id)
  (b, n), p = x_BN.shape, prompt_BP.shape[1]
  if prompt_has_masks:
    start = 0

    def logits_fn(x_BN):
      return transformer.apply(graphdef, params, x_BN, positions_BN, valid_BN[:, None, :])
  else:
    start = p
    empty = transformer.init_kv_cache(nnx.merge(graphdef, params).cfg, b, n)

    def logits_fn(x_BN):
      return transformer.apply_cached_window(
          graphdef, params, x_BN, positions_BN, empty, jnp.zeros((b, n), bool), 0,
          new_valid_BT=valid_BN, write=False, start=p, length=n - p)[0]

  run = denoise_threshold if cfg.alg == "confidence_threshold" else denoise
  return run(logits_fn, x_BN, key, cfg=cfg, start=start)


_sample_jit = jax.jit(sample, static_argnames=("graphdef", "cfg", "prompt_has_masks"))
_sample_blocks_jit = jax.jit(dream_block.sample_blocks, static_argnames=("graphdef", "cfg"))


def validate(cfg: DreamSamplerConfig, *, batch: int, padded: bool, prompt_masks: int = 0):
  """Raise ValueError for settings the official code does not run (or that are not
  implemented here), before anything compiles."""
  algs = sorted(ALGS.names() + list(_OTHER_ALGS))
  if cfg.alg not in algs:
    raise ValueError(f"unknown Dream alg {cfg.alg!r}; available: {', '.join(algs)}")
  if cfg.steps < 1 or cfg.max_new_tokens < 1:
    raise ValueError(f"steps ({cfg.steps}) and max_new_tokens ({cfg.max_new_tokens}) must be >= 1")
  if cfg.temperature < 0 or (cfg.top_k is not None and cfg.top_k < 1) or (
      cfg.top_p is not None and cfg.top_p <= 0):
    raise ValueError(f"need temperature >= 0, top_k >= 1, top_p > 0; got {cfg.temperature}, "
                     f"{cfg.top_k}, {cfg.top_p}")
  if cfg.dual_cache and cfg.block_length is None:
    raise ValueError("dual_cache=True needs block_length (the block / KV-cache sampler)")
  if cfg.alg == "confidence_threshold":
    if batch != 1:
      raise ValueError(f"alg='confidence_threshold' runs batch 1 only (the official code asserts "
                       f"it, and its block sampler decodes row 0 only); got batch {batch}")
    if cfg.block_length is None and (cfg.max_new_tokens + prompt_masks) % cfg.steps:
      raise ValueError(f"alg='confidence_threshold' needs the mask count "
                       f"({cfg.max_new_tokens + prompt_masks}) divisible by steps ({cfg.steps}), "
                       "as the official code asserts")
  if cfg.block_length is not None:
    bl, l = cfg.block_length, cfg.max_new_tokens
    if bl < 1 or l % bl or cfg.steps % (l // bl):
      raise ValueError(f"the block sampler needs max_new_tokens ({l}) divisible by block_length "
                       f"({bl}) and steps ({cfg.steps}) divisible by the {l // max(bl, 1)} blocks")
    if padded:
      raise ValueError("a padded attention_mask is not supported by the block sampler (the "
                       "official block sampler crashes on it: it slices the mask on the key axis)")
    if cfg.dual_cache and batch != 1:
      raise ValueError(f"dual_cache=True runs batch 1 only (the official dual cache raises a "
                       f"shape error for batch > 1); got batch {batch}")


def _prompt_valid(attention_mask_BP, shape) -> tuple[np.ndarray, bool]:
  """(valid_BP, padded) from a 0/1 attention mask; only left padding is accepted."""
  if attention_mask_BP is None:
    return np.ones(shape, bool), False
  valid_BP = np.asarray(attention_mask_BP) != 0
  if valid_BP.shape != shape:
    raise ValueError(f"attention_mask shape {valid_BP.shape} != prompt shape {shape}")
  if np.any(valid_BP[:, :-1] & ~valid_BP[:, 1:]):
    raise ValueError("only left padding is supported (each attention_mask row 0…0 1…1); the "
                     "official sampler ignores position ids, which matches only for left padding")
  return valid_BP, bool(np.any(~valid_BP))


def dream_generate(graphdef, params, prompt_BP, *, attention_mask_BP=None, mask_token_id: int,
                   max_new_tokens: int, steps: int = 512, eps: float = 1e-3, alg: str = "origin",
                   alg_temp: float | None = None, temperature: float = 0.0,
                   top_p: float | None = None, top_k: int | None = None,
                   block_length: int | None = None, dual_cache: bool = False,
                   threshold: float = 0.9, key=None, output_history: bool = False) -> DreamOutput:
  """Dream's ``model.diffusion_generate(prompt, **kwargs)`` for a Dream model split as
  (``graphdef``, ``params``). Call it outside jit (it checks the prompt and mask on the host and
  runs a jitted sampler, compiled once per shape and setting).

  Args (official names and defaults):
    prompt_BP: int [B, P] token ids (``inputs``).
    attention_mask_BP: optional 0/1 [B, P], 0 = left padding.
    mask_token_id: the mask id (151666 for Dream-v0; 156 in the tiny fixture).
    max_new_tokens: tokens generated after the prompt (all start as mask ids).
    steps: forwards (plain sampler); with ``block_length``, ``steps / num_blocks`` per block.
    eps: the schedule's end time, ``linspace(1, eps, steps + 1)``.
    alg: "origin" (stochastic), "maskgit_plus", "topk_margin", "entropy" or
      "confidence_threshold". The block sampler scores by entropy whatever the alg (as
      officially), unless it is "confidence_threshold".
    alg_temp: None/0 = the k most confident positions; > 0 = k sampled from
      softmax(confidence / alg_temp).
    temperature, top_p, top_k: token sampling (0 = greedy argmax over the whole vocabulary).
    block_length: None = the plain sampler; an int = the block / KV-cache sampler (the official
      block sampler's own default is 32).
    dual_cache: block sampler: False = prefix cache, True = dual cache (batch 1).
    threshold: ``confidence_threshold``'s acceptance probability.
    key: a JAX key for the stochastic settings (default ``jax.random.key(0)``: same key, same
      result).
    output_history: also return the tokens after every forward.

  Returns a DreamOutput: ``sequences_BN`` int32 [B, P + max_new_tokens] (prompt included) and
  ``history_SBN`` (None unless ``output_history``).
  Raises ValueError for combinations the official code does not run: padding that is not left
  padding; padding with the block sampler; dual_cache with batch > 1; confidence_threshold with
  batch > 1 or (plain sampler) a mask count not divisible by steps.
  """
  prompt_np = np.asarray(prompt_BP)
  if prompt_np.ndim != 2:
    raise ValueError(f"prompt_BP must be [batch, prompt_len], got shape {prompt_np.shape}")
  valid_BP, padded = _prompt_valid(attention_mask_BP, prompt_np.shape)
  cfg = DreamSamplerConfig(
      max_new_tokens=int(max_new_tokens), mask_id=int(mask_token_id), steps=int(steps),
      eps=float(eps), alg=alg, alg_temp=None if alg_temp is None else float(alg_temp),
      temperature=float(temperature), top_p=None if top_p is None else float(top_p),
      top_k=None if top_k is None else int(top_k),
      block_length=None if block_length is None else int(block_length),
      dual_cache=bool(dual_cache), threshold=float(threshold), output_history=bool(output_history))
  validate(cfg, batch=prompt_np.shape[0], padded=padded,
           prompt_masks=int(np.sum(prompt_np == cfg.mask_id)))
  key = jax.random.key(0) if key is None else key
  prompt_BP = jnp.asarray(prompt_np, jnp.int32)
  if cfg.block_length is not None:
    return _sample_blocks_jit(graphdef=graphdef, params=params, prompt_BP=prompt_BP, key=key,
                              cfg=cfg)
  return _sample_jit(graphdef=graphdef, params=params, prompt_BP=prompt_BP,
                     valid_BP=jnp.asarray(valid_BP), key=key, cfg=cfg,
                     prompt_has_masks=bool(np.any(prompt_np == cfg.mask_id)))
