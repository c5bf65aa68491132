"""Host-side collation of examples into fixed-shape numpy batches, and a
deterministic, resumable batch iterator.

Layout (LLaDA SFT convention): prompts are left-padded with PAD so every prompt
ends at column P-1 and completions start at the same position; a completion is
the answer, one EOS, then EOS fill up to L. The EOS fill is a target (the model
learns to stop), so ``completion_valid_BL`` is True on it; it stays in the
batch for a future right-padding scheme.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Sequence

import numpy as np

from dllm_rl.tasks.base import Example
from dllm_rl.tasks.tokenizer import CharTokenizer


class TooLong(ValueError):
  """A prompt or answer that does not fit its config limit; ``key`` is that limit's key
  (``data.prompt_len`` / ``data.completion_len``), the key the user changes."""

  def __init__(self, key: str, message: str):
    self.key = key
    super().__init__(message)


def check_fit(what: str, lengths: Sequence[int], limit: int,
              examples: Sequence[Example], multiple: int = 1, steps: int = 0) -> None:
  """TooLong when a ``what`` ("prompt" or "answer": an answer takes one EOS more) of
  ``examples`` has more tokens (``lengths``) than ``limit``. It names the longest that does
  not fit, where it came from (its file and line, else its index), how many do not fit
  and the value of the key that fits them all: one run of the check tells the user the
  value to set, not only that the current one is too small. ``multiple`` (answers: the
  sampler's block length, which must divide ``data.completion_len``) rounds that value up;
  ``steps`` (answers: ``sampler.steps``, a multiple of the number of blocks) gets its own
  value when that one would not suit the suggested length (the same steps per block)."""
  eos = int(what == "answer")  # an answer is followed by one EOS
  key = "data.completion_len" if eos else "data.prompt_len"
  over = [b for b, n in enumerate(lengths) if n + eos > limit]
  if not over:
    return
  b = max(over, key=lambda i: lengths[i])  # the first of the longest
  n, ex = lengths[b], examples[b]
  fits = -(-(n + eos) // multiple) * multiple
  raise TooLong(key, f"{ex.source or f'example {b}'}: {what} has {n} tokens"
                f"{' + 1 EOS' if eos else ''} > {key}={limit} ({what}"
                f" {getattr(ex, what)[:40]!r}); {len(over)} of the {len(lengths)} {what}s"
                f" {'does' if len(over) == 1 else 'do'} not fit, this one is the longest:"
                f" {key}={fits} fits them all"
                + (f" (a multiple of sampler.block_len={multiple})" if multiple > 1 else "")
                + _steps_for(fits, limit, multiple, steps))


def _steps_for(length: int, limit: int, block_len: int, steps: int) -> str:
  """The ``sampler.steps`` a suggested completion length needs, when ``steps`` (fit for
  ``limit``) is not a multiple of its blocks: the same steps per block ("" otherwise)."""
  blocks = length // block_len
  if block_len <= 1 or steps <= 0 or steps % blocks == 0:
    return ""
  per_block = max(1, steps // max(limit // block_len, 1))
  return (f", with sampler.steps={blocks * per_block} ({per_block} per block: the steps must be"
          f" a multiple of its {blocks} blocks, and sampler.steps={steps} is not)")


def _check_no_mask(what: str, seqs: Sequence[Sequence[int]], examples: Sequence[Example],
                   tokenizer: CharTokenizer) -> None:
  """ValueError naming the first example whose ``what`` encodes to the mask id (its text
  holds the tokenizer's mask token): the samplers would take it for a position to fill and
  SFT would train the model to write it. The message quotes the token's text, since a
  config.json whose mask id is an ordinary token of the tokenizer beside it (the two from
  different models) puts it in plain text."""
  mask_id = tokenizer.mask_id
  for b, ids in enumerate(seqs):
    if mask_id in ids:
      ex = examples[b]
      text = tokenizer.decode([mask_id], stop_at_eos=False)
      raise ValueError(f"{ex.source or f'example {b}'}: the {what} holds the mask token (id"
                       f" {mask_id}, {text!r}) in {getattr(ex, what)[:60]!r}: a model reads it"
                       " as a position to fill; remove it from the data (where that text is"
                       " no mask token, model.hf_checkpoint's config.json names another"
                       " mask_token_id than its tokenizer's: files of two models?)")


def encode_examples(examples: Sequence[Example], tokenizer: CharTokenizer,
                    prompt_len: int, completion_len: int, *,
                    truncate_answers: bool = False,
                    completion_multiple: int = 1, sampler_steps: int = 0
                    ) -> dict[str, np.ndarray]:
  """Encodes examples into ``prompt_BP``, ``prompt_valid_BP``, ``completion_BL``,
  ``completion_valid_BL`` (int32 ids / bool masks; B = len(examples)).

  Raises :class:`TooLong` (:func:`check_fit`: the longest example's file and line or
  index, its length and the config key ``data.prompt_len`` / ``data.completion_len``)
  when a prompt, or an answer plus one EOS, does not fit; ValueError (its file and line)
  when one holds the tokenizer's mask token. ``truncate_answers``: cut
  answers to fit instead (runs that never train on them: RL and evaluation use only the
  prompts). ``completion_multiple``: what a fitting ``completion_len`` must be a multiple of
  (the sampler's block length), for the value the error suggests, and ``sampler_steps``
  the sampler's steps, which must suit it.
  """
  if prompt_len < 1 or completion_len < 1:
    raise ValueError(f"prompt_len and completion_len must be >= 1, got "
                     f"{prompt_len}, {completion_len}")
  n = len(examples)
  prompts = [tokenizer.encode(ex.prompt) for ex in examples]
  check_fit("prompt", [len(p) for p in prompts], prompt_len, examples)
  answers = [tokenizer.encode(ex.answer) for ex in examples]
  if truncate_answers:
    answers = [a[:completion_len - 1] for a in answers]
  check_fit("answer", [len(a) for a in answers], completion_len, examples,
            multiple=completion_multiple, steps=sampler_steps)
  for what, seqs in (("prompt", prompts), ("answer", answers)):
    _check_no_mask(what, seqs, examples, tokenizer)
  prompt_BP = np.full((n, prompt_len), tokenizer.pad_id, np.int32)
  prompt_valid_BP = np.zeros((n, prompt_len), bool)
  completion_BL = np.full((n, completion_len), tokenizer.eos_id, np.int32)
  completion_valid_BL = np.ones((n, completion_len), bool)
  for b, (p, a) in enumerate(zip(prompts, answers)):
    if p:
      prompt_BP[b, prompt_len - len(p):] = p
      prompt_valid_BP[b, prompt_len - len(p):] = True
    completion_BL[b, :len(a)] = a
  return {"prompt_BP": prompt_BP, "prompt_valid_BP": prompt_valid_BP,
          "completion_BL": completion_BL, "completion_valid_BL": completion_valid_BL}


def bucket_width(prompt_valid_BP: np.ndarray, buckets: Sequence[int]) -> int:
  """The smallest bucket (``data.prompt_buckets``) that holds every (left-padded)
  prompt of the batch; the full width P when none does."""
  p = prompt_valid_BP.shape[1]
  longest = int(prompt_valid_BP.sum(-1).max()) if prompt_valid_BP.size else 0
  return min([w for w in buckets if longest <= w <= p], default=p)


def trim_to_bucket(batch: Mapping[str, np.ndarray],
                   buckets: Sequence[int]) -> tuple[dict[str, np.ndarray], float]:
  """Drops left-padding columns so the prompts are ``bucket_width`` wide (one
  compiled program per bucket downstream). Returns the batch and the fraction of
  its prompt slots that are still padding."""
  valid = np.asarray(batch["prompt_valid_BP"])
  w = bucket_width(valid, buckets)
  if valid[:, :valid.shape[1] - w].any():
    raise ValueError("prompts must be left-padded to use data.prompt_buckets")
  out = dict(batch, prompt_BP=np.asarray(batch["prompt_BP"])[:, -w:], prompt_valid_BP=valid[:, -w:])
  return out, float(1.0 - out["prompt_valid_BP"].mean()) if valid.size else 0.0


class BatchIterator:
  """Infinite iterator of batches over arrays of shape [N, ...].

  Epoch e visits rows in ``default_rng([seed, e]).permutation(N)`` order in
  ``N // batch_size`` full batches (the remainder is dropped for that epoch).
  ``position`` is the number of batches served so far; constructing with
  ``position=k`` resumes exactly where an uninterrupted iterator would be after
  k batches, so checkpointing ``position`` is enough to resume the data stream.
  """

  def __init__(self, arrays: Mapping[str, np.ndarray], batch_size: int, seed: int,
               position: int = 0):
    if not arrays:
      raise ValueError("BatchIterator needs at least one array")
    sizes = {k: len(v) for k, v in arrays.items()}
    n = next(iter(sizes.values()))
    if any(s != n for s in sizes.values()):
      raise ValueError(f"arrays have different leading sizes: {sizes}")
    if not 1 <= batch_size <= n:
      raise ValueError(f"batch_size must be in [1, N={n}], got {batch_size}")
    if seed < 0 or position < 0:
      raise ValueError(f"seed and position must be >= 0, got {seed}, {position}")
    self.arrays = {k: np.asarray(v) for k, v in arrays.items()}
    self.num_rows = n
    self.batch_size = int(batch_size)
    self.seed = int(seed)
    self.position = int(position)
    self.batches_per_epoch = n // self.batch_size
    self._perm_epoch = -1
    self._perm = np.arange(0)

  @property
  def epoch(self) -> int:
    """Epoch of the next batch."""
    return self.position // self.batches_per_epoch

  def indices(self, position: int) -> np.ndarray:
    """Row indices of batch number ``position`` (pure function of seed and position)."""
    epoch, k = divmod(position, self.batches_per_epoch)
    if epoch != self._perm_epoch:
      self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)
      self._perm_epoch = epoch
    return self._perm[k * self.batch_size:(k + 1) * self.batch_size]

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    idx = self.indices(self.position)
    self.position += 1
    return {k: v[idx] for k, v in self.arrays.items()}
