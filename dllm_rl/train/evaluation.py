"""Held-out evaluation: greedy accuracy with the jitted sampler, host-side verifiers."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import time
from typing import Any, NamedTuple, Sequence

import jax
import numpy as np

from dllm_rl.parallel.constraints import jit_sharded
from dllm_rl.parallel.shard import replicated
from dllm_rl.sampling import block_sampler, dream_rollout
from dllm_rl.sampling import sampler as sampler_lib
from dllm_rl.tasks.base import VerifyResult
from dllm_rl.tasks.data import trim_to_bucket
from dllm_rl.train.resilience import raise_if_eval_stopped


def make_sample_fn(graphdef, cfg: sampler_lib.SamplerConfig, *, mask_id: int, eos_id: int,
                   mesh=None, group_size: int = 0):
  """Jitted ``fn(params, prompt_BP, prompt_valid_BP, key) -> SampleOutput``
  (``group_size`` > 0: G completions per prompt). A ``BlockSamplerConfig`` selects
  the block-diffusion sampler (KV cache), a ``DreamRolloutConfig`` Dream's own. With a
  ``mesh`` the outputs are replicated, so every host can decode and verify them."""
  if isinstance(cfg, block_sampler.BlockSamplerConfig):  # block-diffusion model
    one, groups = block_sampler.sample_blocks, block_sampler.sample_block_groups
  elif isinstance(cfg, dream_rollout.DreamRolloutConfig):  # sampler.kind = "dream"
    one, groups = dream_rollout.sample, dream_rollout.sample_groups
  else:
    one, groups = sampler_lib.sample, sampler_lib.sample_groups
  if group_size:
    fn = functools.partial(groups, graphdef, group_size=group_size, cfg=cfg, mask_id=mask_id,
                           eos_id=eos_id)
  else:
    fn = functools.partial(one, graphdef, cfg=cfg, mask_id=mask_id, eos_id=eos_id)
  return jit_sharded(fn, mesh, out_shardings=None if mesh is None else replicated(mesh))


def _pad_rows(a: np.ndarray, rows: int) -> np.ndarray:
  if a.shape[0] == rows:
    return a
  pad = np.repeat(a[-1:], rows - a.shape[0], axis=0)
  return np.concatenate([a, pad], axis=0)


def generate(sample_fn, params, prompt_BP: np.ndarray, prompt_valid_BP: np.ndarray,
             key: jax.Array, batch_size: int, buckets: Sequence[int] = ()) -> np.ndarray:
  """Run the sampler over all prompts in fixed-size batches (one compile per prompt
  bucket, ``data.prompt_buckets``); completions [N, L]."""
  outs = []
  n = prompt_BP.shape[0]
  for i, start in enumerate(range(0, n, batch_size)):
    raise_if_eval_stopped()  # a mode=eval stop request that the code it hit swallowed
    batch, _ = trim_to_bucket(
        {"prompt_BP": _pad_rows(prompt_BP[start:start + batch_size], batch_size),
         "prompt_valid_BP": _pad_rows(prompt_valid_BP[start:start + batch_size], batch_size)},
        buckets)
    p, v = batch["prompt_BP"], batch["prompt_valid_BP"]
    out = sample_fn(params, p, v, jax.random.fold_in(key, i))
    outs.append(np.asarray(out.completion_BL)[: min(batch_size, n - start)])
  return np.concatenate(outs, axis=0)


MAX_VERIFY_THREADS = 32


def verify_all(task, pairs: Sequence[tuple[Any, str]]) -> list:
  """``task.verify(example, text)`` of each pair, in order: one after another, or for a task
  whose verifier waits on child processes (``parallel_verify``: the code task runs each
  completion's test cases) on up to min(CPUs, 32) threads at once."""
  if not getattr(task, "parallel_verify", False) or len(pairs) < 2:
    return [_checked(task, task.verify(ex, text)) for ex, text in pairs]
  workers = min(os.cpu_count() or 1, MAX_VERIFY_THREADS, len(pairs))
  with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
    return [_checked(task, r) for r in pool.map(lambda pair: task.verify(*pair), pairs)]


def _checked(task, result):
  """``result`` of ``task.verify``; a TypeError naming the task's class and module when it is
  not a VerifyResult (a task's verifier returning a bool failed later as "'bool' object has no
  attribute 'correct'", after the SFT phase had trained)."""
  if not isinstance(result, VerifyResult):
    cls = type(task)
    raise TypeError(f"task.name={task.name!r}: {cls.__name__}.verify ({cls.__module__})"
                    f" returned {type(result).__name__}; a task's verify returns a"
                    " dllm_rl.tasks.base.VerifyResult(reward, correct, parsed, info)")
  return result


def verify_each(task, tokenizer, examples: Sequence[Any], completions_NL: np.ndarray) -> list:
  """(decoded text, ``task.verify`` result) of each completion."""
  texts = [tokenizer.decode(c) for c in completions_NL]
  return list(zip(texts, verify_all(task, list(zip(examples, texts)))))


def mean_scores(graded: Sequence[tuple[str, Any]]) -> dict:
  """Accuracy and mean reward of :func:`verify_each`'s results."""
  return {"accuracy": float(np.mean([r.correct for _, r in graded])),
          "reward": float(np.mean([r.reward for _, r in graded]))}


def _greedy(graphdef, params, *, task, tokenizer, examples, arrays: dict,
            cfg: sampler_lib.SamplerConfig, batch_size: int, sample_fn=None, mesh=None,
            buckets: Sequence[int] = ()) -> tuple[np.ndarray, list]:
  """Greedy completions [N, L] of ``examples`` and their :func:`verify_each` results."""
  if sample_fn is None:
    sample_fn = make_sample_fn(graphdef, dataclasses.replace(cfg, temperature=0.0),
                               mask_id=tokenizer.mask_id, eos_id=tokenizer.eos_id, mesh=mesh)
  completions_NL = generate(sample_fn, params, arrays["prompt_BP"], arrays["prompt_valid_BP"],
                            jax.random.key(0), batch_size, buckets)
  return completions_NL, verify_each(task, tokenizer, examples, completions_NL)


def greedy_accuracy(graphdef, params, *, task, tokenizer, examples, arrays: dict,
                    cfg: sampler_lib.SamplerConfig, batch_size: int, sample_fn=None,
                    mesh=None, buckets: Sequence[int] = ()) -> dict:
  """Greedy (temperature 0) held-out accuracy on ``examples`` (encoded in ``arrays``)."""
  _, graded = _greedy(graphdef, params, task=task, tokenizer=tokenizer, examples=examples,
                      arrays=arrays, cfg=cfg, batch_size=batch_size, sample_fn=sample_fn,
                      mesh=mesh, buckets=buckets)
  return mean_scores(graded)


def generation_records(tokenizer, split: "Split", graded: Sequence[tuple[str, Any]]) -> list:
  """One JSON-ready dict per example of ``split``: the prompt as the model saw it
  (decoded, padding dropped), the reference answer, the completion, its parsed answer,
  reward and correctness."""
  prompts_BP, valid_BP = split.arrays["prompt_BP"], split.arrays["prompt_valid_BP"]
  return [{"index": i, "prompt": tokenizer.decode(prompts_BP[i][valid_BP[i].astype(bool)],
                                                  stop_at_eos=False),
           "answer": ex.answer, "completion": text, "parsed": result.parsed,
           "reward": float(result.reward), "correct": bool(result.correct)}
          for i, (ex, (text, result)) in enumerate(zip(split.examples, graded))]


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k (Chen et al. 2021): 1 − C(n − c, k) / C(n, k), computed stably."""
  if not 0 < k <= n or not 0 <= c <= n:
    raise ValueError(f"need 0 < k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


class Graded(NamedTuple):
  """A [B, G] batch of verified completions. ``parsed[i][j]``: the verifier's normalised
  answer, or the decoded text when it could not parse one (``malformed_BG`` then True)."""
  rewards_BG: np.ndarray
  correct_BG: np.ndarray
  parsed: list[list[str]]
  malformed_BG: np.ndarray


def verify_groups(task, tokenizer, examples: Sequence[Any], completions_BGL: np.ndarray) -> Graded:
  """Host verifiers over [B, G] completions."""
  b, g, _ = completions_BGL.shape
  rewards = np.zeros((b, g), np.float32)
  correct = np.zeros((b, g), bool)
  malformed = np.zeros((b, g), bool)
  texts = [[tokenizer.decode(completions_BGL[i, j]) for j in range(g)] for i in range(b)]
  results = iter(verify_all(task, [(ex, text) for ex, row in zip(examples, texts)
                                   for text in row]))
  parsed = []
  for i in range(len(examples)):
    row = []
    for j in range(g):
      text, result = texts[i][j], next(results)
      rewards[i, j], correct[i, j] = result.reward, result.correct
      malformed[i, j] = result.parsed is None
      row.append(result.parsed if result.parsed is not None else text)
    parsed.append(row)
  return Graded(rewards, correct, parsed, malformed)


def sampled_metrics(sample_fn, params, *, task, tokenizer, examples, arrays: dict, num_samples: int,
                    ks: Sequence[int], batch_size: int, key: jax.Array,
                    buckets: Sequence[int] = ()) -> dict:
  """n samples per prompt: unbiased pass@k for each k, mean sample accuracy, answer
  diversity (distinct answers per prompt, malformed outputs by their text) and distinct
  correct answers per prompt (by the verifier's normalised answer: on countdown, distinct
  expressions that hit the target, spacing and redundant parentheses aside), and the fraction
  of samples the verifier could not parse (format collapse: malformed outputs score as a wrong
  answer does)."""
  n = num_samples
  prompts = np.repeat(arrays["prompt_BP"], n, axis=0)
  valid = np.repeat(arrays["prompt_valid_BP"], n, axis=0)
  completions = generate(sample_fn, params, prompts, valid, key, batch_size, buckets)
  completions = completions.reshape(len(examples), n, -1)
  graded = verify_groups(task, tokenizer, examples, completions)
  correct, parsed = graded.correct_BG, graded.parsed
  counts = correct.sum(-1)
  return {
      "pass_at_k": {str(k): float(np.mean([pass_at_k(n, int(c), k) for c in counts])) for k in ks},
      "sample_accuracy": float(correct.mean()),
      "diversity": float(np.mean([len(set(row)) for row in parsed])),
      "distinct_correct": distinct_correct(parsed, correct),
      "malformed_fraction": float(graded.malformed_BG.mean()),
  }


def distinct_correct(parsed: Sequence[Sequence[str]], correct_BG) -> float:
  """Mean over prompts of the number of distinct correct answers among its samples
  (``parsed[i][j]``: sample j's normalised answer; a correct one is never None)."""
  return float(np.mean([len({a for a, ok in zip(row, oks) if ok})
                        for row, oks in zip(parsed, correct_BG)]))


@dataclasses.dataclass(frozen=True)
class EvalOptions:
  """The options of held-out evaluation (``config.eval``, the prompt buckets, the seed)."""

  batch_size: int
  num_samples: int                 # n samples per prompt for pass@k
  pass_k: tuple[int, ...]
  temperature: float               # sampling temperature of the pass@k samples
  buckets: tuple[int, ...] = ()    # data.prompt_buckets
  seed: int = 0

  @classmethod
  def from_config(cls, config) -> "EvalOptions":
    e = config.eval
    return cls(batch_size=e.batch_size, num_samples=e.num_samples, pass_k=tuple(e.pass_k),
               temperature=float(e.temperature), buckets=tuple(config.data.prompt_buckets),
               seed=config.seed)


@dataclasses.dataclass(frozen=True)
class Decoding:
  """What decoding and verifying a policy's completions needs: the task (verifier), its
  tokenizer, the sampler config and the mesh."""

  task: Any
  tokenizer: Any
  sampler_cfg: Any  # SamplerConfig | BlockSamplerConfig
  mesh: Any = None


class Split(NamedTuple):
  """A task split: its examples and their encoded arrays (``prompt_BP``, ...)."""

  examples: list
  arrays: dict


def make_greedy_evaluator(graphdef, decoding: Decoding, options: EvalOptions):
  """One jitted greedy sampler for a run and ``grade(params, split)`` over it: the
  :func:`verify_each` results of the split's greedy completions (validation during training:
  :func:`mean_scores` of them; sample completions); returns (sample_fn, grade)."""
  cfg = dataclasses.replace(decoding.sampler_cfg, temperature=0.0)
  sample_fn = make_sample_fn(graphdef, cfg, mask_id=decoding.tokenizer.mask_id,
                             eos_id=decoding.tokenizer.eos_id, mesh=decoding.mesh)

  def grade(params, split: Split) -> list:
    _, graded = _greedy(graphdef, params, task=decoding.task, tokenizer=decoding.tokenizer,
                        examples=split.examples, arrays=split.arrays, cfg=cfg,
                        batch_size=options.batch_size, sample_fn=sample_fn,
                        buckets=options.buckets)
    return graded

  return sample_fn, grade


def head(split: Split, n: int) -> Split:
  """The first ``n`` examples of ``split`` (all when it has fewer)."""
  return Split(split.examples[:n], {k: v[:n] for k, v in split.arrays.items()})


def rollout_records(task, tokenizer, split: Split, completions_BGL: np.ndarray,
                    correct_BG: np.ndarray, index_B: np.ndarray,
                    rewards_BG: np.ndarray | None = None) -> list:
  """:func:`generation_records` of the first completion of each prompt of a rollout batch
  (``split``: its examples and prompt arrays), ``index`` the example's row in the training
  split, and ``group_accuracy``: the fraction of the prompt's group that was correct.
  ``rewards_BG``: the rewards RL trained on (``rl.malformed_reward`` where the verifier could
  not parse), reported instead of the verifier's."""
  graded = verify_each(task, tokenizer, split.examples, completions_BGL[:, 0])
  records = generation_records(tokenizer, split, graded)
  for r, i, correct_G in zip(records, index_B, correct_BG):
    r.update(index=int(i), group_accuracy=float(np.mean(correct_G)))
  if rewards_BG is not None:
    for r, reward in zip(records, rewards_BG[:, 0]):
      r["reward"] = float(reward)
  return records


def evaluate_policy(graphdef, params, decoding: Decoding, split: Split, options: EvalOptions, *,
                    sample_fn=None) -> dict:
  """The held-out report of a policy on ``split``: greedy accuracy, and pass@k / sample
  accuracy / diversity from ``options.num_samples`` samples at ``options.temperature``;
  ``greedy_NL`` / ``graded``: the greedy completions and their :func:`verify_each` results.
  ``sample_fn``: a jitted greedy sampler to reuse (the greedy pass is then timed without
  compilation: ``greedy_seconds``)."""
  t0 = time.perf_counter()
  tok = decoding.tokenizer
  greedy_NL, graded = _greedy(graphdef, params, task=decoding.task, tokenizer=tok,
                              examples=split.examples, arrays=split.arrays,
                              cfg=decoding.sampler_cfg, batch_size=options.batch_size,
                              sample_fn=sample_fn, mesh=decoding.mesh, buckets=options.buckets)
  greedy = mean_scores(graded)
  greedy_seconds = time.perf_counter() - t0
  sampler_cfg = dataclasses.replace(decoding.sampler_cfg, temperature=options.temperature)
  sampled = sampled_metrics(
      make_sample_fn(graphdef, sampler_cfg, mask_id=tok.mask_id, eos_id=tok.eos_id,
                     mesh=decoding.mesh),
      params, task=decoding.task, tokenizer=tok, examples=split.examples, arrays=split.arrays,
      num_samples=options.num_samples, ks=options.pass_k, batch_size=options.batch_size,
      key=jax.random.fold_in(jax.random.key(options.seed), 7), buckets=options.buckets)
  return {"accuracy": greedy["accuracy"], "reward": greedy["reward"],
          "greedy_seconds": greedy_seconds, **sampled, "greedy_NL": greedy_NL, "graded": graded}
