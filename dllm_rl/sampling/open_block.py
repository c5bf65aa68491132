"""How the masked sampler gets the open block's logits: ``sampler.cache`` modes, registered.

Every mode returns an :class:`OpenBlockModel` for one batch of prompts. At the
first step of each block the sampler calls ``refresh(x_BL, block)`` (logits of
the block's ``block_len`` positions and the mode's state); at every later step
of the block it calls ``step(state, x_BL, block)``. The final norm, the head
and everything after it (Gumbel noise, softmax) run only at the open block's
positions, in every mode. The sequence is [prompt P | completion L], N = P + L,
with the prompt left-padded (``prompt_valid_BP``) and positions counted from the
first valid token.

* ``none`` — the exact sampler: every step runs the full bidirectional forward
  over all N tokens (what LLaDA's ``generate`` does).
* ``prefix`` — Fast-dLLM prefix cache (Wu et al. 2025, arXiv 2505.22618,
  Alg. 1 with the block-wise approximate KV cache): the block-start forward
  writes the keys/values of every position; later steps of block b recompute
  the block and the still-masked suffix (T = N − (P + b·block_len) tokens)
  against the cached prompt and committed blocks. T depends on b, so the
  sampler unrolls its block loop (``static_blocks``).
* ``dual`` — Fast-dLLM DualCache: later steps recompute only the open block
  (T = block_len) against the cached prefix *and* the cached masked suffix.

Within a block the cached keys/values are those of the block-start forward:
prefix/dual are approximations of ``none`` (the committed tokens of the open
block change the cached rows in the exact computation). They are exact when
every block takes a single step: the only step of a block uses the refresh
forward, which is the exact forward (tests/sampling/test_cache.py).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from dllm_rl.models import transformer
from dllm_rl.registry import Registry
from dllm_rl.sampling.step import block_of


class OpenBlockModel(NamedTuple):
  """``refresh(x_BL, block) -> (logits_BTV, state)`` at a block's first step,
  ``step(state, x_BL, block) -> logits_BTV`` at its later steps (T = block_len);
  ``static_blocks``: ``block`` must be a Python int (the sampler unrolls blocks)."""

  refresh: Callable[[jax.Array, Any], tuple[jax.Array, Any]]
  step: Callable[[Any, jax.Array, Any], jax.Array]
  static_blocks: bool = False


CACHES: Registry = Registry("sampler cache mode")


class _Inputs(NamedTuple):
  tokens: Callable[[jax.Array], jax.Array]  # x_BL → tokens_BN
  positions_BN: jax.Array
  valid_BN: jax.Array
  prompt_len: int
  empty_cache: Callable[[], Any]


def _inputs(graphdef, params, prompt_BP, prompt_valid_BP, completion_len: int) -> _Inputs:
  b, p = prompt_BP.shape
  valid_BN = jnp.concatenate([prompt_valid_BP, jnp.ones((b, completion_len), bool)], axis=1)
  model_cfg = nnx.merge(graphdef, params).cfg
  return _Inputs(
      tokens=lambda x_BL: jnp.concatenate([prompt_BP, x_BL], axis=1),
      positions_BN=transformer.positions_from_valid(valid_BN), valid_BN=valid_BN, prompt_len=p,
      empty_cache=lambda: transformer.init_kv_cache(model_cfg, b, p + completion_len))


def _full_forward(graphdef, params, inp: _Inputs, x_BL, block, block_len: int, *, write: bool):
  """The exact forward over all N tokens (key padding on the prompt), head at the open block."""
  b, n = inp.valid_BN.shape
  return transformer.apply_cached_window(
      graphdef, params, inp.tokens(x_BL), inp.positions_BN, inp.empty_cache(),
      jnp.zeros((b, n), bool), 0, new_valid_BT=inp.valid_BN, write=write,
      start=inp.prompt_len + block * block_len, length=block_len)


@CACHES.register("none")
def exact(graphdef, params, prompt_BP, prompt_valid_BP, *, completion_len: int,
          block_len: int) -> OpenBlockModel:
  """The full forward at every step (no cache)."""
  inp = _inputs(graphdef, params, prompt_BP, prompt_valid_BP, completion_len)

  def logits(x_BL, block):
    return _full_forward(graphdef, params, inp, x_BL, block, block_len, write=False)[0]

  return OpenBlockModel(refresh=lambda x_BL, block: (logits(x_BL, block), ()),
                        step=lambda state, x_BL, block: logits(x_BL, block))


def _refresh(graphdef, params, inp, block_len):
  return lambda x_BL, block: _full_forward(graphdef, params, inp, x_BL, block, block_len,
                                           write=True)


@CACHES.register("dual")
def dual(graphdef, params, prompt_BP, prompt_valid_BP, *, completion_len: int,
         block_len: int) -> OpenBlockModel:
  """Fast-dLLM DualCache: later steps run the open block only, against cached
  prompt, committed blocks and masked suffix."""
  inp = _inputs(graphdef, params, prompt_BP, prompt_valid_BP, completion_len)
  p = inp.prompt_len

  def step(cache, x_BL, block):
    offset = p + block * block_len
    tokens_BT = block_of(x_BL, block, block_len)
    positions_BT = jax.lax.dynamic_slice_in_dim(inp.positions_BN, offset, block_len, axis=1)
    logits, _ = transformer.apply_cached_window(
        graphdef, params, tokens_BT, positions_BT, cache, inp.valid_BN, offset, write=False,
        start=0, length=block_len)
    return logits

  return OpenBlockModel(refresh=_refresh(graphdef, params, inp, block_len), step=step)


@CACHES.register("prefix")
def prefix(graphdef, params, prompt_BP, prompt_valid_BP, *, completion_len: int,
           block_len: int) -> OpenBlockModel:
  """Fast-dLLM prefix cache: later steps run the open block and the masked
  suffix against the cached prompt and committed blocks (``block`` static)."""
  inp = _inputs(graphdef, params, prompt_BP, prompt_valid_BP, completion_len)
  p, n = inp.prompt_len, inp.valid_BN.shape[1]

  def step(cache, x_BL, block: int):
    offset = p + block * block_len
    prefix_BM = inp.valid_BN & (jnp.arange(n) < offset)[None, :]  # new rows are placed
    logits, _ = transformer.apply_cached_window(
        graphdef, params, x_BL[:, block * block_len:], inp.positions_BN[:, offset:], cache,
        prefix_BM, offset, write=False, start=0, length=block_len)
    return logits

  return OpenBlockModel(refresh=_refresh(graphdef, params, inp, block_len), step=step,
                        static_blocks=True)
