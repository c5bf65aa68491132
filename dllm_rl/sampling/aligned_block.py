"""Block-diffusion generation with blocks aligned to position 0: the official SDAR
``block_diffusion_generate`` and LLaDA2.0 ``generate``, jitted and batched.

Both official generators lay out one canvas [prompt P | mask ids] of
``num_blocks = ceil((P + gen_length) / block_length)`` blocks, cut into blocks
from position 0 (so the block holding the prompt's tail is decoded with the
prompt tokens in it fixed), and decode block ``P // block_length`` onwards,
left to right, under the block-causal mask (query block ≥ key block, positions
``arange``). Inside a block, each step:

1. runs the model (the official code feeds the window ``x[:, :(b+1)·block]``, SDAR
   with a KV cache of the finished blocks: both equal one forward of the whole
   canvas under the block-causal mask, which is what runs here);
2. proposes x0 over the **whole** vocabulary (the mask id included; argmax at
   temperature 0, else a sample from softmax(logits / T) after top-k / top-p)
   with confidence p(x0);
3. takes k_t = ``transfer_schedule(block_length, steps)[t]`` positions: the k_t
   most confident masked ones (LLaDA2 clamps k_t to the masked count; SDAR
   does not, so its top-k may also pick −inf, i.e. unmasked, positions and
   write x0 over them — reproduced here, tie order aside), or with a
   ``threshold`` every masked position with p > threshold when there are at
   least k_t of them (possibly more than k_t, none when k_t = 0), or with
   ``sequential`` the k_t positions from the first masked one;
4. writes x0 there (a mask-id proposal leaves the position masked).

A block ends when it has no mask left or after ``steps`` steps (masks may
then remain; later blocks never revisit them). After each block a row whose
generated part holds a stop id is finished. The official code handles one
prompt; here rows are independent (each row's decisions use only its own
tokens) and a finished row stops changing while the others go on.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from dllm_rl.kernels.block_mask import block_causal
from dllm_rl.models import transformer
from dllm_rl.parallel.topk import top_k as partitioned_top_k
from dllm_rl.sampling.sampler import transfer_schedule
from dllm_rl.sampling.step import block_of, descending_rank

_NEG = -jnp.inf


@dataclasses.dataclass(frozen=True)
class AlignedBlockConfig:
  """Static settings (names as the official generators' keywords where they exist)."""

  gen_length: int
  block_length: int
  steps: int                        # denoising steps per block
  temperature: float = 0.0          # 0 = argmax
  top_k: int = 0                    # 0 = off
  top_p: float = 1.0                # 1.0 = off
  threshold: float | None = None    # None = static top-k_t
  sequential: bool = False          # SDAR 'sequential': k_t positions from the first mask
  clamp_to_masked: bool = True      # LLaDA2: top-min(k_t, #masked); SDAR: top-k_t
  stop_ids: tuple[int, ...] = ()

  def num_blocks(self, prompt_len: int) -> int:
    return -(-(prompt_len + self.gen_length) // self.block_length)


def filter_logits(logits_BTV, *, top_k: int = 0, top_p: float = 1.0):
  """Top-k then nucleus filtering (removed entries → −inf), as HF-style samplers do: the
  nucleus keeps the most probable tokens up to and including the one whose cumulative
  probability first exceeds ``top_p``."""
  if top_k > 0:
    kth_BT1 = partitioned_top_k(logits_BTV, top_k)[0][..., -1:]
    logits_BTV = jnp.where(logits_BTV < kth_BT1, _NEG, logits_BTV)
  if top_p < 1.0:
    order_BTV = jnp.argsort(-logits_BTV, axis=-1, stable=True)
    sorted_BTV = jnp.take_along_axis(logits_BTV, order_BTV, axis=-1)
    cum_BTV = jnp.cumsum(jax.nn.softmax(sorted_BTV, axis=-1), axis=-1)
    drop_sorted = jnp.concatenate([jnp.zeros_like(cum_BTV[..., :1], bool),
                                   cum_BTV[..., :-1] > top_p], axis=-1)
    rank_BTV = jnp.argsort(order_BTV, axis=-1, stable=True)
    logits_BTV = jnp.where(jnp.take_along_axis(drop_sorted, rank_BTV, axis=-1), _NEG, logits_BTV)
  return logits_BTV


def propose(logits_BTV, key, *, temperature: float, top_k: int = 0, top_p: float = 1.0):
  """(x0_BT, p_BT): argmax at temperature 0, else a sample of the filtered softmax(logits / T);
  p = the proposal's probability under the distribution it came from (float32)."""
  logits_BTV = logits_BTV.astype(jnp.float32)
  if temperature == 0.0:
    x0_BT = jnp.argmax(logits_BTV, axis=-1)
  else:
    logits_BTV = filter_logits(logits_BTV / temperature, top_k=top_k, top_p=top_p)
    x0_BT = jax.random.categorical(key, logits_BTV, axis=-1)
  probs_BTV = jax.nn.softmax(logits_BTV, axis=-1)
  p_BT = jnp.take_along_axis(probs_BTV, x0_BT[..., None], axis=-1)[..., 0]
  return x0_BT.astype(jnp.int32), p_BT


def select(conf_BT, masked_BT, k, *, cfg: AlignedBlockConfig):
  """bool [B, T]: the positions written this step (module docstring, step 3)."""
  t = conf_BT.shape[-1]
  idx_T = jnp.arange(t)
  if cfg.sequential:
    first_B1 = jnp.argmax(masked_BT, axis=-1)[:, None]
    return (idx_T >= first_B1) & (idx_T < first_B1 + k)
  rank_BT = descending_rank(conf_BT)
  k_B = jnp.minimum(k, masked_BT.sum(-1)) if cfg.clamp_to_masked else jnp.full(
      conf_BT.shape[:1], k)
  top_BT = rank_BT < k_B[:, None]
  if cfg.threshold is None:
    return top_BT
  return _above_or_top(conf_BT, top_BT, k, cfg.threshold)


def _above_or_top(conf_BT, top_BT, k, threshold):
  """bool [B, T]: per row, every position with conf > ``threshold`` (strictly) when there
  are at least ``k`` of them, else ``top_BT``."""
  high_BT = conf_BT > threshold
  return jnp.where((high_BT.sum(-1) >= k)[:, None], high_BT, top_BT)


def _canvas(prompt_BP, n: int, mask_id: int):
  """(x_BN, pos_BN): [prompt | mask ids] of length ``n``, positions ``arange``."""
  b, p = prompt_BP.shape
  x_BN = jnp.full((b, n), mask_id, jnp.int32).at[:, :p].set(prompt_BP.astype(jnp.int32))
  return x_BN, jnp.broadcast_to(jnp.arange(n), (b, n))


def _decode_blocks(decode_block, x_BN, *, prompt_len: int, block_length: int, num_blocks: int,
                   stop_ids: tuple[int, ...]):
  """(x_BN, nfe_B): blocks ``prompt_len // block_length`` … ``num_blocks - 1`` in order,
  ``decode_block(x_BN, done_B, nfe_B, block) -> (x_BN, nfe_B)`` each; after a block, a row whose
  generated part holds a stop id is done, and the loop ends when every row is."""
  b = x_BN.shape[0]
  stop_V = np.array(stop_ids or [-1], np.int32)

  def body(c):
    x_BN, done_B, nfe_B, block = c
    x_BN, nfe_B = decode_block(x_BN, done_B, nfe_B, block)
    if stop_ids:
      done_B = done_B | jnp.any(jnp.isin(x_BN[:, prompt_len:], stop_V), axis=-1)
    return x_BN, done_B, nfe_B, block + 1

  x_BN, _, nfe_B, _ = jax.lax.while_loop(
      lambda c: (c[3] < num_blocks) & ~jnp.all(c[1]), body,
      (x_BN, jnp.zeros((b,), bool), jnp.zeros((b,), jnp.int32),
       jnp.int32(prompt_len // block_length)))
  return x_BN, nfe_B


def generate(graphdef, params, prompt_BP, key, *, cfg: AlignedBlockConfig, mask_id: int):
  """(x_BN, nfe_B): the decoded canvas [B, num_blocks·block_length] (prompt included) and
  the number of forwards each row took part in. Pure; jit with ``cfg``/``mask_id`` static."""
  b, p = prompt_BP.shape
  bs, steps = cfg.block_length, cfg.steps
  nb = cfg.num_blocks(p)
  n = nb * bs
  x_BN, pos_BN = _canvas(prompt_BP, n, mask_id)
  blk_N = jnp.arange(n) // bs
  mask_1NN = block_causal(blk_N, blk_N)[None]
  sched_S = jnp.asarray(transfer_schedule(bs, steps))

  def running(x_BN, block, done_B):
    return ~done_B & jnp.any(block_of(x_BN, block, bs) == mask_id, axis=-1)

  def step(c):
    s, x_BN, done_B, nfe_B, block = c
    run_B = running(x_BN, block, done_B)
    logits_BNV = transformer.apply(graphdef, params, x_BN, pos_BN, mask_1NN)
    logits_BTV = jax.lax.dynamic_slice_in_dim(logits_BNV, block * bs, bs, axis=1)
    x0_BT, p_BT = propose(logits_BTV, jax.random.fold_in(key, block * steps + s),
                          temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
    x_BT = block_of(x_BN, block, bs)
    masked_BT = x_BT == mask_id
    write_BT = select(jnp.where(masked_BT, p_BT, _NEG), masked_BT, sched_S[s], cfg=cfg)
    x_BT = jnp.where(write_BT & run_B[:, None], x0_BT, x_BT)
    x_BN = jax.lax.dynamic_update_slice_in_dim(x_BN, x_BT, block * bs, axis=1)
    return s + 1, x_BN, done_B, nfe_B + run_B, block

  def decode_block(x_BN, done_B, nfe_B, block):
    _, x_BN, _, nfe_B, _ = jax.lax.while_loop(
        lambda c: (c[0] < steps) & jnp.any(running(c[1], block, c[2])), step,
        (jnp.int32(0), x_BN, done_B, nfe_B, block))
    return x_BN, nfe_B

  return _decode_blocks(decode_block, x_BN, prompt_len=p, block_length=bs, num_blocks=nb,
                        stop_ids=cfg.stop_ids)


@dataclasses.dataclass(frozen=True)
class EditingConfig:
  """LLaDA2.1 ``generate`` settings (its keyword names; ``steps`` is unused there)."""

  gen_length: int
  block_length: int
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  threshold: float = 0.95
  editing_threshold: float = 0.9
  max_post_steps: int = 16
  num_to_transfer: int = 1
  stop_ids: tuple[int, ...] = ()

  def num_blocks(self, prompt_len: int) -> int:
    return -(-(prompt_len + self.gen_length) // self.block_length)


def select_editing(x0_BT, p_BT, x_BT, prompt_T, *, mask_id: int, cfg: EditingConfig):
  """(fill_BT, edit_BT) bool [B, T]: one LLaDA2.1 step's choice in a block (official 2.1).

  ``x0_BT``/``p_BT`` are the proposals and their confidences, ``x_BT`` the block's tokens,
  ``prompt_T`` marks its prompt positions. ``fill``: among the masked positions, every one
  with p > ``threshold`` (strictly) if there are at least ``num_to_transfer``, else the top
  min(num_to_transfer, #masked). ``edit``: every non-mask, non-prompt position whose proposal
  differs from its token and has p > ``editing_threshold`` (strictly).
  """
  masked_BT = x_BT == mask_id
  conf_BT = jnp.where(masked_BT, p_BT, _NEG)
  k = cfg.num_to_transfer
  top_BT = descending_rank(conf_BT) < jnp.minimum(k, masked_BT.sum(-1))[:, None]
  fill_BT = _above_or_top(conf_BT, top_BT, k, cfg.threshold)
  edit_BT = (~masked_BT & ~prompt_T[None] & (p_BT > cfg.editing_threshold)
             & (x0_BT != x_BT))
  return fill_BT, edit_BT


def generate_editing(graphdef, params, prompt_BP, key, *, cfg: EditingConfig, mask_id: int):
  """(x_BN, nfe_B) of the LLaDA2.1 official ``generate`` (token editing), jitted and batched.

  As :func:`generate` (blocks from position 0, window = blocks ≤ the current one), but
  each block loops until done: a step writes (:func:`select_editing`) (a) among the block's
  masked positions every one with p > ``threshold`` if there are at least
  ``num_to_transfer``, else the top min(num_to_transfer, #masked), and (b) **edits**: every
  non-mask, non-prompt position of the block whose proposal differs from its token and has
  p > ``editing_threshold``. The block ends after a step that started without masks and
  edited nothing, or once ``max_post_steps`` mask-free steps have run (the check comes before
  the forward).

  The official 2.1 mask is the 0/1 block-lower-triangular matrix as a float, which SDPA
  *adds* to the scores (it blocks nothing inside the window; allowed keys get +1), so that
  is what runs here: keys past the window are blocked, the rest get +1 where key block ≤
  query block. Earlier blocks therefore attend to the current one (a port with a true
  block-causal mask reproduces 2.0, not 2.1).
  """
  b, p = prompt_BP.shape
  bs = cfg.block_length
  nb = cfg.num_blocks(p)
  n = nb * bs
  x_BN, pos_BN = _canvas(prompt_BP, n, mask_id)
  blk_N = jnp.arange(n) // bs
  bias_NN = block_causal(blk_N, blk_N).astype(jnp.float32)

  def step(c):
    it, x_BN, post_B, run_B, nfe_B, block = c
    x_BT = block_of(x_BN, block, bs)
    active_BT = x_BT == mask_id
    has_mask_B = active_BT.any(-1)
    post_B = post_B + (run_B & ~has_mask_B)
    run_B = run_B & (post_B <= cfg.max_post_steps)
    window_1NN = jnp.where((blk_N <= block)[None, None, :], bias_NN[None], -1e30)
    logits_BNV = transformer.apply(graphdef, params, x_BN, pos_BN, window_1NN)
    logits_BTV = jax.lax.dynamic_slice_in_dim(logits_BNV, block * bs, bs, axis=1)
    x0_BT, p_BT = propose(logits_BTV, jax.random.fold_in(key, block * 65536 + it),
                          temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
    fill_BT, edit_BT = select_editing(x0_BT, p_BT, x_BT, block * bs + jnp.arange(bs) < p,
                                      mask_id=mask_id, cfg=cfg)
    write_BT = (fill_BT | edit_BT) & run_B[:, None]
    x_BN = jax.lax.dynamic_update_slice_in_dim(x_BN, jnp.where(write_BT, x0_BT, x_BT),
                                               block * bs, axis=1)
    nfe_B = nfe_B + run_B
    run_B = run_B & (has_mask_B | edit_BT.any(-1))
    return it + 1, x_BN, post_B, run_B, nfe_B, block

  def decode_block(x_BN, done_B, nfe_B, block):
    _, x_BN, _, _, nfe_B, _ = jax.lax.while_loop(
        lambda c: jnp.any(c[3]), step,
        (jnp.int32(0), x_BN, jnp.zeros((b,), jnp.int32), ~done_B, nfe_B, block))
    return x_BN, nfe_B

  return _decode_blocks(decode_block, x_BN, prompt_len=p, block_length=bs, num_blocks=nb,
                        stop_ids=cfg.stop_ids)
