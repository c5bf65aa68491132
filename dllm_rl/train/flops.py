"""Analytic model FLOPs of the programs a run executes (the MFU convention).

Counted: the matmuls of the model, attention included, 2 FLOPs per multiply-add;
not counted: norms, RoPE, softmax, the embedding gather, the optimizer, and any
recomputation (remat, the no-grad pass of gradient accumulation): model FLOPs,
not hardware FLOPs (PaLM, Chowdhery et al. 2022, App. B). Per sequence:

    layer(t rows, m keys) = 2 t P_layer + 4 t m H Q          (P_layer: matmul weights,
    P_layer = d(H + 2K)Q + H Q d + 3 d F                      QKᵀ and PV: 2 t m H Q each)
    forward = n_layers · layer(N, M) + 2 d V r               (r rows reach the LM head)

with d = d_model, H / K query / key-value heads, Q = head_dim, F = mlp_hidden,
V = vocab. A mixture-of-experts layer (``model.n_experts`` > 0, from layer
``first_dense_layers`` on) counts its *active* weights only: the router d·E plus
3 d F_e (k + s) for the k routed and s shared experts of width F_e = ``moe_hidden``
(the grouped-matmul dispatch computes exactly the chosen experts). A training step
costs 3 × forward (forward + backward, whose two matmuls per forward matmul give the
2×: Kaplan et al. 2020, §2.1).

Attention is counted dense over every key the computation attends (masked keys
included: a masked dense softmax computes them). The block-diffusion layout
[prompt | clean L | noisy L] of ``block_elbo`` (N = P + 2L) is counted dense over
all N keys too, as its reference attention computes it; the Pallas staircase
kernel skips fully masked tiles, so there this overstates the attention work.

Where the count comes from:

* ``rl_step`` (dllm_rl/rl/step.py): B·G sequences; one likelihood estimate costs
  K forwards (``elbo``, ``spg_block``: K = ``estimator.num_samples`` draws on
  [prompt P | completion L], one more for ``elbo``'s ``full_mask_term``; ``block_elbo``: K
  staircase passes on N = P + 2L; ``mean_field``: one forward whatever K; ``trajectory``:
  K = ceil(S / shrink) state passes on [prompt P | completion L], or for a block model
  K = ceil(S_b / shrink) staircase passes on N = P + 2L, S_b the steps of one block), the head on
  the L completion rows the estimators score. Per rollout batch: ℓ̂_old once (``antithetic`` False)
  or μ times (``antithetic`` True), ℓ̂_ref μ times when ``rl.kl_coef > 0``, and μ =
  ``rl.inner_steps`` updates at 3 × the estimate.
* ``sft_step`` (dllm_rl/train/sft_step.py): ``data.batch_size`` sequences, 3 × one
  forward (N = P + L, or P + 2L for a block model), head on the L completion rows.
* the samplers: see :func:`sampler_flops`.
"""

from __future__ import annotations

import dataclasses
import math

from dllm_rl.diffusion.trajectory import num_passes
from dllm_rl.models.transformer import ModelConfig
from dllm_rl.registry import Registry
from dllm_rl.sampling.configs import sampler_config


def layer_matmul_params(m: ModelConfig, layer: int = 0) -> int:
  """Weights layer ``layer`` multiplies each row by: q, k, v, o projections and the
  SwiGLU MLP, or for an MoE layer the router and the active (routed + shared) experts."""
  attn = (m.d_model * (m.n_heads + 2 * m.n_kv_heads) * m.head_dim
          + m.n_heads * m.head_dim * m.d_model)
  if m.is_moe_layer(layer):
    active = m.experts_per_token + m.n_shared_experts
    return attn + m.d_model * m.n_experts + 3 * m.d_model * m.moe_hidden * active
  return attn + 3 * m.d_model * m.mlp_hidden


def forward_flops(m: ModelConfig, tokens: float, *, keys: float | None = None,
                  head_rows: float | None = None, last_rows: float | None = None) -> float:
  """One sequence's forward: ``tokens`` rows through the layers attending ``keys`` keys
  each (default ``tokens``), ``head_rows`` rows through the LM head (default ``tokens``).

  ``last_rows`` (default ``tokens``): rows of the last layer past its key/value
  projections (query, attention, output projection, MLP). Fewer when only some rows'
  outputs are used: the sampler's open-block window (``Transformer.forward_cached``
  with ``window``), or 0 for a cache write whose logits are discarded (XLA removes
  the dead rest of the last layer).
  """
  keys = tokens if keys is None else keys
  head_rows = tokens if head_rows is None else head_rows
  last_rows = tokens if last_rows is None else last_rows
  kv = 2 * m.d_model * m.n_kv_heads * m.head_dim
  total = 2 * m.d_model * m.vocab_size * head_rows
  for i in range(m.n_layers):
    rows = last_rows if i == m.n_layers - 1 else tokens
    rest = layer_matmul_params(m, i) - kv
    total += 2 * tokens * kv + 2 * rows * rest + 4 * rows * keys * m.n_heads * m.head_dim
  return float(total)


# The registered estimators (dllm_rl.diffusion.estimators.ESTIMATORS) that
# :func:`estimate_flops` counts. An RL run reads the count for its MFU (and the study's sizing
# for its time estimate), so validation rejects an estimator left out of it
# (dllm_rl.train.validate), before anything compiles; a new estimator is added here and there.
COUNTED_ESTIMATORS = ("mean_field", "elbo", "spg_block", "block_elbo", "trajectory")
# The counts of estimators registered outside dllm_rl (README "Out-of-tree components"), by the
# module that registers the estimator: ``FLOP_COUNTS.register("name")(fn)``,
# ``fn(model_cfg, num_samples, prompt_len, completion_len, block) -> float`` as
# :func:`estimate_flops` (e.g. ``num_samples * forward_flops(m, p + l, head_rows=l)``).
FLOP_COUNTS: Registry = Registry("FLOP count")


def counted(estimator: str) -> bool:
  """Whether :func:`estimate_flops` counts ``estimator``."""
  return estimator in COUNTED_ESTIMATORS or estimator in FLOP_COUNTS


def estimate_flops(m: ModelConfig, estimator: str, num_samples: int, prompt_len: int,
                   completion_len: int, *, block: bool = False) -> float:
  """Forward FLOPs of one likelihood estimate ℓ̂ of one sequence (all its draws);
  ``block``: a block-diffusion model (``trajectory`` then runs staircase passes)."""
  p, l = prompt_len, completion_len
  if estimator not in COUNTED_ESTIMATORS:
    if estimator in FLOP_COUNTS:
      return float(FLOP_COUNTS.get(estimator)(m, num_samples, p, l, block))
    raise ValueError(no_flop_count(estimator))
  if estimator == "mean_field":
    return forward_flops(m, p + l, head_rows=l)
  if estimator == "block_elbo" or (estimator == "trajectory" and block):
    return num_samples * forward_flops(m, p + 2 * l, head_rows=l)
  return num_samples * forward_flops(m, p + l, head_rows=l)  # elbo, spg_block, trajectory


def no_flop_count(estimator: str) -> str:
  """The problem of an estimator :func:`estimate_flops` does not count, and where to fix it."""
  return (f"estimator {estimator!r} has no FLOP count (the run's MFU and the study's sizing"
          " read one): add it to COUNTED_ESTIMATORS and estimate_flops in"
          " dllm_rl/train/flops.py (how many forwards of which length one estimate costs), or,"
          " for an estimator registered outside dllm_rl, register its count beside it with"
          f" dllm_rl.train.flops.FLOP_COUNTS.register({estimator!r})")


def rl_step_flops(config, model_cfg: ModelConfig, *, prompt_len: int | None = None) -> float:
  """Model FLOPs of one ``rl_step`` call (one rollout batch, μ inner updates).

  ``prompt_len``: the batch's prompt width (a ``data.prompt_buckets`` bucket;
  default ``data.prompt_len``). ``rl.micro_batch``'s extra no-grad pass is
  overhead, not model FLOPs, and is not counted.
  """
  r, x = config.rl, config.estimator
  p = config.data.prompt_len if prompt_len is None else prompt_len
  draws = x.num_samples + (1 if x.name == "elbo" and x.full_mask_term else 0)
  bs, l = config.model.block_size, config.data.completion_len
  if x.name == "trajectory":  # one pass per group of shrink states of the sampler's budget
    draws = num_passes(sampler_config(config).max_steps, x.trajectory_shrink,
                       completion_len=l, block_size=bs)
  est = estimate_flops(model_cfg, x.name, draws, p, l, block=bs > 0)
  mu = r.inner_steps
  passes = (mu if x.antithetic else 1) + (mu if r.kl_coef > 0 else 0) + 3 * mu
  return float(r.batch_prompts * r.group_size * est * passes)


def sft_step_flops(config, model_cfg: ModelConfig, *, prompt_len: int | None = None) -> float:
  """Model FLOPs of one ``sft_step`` call: 3 × forward of ``data.batch_size`` sequences."""
  d = config.data
  p = d.prompt_len if prompt_len is None else prompt_len
  n = p + (2 if config.model.block_size else 1) * d.completion_len
  return float(3 * d.batch_size * forward_flops(model_cfg, n, head_rows=d.completion_len))


def sampler_flops(m: ModelConfig, cfg, batch: int, prompt_len: int, *,
                  blocks: int | None = None, steps: float | None = None) -> float:
  """Model FLOPs of one sampler call on ``batch`` sequences (dllm_rl/sampling/).

  ``blocks`` blocks denoised in ``steps`` steps in all (default: every block, at
  ``cfg.steps_per_block`` steps each, or ``block_len`` each in threshold mode: an
  upper bound, as is every block when ``stop_at_eos`` ends sampling early). The
  RL loop passes the max over the G groups of the sampler's ``num_blocks`` /
  ``num_steps`` (a vmapped loop runs until its last lane is done; the prefix mode's
  unrolled per-block conds run every block under that vmap, of which only those
  sampled count as model FLOPs). With N = P + L
  and T = ``block_len``, one step computes (head on the open block's T rows):

  * masked sampler, ``cache="none"``: the full forward over N (the last layer's
    query/attention/MLP and the head on the window of T rows);
  * ``"dual"``: that full forward at a block's first step (and at every
    ``cache_refresh``-th step), otherwise T rows against the N cached keys;
  * ``"prefix"``: the full forward at refreshes, otherwise, in block b, the
    N − (P + b·T) rows of the open block and the masked suffix against N keys;
  * block sampler (KV cache): T rows against the P + L cache slots; plus a prompt
    prefill (P rows, logits discarded) once and a clean-block cache write (T rows,
    logits discarded) after each block but the last; without the cache (the dense
    reference) the full N-row forward with the head on all N rows.

  Attention runs over every cache slot (valid or not), as the code computes it.
  """
  p, l, t = prompt_len, cfg.completion_len, cfg.block_len
  n = p + l
  blocks = cfg.num_blocks if blocks is None else blocks
  if blocks <= 0:
    return 0.0
  if steps is None:
    per_block = t if cfg.threshold > 0 else cfg.steps_per_block
  else:
    per_block = steps / blocks
  full = forward_flops(m, n, head_rows=t, last_rows=t)
  if hasattr(cfg, "use_cache"):  # block-diffusion sampler
    if not cfg.use_cache:
      return batch * blocks * per_block * forward_flops(m, n)
    step = forward_flops(m, t, keys=n)
    write = forward_flops(m, t, keys=n, head_rows=0, last_rows=0)
    prefill = forward_flops(m, p, keys=n, head_rows=0, last_rows=0)
    return batch * (prefill + blocks * per_block * step + (blocks - 1) * write)
  if cfg.cache == "none":
    return batch * blocks * per_block * full
  every = cfg.cache_refresh
  refreshes = 1 + (math.floor((per_block - 1) / every) if every and per_block > 1 else 0)
  total = 0.0
  for b in range(int(blocks)):
    rows = t if cfg.cache == "dual" else n - (p + b * t)
    later = forward_flops(m, rows, keys=n, head_rows=t, last_rows=t)
    total += refreshes * full + (per_block - refreshes) * later
  return batch * total


def program_flops(config, model_cfg: ModelConfig) -> dict[str, float]:
  """Analytic FLOPs of each program of dllm_rl.planning.programs (the planner's column), at
  ``data.prompt_len``; the samplers at their full schedule."""
  from dllm_rl.sampling.configs import sampler_config
  sampler_cfg = sampler_config(config)
  r, p = config.rl, config.data.prompt_len
  out = {"sft_step": sft_step_flops(config, model_cfg),
         "rl_step": rl_step_flops(config, model_cfg),
         "rollout_sampler": sampler_flops(
             model_cfg, dataclasses.replace(sampler_cfg, temperature=float(r.temperature)),
             r.batch_prompts * r.group_size, p),
         "greedy_sampler": sampler_flops(model_cfg, sampler_cfg, config.eval.batch_size, p)}
  return out
