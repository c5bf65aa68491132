"""The notes a run prints before anything compiles (``Context.notes``): what the config, the
checkpoint or the data make doubtful but not wrong (sequences past the checkpoint's length, a
sampler or block size unlike the model's own, test prompts that are training prompts,
repeated prompts, text the tokenizer cannot encode, a LoRA rank above what the adapters can
use). Each returns its lines, none when all is well."""

from __future__ import annotations

import numpy as np

from dllm_rl.models import lora, transformer
from dllm_rl.tasks.base import Task
from dllm_rl.tasks.prompts import chat_prompt


def length_notes(config, max_length: tuple[str, int] | None) -> list[str]:
  """A line when the run's sequences (``data.prompt_len + data.completion_len``) are longer
  than ``max_length`` (:func:`dllm_rl.models.hf.max_length` of ``model.hf_checkpoint``): RoPE
  runs past it, but no position there was trained."""
  p, c = config.data.prompt_len, config.data.completion_len
  if max_length is None or p + c <= max_length[1]:
    return []
  key, limit = max_length
  return [f"config.data.prompt_len + config.data.completion_len = {p} + {c} = {p + c} is longer"
          f" than model.hf_checkpoint's maximum sequence length {limit} ({key} in its"
          " config.json): RoPE runs past it, but the model was never trained there"]


def sampler_notes(config, model_cfg: transformer.ModelConfig) -> list[str]:
  """A line when a Dream model (its logit shift) decodes with the masked sampler: LLaDA's
  schedule and untempered confidences, not Dream's own ``diffusion_generate``."""
  if not model_cfg.logit_shift or config.model.block_size or config.sampler.kind == "dream":
    return []
  return ["a Dream model (its logit shift) with config.sampler.kind='masked' decodes"
          " with LLaDA's rules (an even schedule, untempered confidences);"
          " --config.sampler.kind=dream --config.sampler.block_len=<data.completion_len> is"
          " Dream's own diffusion_generate (configs/dream_tpu.py)"]


def family_notes(config, family: str | None) -> list[str]:
  """A line when an LLaDA2 checkpoint runs bidirectionally (``model.block_size`` 0): its
  official ``generate`` decodes it block-causally, in blocks of ``block_length`` (32), and
  config.json holds no block size to check against
  (:func:`dllm_rl.train.hf_source.check_block_size`)."""
  if family != "llada2" or config.model.block_size:
    return []
  return ["an LLaDA2 checkpoint with model.block_size=0 attends bidirectionally, while its"
          " official generate decodes it block-causally in blocks of 32:"
          " --config.model.block_size=32 --config.model.prompt_block_causal=true is that"
          " (configs/llada2_tpu.py)"]


def overlap_notes(task: Task, train: list, test: list) -> list[str]:
  """A line when test prompts are also training prompts (by the task's canonical string; a
  ``test_file`` that repeats ``train_file``, or data sets that share problems): the reported
  accuracy would not be held out. The generated tasks split by that string: never. The first
  shared prompt is named by its file:line, the earliest in the test file."""
  seen = {task.canonical(ex) for ex in train}
  shared = [ex for ex in _in_file_order(test) if task.canonical(ex) in seen]
  if not shared:
    return []
  return [f"{len(shared)} of the {len(test)} test prompts are also training prompts (the"
          f" first: {_where(shared[0])}): the test accuracy is not held out; check"
          " task.options.train_file and test_file"]


def duplicate_notes(task: Task, train: list, val: list, test: list) -> list[str]:
  """A line for each evaluation split that repeats prompts (by the task's canonical string; a
  data file with duplicated records, two files joined): the validation split's prompts that
  are also training prompts (both come from the train file), and each of the validation and
  test splits' prompts that repeat an earlier one of the same split, whose copies each count
  in its accuracy. The generated tasks' splits hold distinct instances: never."""
  notes, seen = [], {}
  for ex in _in_file_order(train):
    seen.setdefault(task.canonical(ex), ex)
  shared = [ex for ex in _in_file_order(val) if task.canonical(ex) in seen]
  if shared:
    earlier = seen[task.canonical(shared[0])]
    notes.append(f"{len(shared)} of the {len(val)} validation prompts are also training"
                 f" prompts (the first: {_where(shared[0])}, as {_where(earlier)}):"
                 " the train file repeats records, so the validation accuracy is not held out;"
                 " drop the duplicates from task.options.train_file")
  for name, examples in (("validation", val), ("test", test)):
    first, repeats = {}, []
    for ex in _in_file_order(examples):
      key = task.canonical(ex)
      if key in first:
        repeats.append((ex, first[key]))
      first.setdefault(key, ex)
    if repeats:
      ex, earlier = repeats[0]
      notes.append(f"{len(repeats)} of the {len(examples)} {name} prompts repeat another of the"
                   f" split (the first: {_where(ex)}, as {_where(earlier)}): each copy counts in"
                   f" the {name} accuracy; drop the duplicates from the data file")
  return notes


def unknown_token_notes(tokenizer, split: str, examples: list, encoded: dict, *,
                        answers: bool, system: str = "") -> list[str]:
  """A line when encoded prompts (and, ``answers``: answers, those SFT trains on) of the
  ``split`` hold the tokenizer's unknown token (:attr:`HFTokenizer.unk_id`; a byte-level BPE,
  like the built-in CharTokenizer, has none): characters its vocabulary lacks, silently lost.
  Counts the examples in one pass over ``encoded`` (``dllm_rl.train.context._encode``'s
  arrays) and names the first one in its file (file:line, else its prompt's start) with the
  characters it lacks (at most 8)."""
  unk = getattr(tokenizer, "unk_id", None)
  if unk is None or not examples:
    return []
  held = ((encoded["prompt_BP"] == unk) & encoded["prompt_valid_BP"]).any(-1)
  if answers:
    held |= (encoded["completion_BL"] == unk).any(-1)
  if not held.any():
    return []
  ex = _in_file_order([examples[i] for i in np.flatnonzero(held)])[0]
  texts = [chat_prompt(ex.prompt, tokenizer, system)] + [ex.answer] * answers
  chars = list(dict.fromkeys(c for text in texts for c in tokenizer.unknown_chars(text)))
  said = ", ".join(map(repr, chars[:8])) + (f" and {len(chars) - 8} more" * (len(chars) > 8))
  return [f"{int(held.sum())} of the {len(examples)} {split} examples hold the tokenizer's"
          f" unknown token (id {unk}) in their prompt{' or answer' * answers}: text its"
          f" vocabulary lacks, which the model never sees (the first: {_where(ex)}, lacking"
          f" {said or '?'}); replace those characters in the data"]


def _in_file_order(examples: list) -> list:
  """``examples`` sorted by where they were read (file, then line number), so that a note's
  "first" is the first in its file, not in the split's shuffled order; examples without a
  ``source`` (the generated tasks) keep their order, after those with one."""
  def key(ex):
    path, _, line = ex.source.rpartition(":")
    return (not ex.source, path, int(line) if line.isdigit() else 0)
  return sorted(examples, key=key)


def _where(example) -> str:
  """Where ``example`` comes from (file:line), else its prompt's start."""
  return example.source or repr(example.prompt[:60])


def lora_notes(model_cfg: transformer.ModelConfig) -> list[str]:
  """A line when ``lora.rank`` exceeds min(inputs, outputs) of an adapted projection
  (:func:`dllm_rl.models.lora.rank_bounds`): its update A·B cannot reach that rank, so the
  surplus only costs memory and lowers α/r."""
  if not model_cfg.lora_rank:
    return []
  bounds = lora.rank_bounds(transformer.abstract_model(model_cfg)[1])
  over = {name: b for name, b in sorted(bounds.items()) if model_cfg.lora_rank > b}
  if not over:
    return []
  said = ", ".join(f"{name} ({b})" for name, b in over.items())
  return [f"config.lora.rank={model_cfg.lora_rank} is above the rank the adapters of {said}"
          f" can use, min(inputs, outputs) of the weight: their update (α/r)·A·B cannot pass"
          f" it, so the surplus costs memory and lowers α/r; lora.rank={min(over.values())}"
          " or less uses all of it"]
