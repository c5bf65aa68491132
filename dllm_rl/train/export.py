"""A training run's checkpoint → a Hugging Face folder (``python -m dllm_rl.convert export
--workdir``) that ``dllm_rl.load_pretrained`` and ``model.hf_checkpoint`` read back.

The architecture and token ids come from the config saved in the checkpoint:

* a run started from ``model.hf_checkpoint`` (HF folder or ``convert import`` output): that
  folder's config.json (``torch_dtype`` updated) and its tokenizer / modeling / generation
  files are copied, so the export loads wherever the original did (``hf_source``,
  ``convert export --hf_source``: read from that folder instead, where the source moved);
* a run trained from scratch (built-in character tokenizer): a config.json of the family the
  model fits (block size 0: LLaDA; ``model.block_size`` > 0: SDAR; ``model.logit_shift``:
  Dream) and a ``tokenizer.json`` / ``tokenizer_config.json`` with the character tokenizer's
  exact ids (:meth:`dllm_rl.tasks.tokenizer.CharTokenizer.hf_files`), and for Dream a
  ``generation_config.json`` with those ids (``DreamModel.from_pretrained`` needs one). A model
  the family's config.json cannot describe (e.g. qk-norm in a bidirectional model, an explicit
  head_dim) is refused with the fields that differ.

Only the parameters are read (no optimizer state), placed on one device by default and
written by process 0 (``hf_export.export_checkpoint``). In a multi-process export
(``convert`` initialises ``jax.distributed`` from the DLLM_* / cluster environment, as
``dllm_rl.main`` does) they are split over every process's devices, each tensor gathered in
turn, and process 0 alone writes the folder; the others wait until it is written. A problem
with the output folders found in any process stops every process (:func:`agreed`), and so
does a write that fails in process 0 (a full disk), at the next agreement
(``hf_export.Process0Writes``). config.json is written last: a folder without one is an
unfinished export. ``dllm_rl_export.json`` records the run, phase and step (SFT steps, RL
rollout batches) the folder came from.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx

from dllm_rl import paths
from dllm_rl.errors import ConfigError
from dllm_rl.infra.checkpoint import LayoutMismatch
from dllm_rl.models import convert, hf, hf_export, lora, peft
from dllm_rl.models.transformer import ModelConfig, abstract_model
from dllm_rl.parallel.distributed import is_primary, raise_agreed
from dllm_rl.parallel.mesh import make_mesh, slice_count
from dllm_rl.tasks.tokenizer import CharTokenizer
from dllm_rl.train import lora_checkpoint, run_checkpoints
from dllm_rl.train.context import model_config
from dllm_rl.train.hf_source import checkpoint_folder, hf_model_config
from dllm_rl.train.run_checkpoints import AUTO, LATEST, CheckpointRef

PROVENANCE_FILE = "dllm_rl_export.json"  # never copied from a source (convert._SKIP)
PEFT_BASE_DIR = "base"  # in a PEFT folder: the base of a run trained from scratch or an import


class ExportSource(NamedTuple):
  """What the HF folder of a run is written from, besides the parameters."""

  model_cfg: ModelConfig
  token_ids: hf.TokenIds
  family: str
  hf_config: dict
  files: list[str]  # copied: the source's tokenizer / modeling files ...
  texts: dict[str, str]  # ... or written (name → text): the tokenizer of a run from scratch
  origin: str  # model.hf_checkpoint, or "scratch"


def scratch_family(model_cfg: ModelConfig, block_size: int) -> str:
  """The HF family a model trained from scratch is exported as."""
  if block_size:
    return "sdar"
  return "dream" if model_cfg.logit_shift else "llada"


def unreadable_source(err: ConfigError, hf_source: str | None) -> ConfigError:
  """``err`` (the run's source folder cannot be read) as export says it: on ``--hf_source``
  when that names the folder, else on ``model.hf_checkpoint`` with how to name another."""
  if hf_source:
    return ConfigError("--hf_source", err.message)
  return ConfigError(err.key, f"{err.message}. Export reads the run's source model there"
                     " (config.json, tokenizer files; a LoRA run's base weights): if it has"
                     " moved, pass --hf_source with the folder it is in now")


def run_source(config, hf_source: str | None = None) -> ExportSource:
  """The architecture, ids, config.json and side files of the run trained with ``config``;
  ``hf_source``: the folder to read a run's ``model.hf_checkpoint`` from instead."""
  m = config.model
  if m.hf_checkpoint:
    # the spec as the run stored it: a local folder, a gs:// folder or a hub id (staged /
    # fetched through the weights layer exactly as the run resolved it)
    spec = hf_source or m.hf_checkpoint
    try:
      folder = checkpoint_folder(spec)
      model_cfg, ids, family = hf_model_config(folder, m.dtype, m.param_dtype)
    except ConfigError as err:
      raise unreadable_source(err, hf_source) from err
    return ExportSource(model_cfg, ids, family, convert.source_hf_config(folder),
                        convert.source_files(folder), {}, spec)
  if hf_source:
    raise ConfigError("--hf_source", "the run was trained from scratch (no"
                      " model.hf_checkpoint): it has no source folder to read; leave it out")
  tokenizer = CharTokenizer()
  model_cfg = model_config(config, tokenizer.vocab_size)
  ids = hf.TokenIds(mask_id=tokenizer.mask_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id,
                    bos_id=None, block_size=m.block_size or None)
  family = scratch_family(model_cfg, m.block_size)
  hf_config = hf.FAMILIES[family].to_config(model_cfg, ids)
  diffs = hf_export.config_differences(hf_config, model_cfg, ids)
  if diffs:  # named as config keys, with the values config.json can hold
    key = {name: f"model.{name}" if name in m else name for name, _, _ in diffs}
    named = "; ".join(f"{key[name]}: config.json {want!r} vs model {got!r}"
                      for name, want, got in diffs)
    fix = " ".join(f"--config.{key[name]}={str(want).lower() if isinstance(want, bool) else want}"
                   for name, want, _ in diffs if name in m)
    raise ValueError(f"a model trained from scratch is exported as {family}, whose config.json"
                     f" cannot describe this one: {named}"
                     + (f"; a run trained with {fix} exports" if fix else ""))
  texts = tokenizer.hf_files()
  if family == "dream":  # DreamModel.from_pretrained reads it (an OSError when it is missing)
    texts["generation_config.json"] = json.dumps(
        {"bos_token_id": ids.bos_id, "eos_token_id": ids.eos_id, "pad_token_id": ids.pad_id,
         "mask_token_id": ids.mask_id}, indent=2) + "\n"
  return ExportSource(model_cfg, ids, family, hf_config, [], texts, "scratch")


def check_new_peft_dir(peft_dir: str, out_dir: str) -> None:
  """ConfigError on ``--peft_dir`` before anything is read or written: the export's own
  ``out_dir`` (or the ``base`` folder written in it), a file or a path under one, a folder that
  already holds an adapter or a model (an existing PEFT folder is never overwritten, and PEFT
  files are never added to a model folder, which transformers would then load as that
  adapter), its ``base`` folder included. A multi-process export refuses it first
  (:func:`export_run`)."""
  same = lambda a, b: os.path.realpath(a) == os.path.realpath(b)
  base_dir = os.path.join(peft_dir, PEFT_BASE_DIR)
  if same(peft_dir, out_dir) or same(base_dir, out_dir):
    raise ConfigError("--peft_dir", f"{peft_dir} is where --hf_dir {out_dir} goes: the merged"
                      " weights and the adapters need two folders")
  for name in (peft.CONFIG_FILE, peft.WEIGHTS_FILE):
    if os.path.exists(os.path.join(peft_dir, name)):
      raise ConfigError("--peft_dir", f"{peft_dir} already holds a PEFT adapter ({name});"
                        " use a new folder")
  for folder in (peft_dir, base_dir):
    try:
      convert.check_new_hf_dir(folder)
    except convert.OutputFolderError as err:
      raise ConfigError("--peft_dir", str(err)) from None


def agreed(failure: BaseException | None, flag: str, what: str) -> None:
  """:func:`dllm_rl.parallel.distributed.raise_agreed` of the export's ``failure``: every other
  process raises a ConfigError naming ``flag`` (``what`` failed in another process)."""
  raise_agreed(failure, ConfigError(flag, f"{what} failed in another process (its error says"
                                     " why); nothing was written"))


def export_mesh():
  """The mesh the parameters are restored onto: one device in a single process; in several,
  every device (``fsdp``; a copy per slice of a TPU multislice job, whose ``data`` axis must
  span its slices), so that each tensor is gathered to process 0 in turn."""
  if jax.process_count() == 1:
    return make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
  return make_mesh({"data": slice_count(jax.devices()), "fsdp": -1, "tensor": 1})


def check_outside_checkpoints(workdir: str, folders: dict[str, str | None]) -> None:
  """ConfigError naming the flag of each of ``folders`` (flag → path, None: not given) that
  lies in the run's ``checkpoints`` folder, which training manages: a step folder is deleted
  when it rotates out, and a new numbered folder there reads as a damaged newest step."""
  managed = os.path.realpath(os.path.join(workdir, "checkpoints"))
  for flag, folder in folders.items():
    if folder is None:
      continue
    path = os.path.realpath(folder)
    if os.path.commonpath([path, managed]) == managed:
      raise ConfigError(flag, f"{folder} lies in the run's checkpoints folder {managed}, which"
                        " training manages (its step folders are rotated out and a new one"
                        " reads as a damaged step); name a folder outside it")


def check_run_folder(workdir: str) -> None:
  """ConfigError on ``--workdir`` when it names no run folder: a path that does not exist or
  is a file, or a run's ``checkpoints`` folder (said with its run folder to pass instead)."""
  folder = paths.resolve(workdir)
  if not folder.exists():
    raise ConfigError("--workdir", f"{workdir} does not exist; name a training run's --workdir")
  if not folder.is_dir():
    raise ConfigError("--workdir", f"{workdir} is a file, not a run's folder")
  if (folder.name == "checkpoints" and not (folder / "checkpoints").exists()
      and any((folder / p).is_dir() for p in run_checkpoints.PHASES)):
    raise ConfigError("--workdir", f"{workdir} is a run's checkpoints folder: pass the run's"
                      f" folder, --workdir {folder.parent}")


def peft_base(origin: str) -> str:
  """The base a PEFT folder names (``base_model_name_or_path``) for a run whose source is
  ``origin``: a local folder as an absolute path (PEFT reads a relative one from the loading
  process's working directory, or else as a hub id); a hub id or gs:// URL as given."""
  return os.path.abspath(origin) if os.path.isdir(origin) else origin


def base_unloadable(origin: str) -> bool:
  """A LoRA run's base that transformers cannot load: a model trained from scratch (a seeded
  init, written nowhere) or a ``convert import`` folder (Orbax)."""
  return origin == "scratch" or (os.path.isdir(origin) and convert.is_imported(origin))


def write_peft_base(params, source: ExportSource, out_dir: str) -> str:
  """The base of LoRA ``params`` (adapters dropped, float32, as the run held it) as an HF
  folder ``out_dir``, config.json and tokenizer included, for a PEFT folder whose run's base
  transformers cannot load (:func:`base_unloadable`); returns its absolute path."""
  base = jax.tree.map(lambda x: x, abstract_model(source.model_cfg)[1])
  nnx.replace_by_pure_dict(base, lora.merge_pure(nnx.to_pure_dict(params), 0.0))
  hf_export.export_checkpoint(base, source.model_cfg, source.token_ids, source.family, out_dir,
                              hf_config=source.hf_config, dtype="float32",
                              side_files=lambda d: write_source_files(source, d, source.texts))
  return os.path.abspath(out_dir)


def write_source_files(source: ExportSource, out_dir: str, texts: dict[str, str]) -> None:
  """Beside the weights in ``out_dir``: the source's files copied (tokenizer, modeling code)
  and ``texts`` written (name → text)."""
  convert.copy_files(source.files, out_dir)
  for name, text in texts.items():
    with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
      f.write(text)


def restore_run_params(ref: CheckpointRef, config, model_cfg: ModelConfig, mesh, *,
                       fall_back: bool = False, base_key: str = "--hf_source"):
  """(the step read, parameters of checkpoint ``ref``, the model config they fit):
  ``model_cfg`` itself without LoRA; for a LoRA run, its adapters on the base rebuilt from the
  run's pointer and ``model_cfg`` with the run's ``lora`` section. ``fall_back``: as
  run_checkpoints.restore_params. A LoRA run's base whose weights changed since the adapters
  were trained is a ConfigError on ``base_key`` (lora_checkpoint.check_base)."""
  if "lora" not in config or not config.lora.rank:
    return (*run_checkpoints.restore_params(ref, model_cfg, mesh, fall_back=fall_back),
            model_cfg)
  lora_cfg = lora.configure(model_cfg, config.lora)
  base = lambda: lora_checkpoint.base_params(config, lora_cfg, mesh)
  return (*run_checkpoints.restore_params(ref, lora_cfg, mesh, base=base, fall_back=fall_back,
                                          config=config, base_key=base_key), lora_cfg)


def provenance(ref: CheckpointRef, source: ExportSource, dtype: str) -> dict[str, Any]:
  """The ``dllm_rl_export.json`` record of an export."""
  return {"workdir": os.path.abspath(ref.workdir), "phase": ref.phase, "step": ref.step,
          "step_unit": "rollout batches" if ref.phase == "rl" else "sft steps",
          "label": ref.label, "family": source.family, "source": source.origin, "dtype": dtype}


def export_run(workdir: str, out_dir: str, *, phase: str = AUTO, step: int = LATEST,
               dtype: str | None = None, max_shard_bytes: float = 5e9,
               mesh=None, peft_dir: str | None = None,
               hf_source: str | None = None) -> dict[str, Any]:
  """Checkpoint ``(phase, step)`` of the run in ``workdir`` (default: the newest phase's newest
  step) → HF folder ``out_dir``; returns timing stats and the checkpoint's label. ``hf_source``:
  the folder to read the run's ``model.hf_checkpoint`` from (config.json, tokenizer files, a
  LoRA run's base) when it has moved. Raises ConfigError (``out_dir`` holds a checkpoint, is
  a file or lies under one: named ``--hf_dir``), FileNotFoundError / NoCheckpoint (no such
  checkpoint, listing the saved ones), ValueError (a model the HF layout cannot describe; a
  ConfigError for a source that cannot be read, a ``peft_dir`` that is taken:
  :func:`check_new_peft_dir`, or a ``workdir`` that is no run's folder: :func:`check_run_folder`).
  In a multi-process export every process calls it (the module docstring); the folder checks' error
  stops them all."""
  if peft_dir is not None and jax.process_count() > 1:  # written from process 0's host arrays
    raise ConfigError("--peft_dir", "the PEFT folder is a single-process export"
                      f" ({jax.process_count()} processes here): export the merged --hf_dir"
                      " here, or the adapters from one process")
  failure = None
  try:
    try:
      convert.check_new_hf_dir(out_dir)
    except convert.OutputFolderError as err:
      raise ConfigError("--hf_dir", str(err)) from None
    if peft_dir is not None:
      check_new_peft_dir(peft_dir, out_dir)
    check_outside_checkpoints(workdir, {"--hf_dir": out_dir, "--peft_dir": peft_dir})
    check_run_folder(workdir)
  except ConfigError as err:
    failure = err
  agreed(failure, "--hf_dir", "the check of the export's folders")
  t0 = time.perf_counter()
  ref = run_checkpoints.find_checkpoint(workdir, phase, step)
  if ref is None:
    raise FileNotFoundError(f"no checkpoint to export under {os.path.join(workdir, 'checkpoints')}"
                            " (a training run writes checkpoints/sft or checkpoints/rl there)")
  mesh = mesh if mesh is not None else export_mesh()
  # the newest step asked for: a damaged one falls back to the step before (a warning); the
  # model (config) is the run's, whichever of its steps holds it
  fall_back = step == LATEST
  ref, config = run_checkpoints.read_train_config(ref, fall_back=fall_back)
  if peft_dir is not None and not ("lora" in config and config.lora.rank):
    # said before the parameters (of the whole model) are read
    raise ValueError(f"--peft_dir: {ref.label} is not a LoRA run (lora.rank = 0)")
  source = run_source(config, hf_source)
  trained_from = config.model.hf_checkpoint
  if hf_source:  # a LoRA run's base (lora_checkpoint.base_params) is read from there too
    config.model.hf_checkpoint = hf_source
  try:
    ref, params, run_cfg = restore_run_params(ref, config, source.model_cfg, mesh,
                                              fall_back=fall_back)
  except LayoutMismatch as err:  # another model (family, size) than the run's source
    if not hf_source:
      raise
    raise ConfigError("--hf_source", f"{hf_source} holds a {source.family} model that does not"
                      f" fit the parameters of {ref.label} (the run trained from"
                      f" {trained_from}): {err}") from err
  merged = params
  if run_cfg.lora_rank:  # merged HF weights: W + (alpha / rank)·A·B, folded in float32
    merged = lora.merge_adapters(params, run_cfg, abstract_model(source.model_cfg)[1])
  dtype = dtype or np.dtype(source.model_cfg.param_dtype).name  # default: as trained
  texts = {**source.texts,
           PROVENANCE_FILE: json.dumps(provenance(ref, source, dtype), indent=2) + "\n"}
  t1 = time.perf_counter()
  # process 0 writes; the others return once it has written the whole folder, or raise
  # with it when a write fails there (hf_export.Process0Writes)
  hf_export.export_checkpoint(merged, source.model_cfg, source.token_ids, source.family, out_dir,
                              hf_config=source.hf_config, max_shard_bytes=max_shard_bytes,
                              dtype=dtype,
                              side_files=lambda d: write_source_files(source, d, texts))
  t2 = time.perf_counter()
  # the adapters after the merged folder: a failure writing that (a full disk) leaves no
  # finished-looking PEFT folder whose merged --hf_dir is missing
  if peft_dir is not None and is_primary():
    del merged
    base = (write_peft_base(params, source, os.path.join(peft_dir, PEFT_BASE_DIR))
            if base_unloadable(source.origin) else peft_base(source.origin))
    peft.export_peft(nnx.to_pure_dict(params), run_cfg, source.family, peft_dir, base,
                     source.hf_config)
  return {"family": source.family, "label": ref.label,
          "bytes": convert.tensor_bytes(out_dir) if is_primary() else 0,  # its folder
          "restore_s": t1 - t0, "write_s": t2 - t1, "total_s": time.perf_counter() - t0}
