"""Held-out evaluation: greedy accuracy with the jitted sampler, host-side verifiers."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import numpy as np

from dllm_rl.sampling import sampler as sampler_lib


def make_sample_fn(graphdef, cfg: sampler_lib.SamplerConfig, *, mask_id: int, eos_id: int):
  """Jitted ``fn(params, prompt_BP, prompt_valid_BP, key) -> SampleOutput``."""
  return jax.jit(functools.partial(sampler_lib.sample, graphdef, cfg=cfg,
                                   mask_id=mask_id, eos_id=eos_id))


def _pad_rows(a: np.ndarray, rows: int) -> np.ndarray:
  if a.shape[0] == rows:
    return a
  pad = np.repeat(a[-1:], rows - a.shape[0], axis=0)
  return np.concatenate([a, pad], axis=0)


def generate(sample_fn, params, prompt_BP: np.ndarray, prompt_valid_BP: np.ndarray,
             key: jax.Array, batch_size: int) -> np.ndarray:
  """Run the sampler over all prompts in fixed-size batches (one compile); completions [N, L]."""
  outs = []
  n = prompt_BP.shape[0]
  for i, start in enumerate(range(0, n, batch_size)):
    p = _pad_rows(prompt_BP[start:start + batch_size], batch_size)
    v = _pad_rows(prompt_valid_BP[start:start + batch_size], batch_size)
    out = sample_fn(params, p, v, jax.random.fold_in(key, i))
    outs.append(np.asarray(out.completion_BL)[: min(batch_size, n - start)])
  return np.concatenate(outs, axis=0)


def score(task, tokenizer, examples: Sequence[Any], completions_NL: np.ndarray) -> dict:
  """Decode and verify each completion; accuracy and mean reward."""
  results = [task.verify(ex, tokenizer.decode(c)) for ex, c in zip(examples, completions_NL)]
  return {
      "accuracy": float(np.mean([r.correct for r in results])),
      "reward": float(np.mean([r.reward for r in results])),
  }


def greedy_accuracy(graphdef, params, *, task, tokenizer, examples, arrays: dict,
                    cfg: sampler_lib.SamplerConfig, batch_size: int, sample_fn=None) -> dict:
  """Greedy (temperature 0) held-out accuracy on ``examples`` (encoded in ``arrays``)."""
  if sample_fn is None:
    sample_fn = make_sample_fn(graphdef, dataclasses.replace(cfg, temperature=0.0),
                               mask_id=tokenizer.mask_id, eos_id=tokenizer.eos_id)
  completions = generate(sample_fn, params, arrays["prompt_BP"], arrays["prompt_valid_BP"],
                         jax.random.key(0), batch_size)
  return score(task, tokenizer, examples, completions)
