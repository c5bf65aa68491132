"""Builds what every mode needs from a validated config: task, data, model, I/O.

A Hugging Face checkpoint is read by :mod:`dllm_rl.train.hf_source`; the notes printed before
anything compiles come from :mod:`dllm_rl.train.run_notes`."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from dllm_rl import tasks as tasks_lib
from dllm_rl.config import ConfigError
from dllm_rl.config.choices import RL_MODES, SFT_MODES
from dllm_rl.errors import raise_all
from dllm_rl.models import lora, transformer
from dllm_rl.models.transformer import init_params_sharded
from dllm_rl.parallel.mesh import make_mesh
from dllm_rl.parallel.rules import batch_size_divisor
from dllm_rl.parallel.shard import put_global
from dllm_rl.sampling.block_sampler import BlockSamplerConfig
from dllm_rl.sampling.configs import sampler_config
from dllm_rl.sampling.sampler import SamplerConfig
from dllm_rl.tasks import data as data_lib
from dllm_rl.tasks.base import Task
from dllm_rl.tasks.jsonl_base import NoRecords
from dllm_rl.tasks.prompts import chat_prompt
from dllm_rl.train.checkpoint_choice import PHASES
from dllm_rl.train.evaluation import Decoding, EvalOptions, Split
from dllm_rl.train.hf_source import (check_local_source, checkpoint_folder, hf_run_options,
                                     load_hf_params, load_hf_source)
from dllm_rl.train.run_notes import (duplicate_notes, family_notes, length_notes, lora_notes,
                                     overlap_notes, sampler_notes, unknown_token_notes)


@dataclasses.dataclass
class Context:
  """What every mode needs from a validated config, built once by :func:`build_context`:
  the task and its encoded splits, the tokenizer, typed per-component options (model,
  sampler, evaluation) and the mesh. No compilation has happened yet."""

  config: ml_collections.ConfigDict
  workdir: str
  task: Task
  tokenizer: Any  # CharTokenizer | HFTokenizer: encode, decode, mask_id, eos_id, pad_id
  model_cfg: transformer.ModelConfig
  sampler_cfg: SamplerConfig | BlockSamplerConfig
  eval_options: EvalOptions
  train: Split
  val: Split
  test: Split
  mesh: Mesh
  hf_checkpoint: str | None = None
  notes: tuple[str, ...] = ()  # warnings to print before anything compiles (train/modes.py)
  writers: tuple = ()  # metric writers beside metrics.jsonl and TensorBoard (W&B; train/modes.py)

  @property
  def decoding(self) -> Decoding:
    """Task, tokenizer, sampler config and mesh: what evaluation needs."""
    return Decoding(self.task, self.tokenizer, self.sampler_cfg, self.mesh)


def model_config(config, vocab_size: int) -> transformer.ModelConfig:
  """``config.model`` with the vocabulary resolved against the tokenizer."""
  model = config.model.to_dict()
  if model["vocab_size"] == 0:
    model["vocab_size"] = vocab_size
  elif model["vocab_size"] < vocab_size:
    raise ConfigError("model.vocab_size",
                      f"{model['vocab_size']} is smaller than the tokenizer's {vocab_size}")
  return transformer.ModelConfig.from_config(model)


def char_tokenizer_problem(task: Task, tokenizer, examples) -> str | None:
  """Why ``tokenizer``, the built-in CharTokenizer of a run without model.hf_checkpoint,
  cannot encode ``examples`` of a task whose text comes from files (``task.char_text``
  False): such a task needs the model's own tokenizer, which only model.hf_checkpoint
  gives, and the message says so, naming the first character it lacks and where it is
  (file:line) rather than quoting the text (an answer, maybe). None when every character
  encodes (a Countdown file may), or for a built-in task, whose text is written in the
  vocabulary (an unknown character there keeps the tokenizer's own message)."""
  if task.char_text:
    return None
  for b, ex in enumerate(examples):
    for what in ("prompt", "answer"):
      char = tokenizer.unknown(getattr(ex, what))
      if char is not None:
        return (f"task {task.name!r} needs a real tokenizer, the one of model.hf_checkpoint"
                " (set it to the model's folder, gs:// URL or hub id): without it the run"
                " uses the built-in CharTokenizer, made for the generated tasks, which has"
                f" no {char!r} (the {what} of {ex.source or f'example {b}'})")
  return None


def _encode(examples, tokenizer, config, split: str) -> dict:
  from jinja2.exceptions import TemplateError

  system = config.data.system_prompt
  try:  # the chat template of a HF tokenizer; data.system_prompt
    examples = [dataclasses.replace(ex, prompt=chat_prompt(ex.prompt, tokenizer, system))
                for ex in examples]
  except TemplateError as err:
    if not system:  # the template's raise_exception, an undefined name, the sandbox
      raise ConfigError("model.hf_checkpoint", f"its chat template fails on a prompt of the"
                        f" {split} split of task {config.task.name!r} (one user turn):"
                        f" {type(err).__name__}: {err} (data.system_prompt gives each prompt a"
                        " system turn)") from err
    raise ConfigError("data.system_prompt", f"the chat template of model.hf_checkpoint "
                      f"rejects a system turn: {err}") from err
  try:
    return data_lib.encode_examples(
        examples, tokenizer, config.data.prompt_len, config.data.completion_len,
        # only SFT trains on answers, those of the train split (validation and test: prompts)
        truncate_answers=split != "train" or config.mode not in SFT_MODES,
        # data.completion_len is a multiple of the block length (Dream's one block: its length)
        completion_multiple=1 if config.sampler.kind == "dream" else config.sampler.block_len,
        sampler_steps=config.sampler.steps)
  except data_lib.TooLong as err:  # named by the key to change, data.prompt_len / completion_len
    raise ConfigError(err.key, f"{split} split of task {config.task.name!r}: {err}") from err
  except ValueError as err:
    raise ConfigError("data", f"{split} split of task {config.task.name!r}: {err}") from err


def expert_axis_problem(expert: int, n_experts: int, *, known: bool = True) -> str | None:
  """Why ``mesh.expert`` cannot split a model of ``n_experts`` experts (None when it can;
  ``known`` = False: the model's experts are not known yet, only the value is checked)."""
  if not isinstance(expert, int) or expert < 1:
    return f"must be a positive integer (no -1 fill: it must divide the experts), got {expert}"
  if expert == 1 or not known:
    return None
  if n_experts == 0:
    return f"{expert} > 1 splits experts, but the model is dense (no MoE layers): leave 1"
  if n_experts % expert:
    return f"{expert} must divide the model's {n_experts} experts (choose a divisor)"
  return None


def check_expert_axis(config, model_cfg) -> None:
  """:func:`expert_axis_problem` for the resolved model (a HF checkpoint's experts too)."""
  problem = expert_axis_problem(config.mesh.get("expert", 1), model_cfg.n_experts)
  if problem:
    raise ConfigError("mesh.expert", problem)


def check_lora_targets(model_cfg) -> None:
  """``lora.targets`` that adapt nothing in the resolved model (``lora.configure`` applied):
  a ConfigError (:func:`dllm_rl.models.lora.targets_problem`)."""
  problem = lora.targets_problem(model_cfg)
  if problem:
    raise ConfigError("lora.targets", problem)


def _ep(mesh) -> str:
  return " × expert" if dict(mesh.shape).get("expert", 1) > 1 else ""


def check_batch_sizes(config, mesh) -> None:
  """Every global batch of ``config.mode`` must split evenly over the batch axes (data ×
  fsdp × expert): the SFT batch (``data.batch_size``) in SFT modes, the RL ones in RL modes
  (a key the mode never reads is not checked), ``eval.batch_size`` always."""
  div = batch_size_divisor(mesh)
  sft, rl = config.mode in SFT_MODES, config.mode in RL_MODES
  errors = []
  for key in ("data.batch_size",) * sft + ("rl.batch_prompts",) * rl + ("eval.batch_size",):
    section, name = key.split(".")
    value = config[section][name]
    if value % div:
      errors.append(ConfigError(key, f"{value} is not a multiple of mesh data × fsdp{_ep(mesh)}"
                                f" = {div} (mesh {dict(mesh.shape)})"))
  if rl and config.rl.micro_batch % div:
    errors.append(ConfigError(
        "rl.micro_batch", f"{config.rl.micro_batch} sequences per micro-batch do not split over"
        f" mesh data × fsdp{_ep(mesh)} = {div} (mesh {dict(mesh.shape)})"))
  raise_all(errors)  # all at once: one rerun fixes them


def task_options(config) -> dict:
  """``config.task.options`` as the run builds its task from them. ``mode=eval`` reads the
  test split only, so beside a ``test_file`` the ``train_file`` is left out: never loaded
  nor checked (a bad or huge train file neither stops nor slows an evaluation). Without a
  ``test_file`` the test split is carved out of the train file, which is then read."""
  options = config.task.options.to_dict()
  if config.mode == "eval" and options.get("test_file") and options.get("train_file"):
    del options["train_file"]
  return options


def _generate(task, split: str, n: int, seed: int, key: str, asked: str):
  """``task.generate``; too few examples (a small data file, a generated task's options that
  make fewer distinct instances) → a ConfigError naming the size keys and what else to change
  (``Task.enlarge_hint``)."""
  try:
    return task.generate(split, n, seed)
  except NoRecords as err:  # an empty data file: no smaller size helps
    raise ConfigError(f"task.options.{err.option}", f"{err}; give a file with records") from err
  except ValueError as err:
    raise ConfigError(key, f"{err} ({asked}): lower it or {task.enlarge_hint()}") from err


def check_writable(workdir: str) -> None:
  """A ConfigError naming ``--workdir`` when a file cannot be created in the local folder
  ``workdir`` (no rights, a read-only mount): before anything is read or compiled, not as a
  traceback at the first write. A URL is not probed."""
  from dllm_rl import paths
  if paths.is_url(workdir):
    return
  import tempfile
  try:
    fd, probe = tempfile.mkstemp(prefix=".write_probe", dir=paths.resolve(workdir))
    os.close(fd)
    os.remove(probe)
  except OSError as err:
    raise ConfigError("--workdir", f"{workdir}: cannot write in it ({err})") from None


# where the phases keep their checkpoints (train/phases.py: checkpoint_dir)
CHECKPOINT_FOLDERS = ("checkpoints", *(f"checkpoints/{phase}" for phase in PHASES))


def check_checkpoint_folders(workdir: str) -> None:
  """A ConfigError naming ``--workdir`` when ``workdir/checkpoints`` or a phase's folder in it
  is a file (a stray copy, a mistaken ``> checkpoints/rl``): before anything is read or
  compiled. Else the phase trained until its first save, which then failed (every step since
  the start lost), and a reader took the file for "no checkpoint". A URL is not probed."""
  from dllm_rl import paths
  if paths.is_url(workdir):
    return
  for name in CHECKPOINT_FOLDERS:
    path = os.path.join(paths.resolve(workdir), name)
    if os.path.lexists(path) and not os.path.isdir(path):
      raise ConfigError("--workdir", f"{path} is a file, not a folder: the run keeps its"
                        " checkpoints there (checkpoints/<phase>/<step>/); move the file"
                        " away, or use another --workdir")


def prepare_workdir(config, workdir: str):
  """The part of :func:`build_context` that reads no data: the mesh (returned), the checks it
  needs no data for (batch sizes over the mesh, the kernel's backend, a local
  ``model.hf_checkpoint``'s config.json), then ``workdir`` made and probed for writing (a
  uniquely named file, removed at once) and its checkpoint folders checked (no file there).
  Nothing else is written there, so a training run takes the workdir's lock (train/modes.py)
  right after it, before the task data and the HF source are read."""
  try:
    mesh = make_mesh(config.mesh)
  except ValueError as err:
    raise ConfigError("mesh", str(err)) from err
  check_batch_sizes(config, mesh)
  if config.model.block_size > 0 and config.mode != "eval":  # the block ELBO's kernel
    from dllm_rl.kernels.staircase import default_block_sizes
    try:  # the kernel's own rule for this process's backend (pallas needs a GPU or TPU)
      default_block_sizes(config.estimator.attention_impl)
    except ValueError as err:
      raise ConfigError("estimator.attention_impl", str(err)) from None
  from dllm_rl import paths
  paths.check_backend(workdir)  # gs:// without gcsfs: a named error, nothing created
  check_local_source(config.model)
  try:
    paths.resolve(workdir).mkdir(parents=True, exist_ok=True)  # gs:// stays a URL
  except (FileExistsError, NotADirectoryError) as err:  # a file, or a file on the way to it
    raise ConfigError("--workdir", f"{workdir} is not a folder: {err}") from None
  except OSError as err:  # no such parent on a read-only or virtual file system, no rights
    raise ConfigError("--workdir", f"{workdir}: cannot create it ({err})") from None
  check_writable(workdir)
  check_checkpoint_folders(workdir)
  return mesh


def build_context(config, workdir: str, mesh=None) -> Context:
  """Generate the task data (host side), build the mesh and resolve static
  configs; no compilation. ``mesh``: that :func:`prepare_workdir` returned (None: it runs
  here)."""
  if mesh is None:
    mesh = prepare_workdir(config, workdir)
  task = tasks_lib.make_task(config.task.name, **task_options(config))
  hf = checkpoint = None
  if config.model.hf_checkpoint:
    m = config.model
    checkpoint = checkpoint_folder(m.hf_checkpoint)
    hf = load_hf_source(checkpoint, m.dtype, m.block_size, param_dtype=m.param_dtype,
                        **hf_run_options(m))
    tokenizer = hf.tokenizer
  else:
    tokenizer = tasks_lib.CharTokenizer()
  t = config.task
  errors: list[ConfigError] = []  # both splits' sizes checked, then reported together

  def generate(*args):
    try:
      return _generate(task, *args)
    except ConfigError as err:
      errors.append(err)
      return []

  train = val = []  # eval reads the test split only (a test-only task such as MATH-500 works)
  if config.mode != "eval":
    train = generate("train", t.train_size + t.val_size, config.seed, "task.train_size",
                     f"task.train_size + task.val_size = {t.train_size} + {t.val_size}")
    train, val = train[:t.train_size], train[t.train_size:]
  test = generate("test", t.test_size, config.seed + 1, "task.test_size",
                  f"task.test_size = {t.test_size}")
  raise_all(errors)
  if hf is None:  # the CharTokenizer: a task read from files needs model.hf_checkpoint's
    problem = char_tokenizer_problem(task, tokenizer, [*train, *val, *test])
    if problem:
      raise ConfigError("model.hf_checkpoint", problem)
  model_cfg = hf.model_cfg if hf else model_config(config, tokenizer.vocab_size)
  check_expert_axis(config, model_cfg)
  model_cfg = lora.configure(model_cfg, config.lora)
  check_lora_targets(model_cfg)
  notes = (length_notes(config, hf.max_length if hf else None) + lora_notes(model_cfg)
           + sampler_notes(config, model_cfg) + family_notes(config, hf.family if hf else None)
           + overlap_notes(task, [*train, *val], test) + duplicate_notes(task, train, val, test))
  splits = {}
  for name, examples in (("train", train), ("validation", val), ("test", test)):
    try:  # every split's, at once: each names the value that fits it (a too-short
      # data.prompt_len once named the train split's fit, then failed on the test split)
      splits[name] = Split(examples, _encode(examples, tokenizer, config, name))
    except ConfigError as err:
      errors.append(err)
      continue
    notes += unknown_token_notes(  # the answers SFT trains on: the train split's (_encode)
        tokenizer, name, examples, splits[name].arrays, system=config.data.system_prompt,
        answers=name == "train" and config.mode in SFT_MODES)
  raise_all(errors)
  return Context(
      config=config, workdir=workdir, task=task, tokenizer=tokenizer,
      model_cfg=model_cfg,
      sampler_cfg=sampler_config(config), eval_options=EvalOptions.from_config(config),
      train=splits["train"], val=splits["validation"], test=splits["test"], mesh=mesh,
      hf_checkpoint=checkpoint, notes=tuple(notes))


def init_params(ctx: Context):
  """Starting (graphdef, params), placed in their shardings, stored in
  ``model.param_dtype``: the HF checkpoint's weights (streamed tensor by tensor
  onto the mesh) or a fresh init from the seed. With LoRA (``lora.rank`` > 0) the base is
  stored in ``lora.base_dtype`` and fresh adapters (B = 0) are added to a HF base."""
  key = jax.random.fold_in(jax.random.key(ctx.config.seed), 0)
  if ctx.hf_checkpoint:
    graphdef, params = load_hf_params(ctx.hf_checkpoint, ctx.model_cfg, ctx.mesh)
    if ctx.model_cfg.lora_rank:
      params = nnx.merge_state(params, transformer.init_adapters_sharded(ctx.model_cfg, key,
                                                                         ctx.mesh))
    return graphdef, params
  return init_params_sharded(ctx.model_cfg, key, ctx.mesh)


def frozen_base(ctx: Context) -> nnx.State:
  """A LoRA run's frozen base (its adapters left out), as :func:`init_params` builds it: the
  base a LoRA checkpoint's adapters are put on (``run_checkpoints.restore_params``)."""
  return lora.split_adapters(init_params(ctx)[1])[1]


def to_device(ctx: Context, global_batch: dict, cls):
  """A global numpy batch (identical on every process) → the batch pytree, sharded over the
  batch axes: each device takes its own rows of it (``put_global``), whatever the mesh's device
  order. (Each process passing the contiguous block ``host_rows`` names assumed that a
  process's devices hold one such block: a ``tensor`` axis across processes replicates rows on
  several of them, which then passed different rows for the same replicas.)"""
  return put_global(ctx.mesh, cls(**{k: np.asarray(v) for k, v in global_batch.items()}))
