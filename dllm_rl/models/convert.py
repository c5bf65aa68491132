"""HF checkpoint conversion (LLaDA, SDAR, Dream, LLaDA2 MoE): import, export, compare. The
command line is :mod:`dllm_rl.convert` (``python -m dllm_rl.convert``).

An imported checkpoint (``CKPT_DIR``) holds:

* ``model.json`` — ``{"format": "dllm_rl.hf_import/1", "family": "llada"|"sdar"|"dream"|"llada2",
  "model_config": {ModelConfig fields; dtypes as names}, "token_ids": {TokenIds
  fields}, "hf_config": the original config.json, "source": HF_DIR}``;
* ``params/0/`` — the ``nnx.State`` of parameters, saved with
  :class:`dllm_rl.infra.checkpoint.Checkpointer` as step 0 (meta = the same dict);
* ``hf_extra/`` — the HF folder's other small files (tokenizer, modeling code,
  generation config), copied back by ``export``.

The trainer loads it with :func:`load_imported`, which restores every array
straight onto its sharding. :func:`compare_tensors` checks two HF folders byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dllm_rl.infra.checkpoint import Checkpointer
from dllm_rl.models import hf, hf_export
from dllm_rl.models.transformer import ModelConfig, abstract_params_sharded
from dllm_rl.parallel.mesh import make_mesh
from dllm_rl.tasks.hf_tokenizer import TOKENIZER_LAYOUTS, HFTokenizer

FORMAT = "dllm_rl.hf_import/1"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")
_EXTRA_MAX_BYTES = 100_000_000  # tokenizer / code / generation config, never weights
# not carried to an import or export: the config and index are written anew, and an export's
# record (dllm_rl.train.export.PROVENANCE_FILE) describes the run that wrote that folder only;
# a PEFT adapter's config (its weights are skipped as weights) would make transformers load
# the folder as that adapter on its base_model_name_or_path, not the folder's own weights
_SKIP = ("config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json",
         "dllm_rl_export.json", "adapter_config.json")


def tensor_bytes(hf_dir: str) -> int:
  """Bytes of the safetensors files of an HF folder."""
  files, _ = hf.tensor_index(hf_dir)
  return sum(os.path.getsize(f) for f in set(files.values()))


def _meta(cfg: ModelConfig, ids: hf.TokenIds, family: str, hf_config: dict, source: str) -> dict:
  model_config = dataclasses.asdict(cfg)
  model_config.update(dtype=np.dtype(cfg.dtype).name, param_dtype=np.dtype(cfg.param_dtype).name)
  return {"format": FORMAT, "family": family, "model_config": model_config,
          "token_ids": dataclasses.asdict(ids), "hf_config": hf_config,
          "source": os.path.abspath(source)}


def import_hf(hf_dir: str, out_dir: str, *, dtype: str = "float32", mesh=None) -> dict[str, Any]:
  """HF folder → imported checkpoint in ``out_dir``; returns timing stats. ``out_dir`` is
  checked before anything is read (:func:`check_new_import_dir`: an OutputFolderError)."""
  check_new_import_dir(out_dir)
  hf_config = hf.read_hf_config(hf_dir)
  problem = tokenizer_problem(hf_dir)
  if problem:  # weights alone have a documented use (load_pretrained's logits on token ids)
    logging.warning("%s", problem)
  t0 = time.perf_counter()
  cfg, ids, _, params, family = hf.load_checkpoint(hf_dir, mesh=mesh, dtype=dtype)  # LoadedModel
  jax.block_until_ready(params)
  t1 = time.perf_counter()
  meta = _meta(cfg, ids, family, hf_config, hf_dir)
  with Checkpointer(os.path.join(out_dir, "params"), keep=1,
                    async_save=False) as ckpt:
    ckpt.save(0, params, meta)
  copy_files(extra_files(hf_dir), os.path.join(out_dir, "hf_extra"))
  with open(os.path.join(out_dir, "model.json"), "w") as f:
    json.dump(meta, f, indent=2)
  return {"family": family, "bytes": tensor_bytes(hf_dir), "load_s": t1 - t0,
          "total_s": time.perf_counter() - t0}


def tokenizer_problem(hf_dir: str) -> str | None:
  """What an import of the HF folder ``hf_dir`` lacks when it holds no tokenizer files (none
  of ``hf_tokenizer.TOKENIZER_LAYOUTS``, those the tokenizer reads) and what that means; None
  when it holds them. Not an error: ``dllm_rl.load_pretrained`` reads weights alone (logits
  and ``generate`` on token ids); its ``model.tokenizer`` and a run from the folder
  (``model.hf_checkpoint``) need them."""
  if any(all(os.path.isfile(os.path.join(hf_dir, n)) for n in layout)
         for layout in TOKENIZER_LAYOUTS):
    return None
  looked = ", or ".join(" + ".join(layout) for layout in TOKENIZER_LAYOUTS)
  return (f"{hf_dir} holds no tokenizer files (looked for {looked}): the import holds the"
          " weights alone, which dllm_rl.load_pretrained reads for logits and generate on token"
          " ids, but its model.tokenizer and a run from it (model.hf_checkpoint) fail; copy the"
          " model's tokenizer files into the folder and import again")


class OutputFolderError(OSError):
  """An output folder that a conversion will not write, found before anything is read
  (:func:`check_new_folder` and the checks built on it). Raised as one of the two kinds below,
  so that a caller may catch FileExistsError / NotADirectoryError, and a command line this
  type alone to name its flag (``--out``: the source's own errors are not this)."""


class FolderTaken(OutputFolderError, FileExistsError):
  """The output folder is a file, or already holds a checkpoint."""


class FolderBlocked(OutputFolderError, NotADirectoryError):
  """A file stands on the way to the output folder."""


def check_new_folder(folder: str) -> None:
  """FolderTaken (a FileExistsError) when ``folder`` (an output folder to be made) is a file;
  FolderBlocked (a NotADirectoryError) when a file stands on the way to it."""
  if os.path.exists(folder) and not os.path.isdir(folder):
    raise FolderTaken(f"{folder} is a file, not a folder; name a new folder")
  above = os.path.dirname(os.path.abspath(folder))
  while not os.path.exists(above):
    above = os.path.dirname(above)
  if not os.path.isdir(above):
    raise FolderBlocked(f"{folder}: {above} is a file, not a folder")


def check_new_import_dir(out_dir: str) -> None:
  """FolderTaken (a FileExistsError) when ``out_dir`` already holds a checkpoint (imported,
  HF, or the ``params/`` of an import cut short before its model.json: its step would be kept
  and the new model.json written beside it, describing another model) or is a file;
  FolderBlocked (a NotADirectoryError) when a file stands on the way to it."""
  check_new_folder(out_dir)
  if os.path.exists(os.path.join(out_dir, "model.json")):
    raise FolderTaken(f"{out_dir} already holds an imported checkpoint; use a new folder")
  if os.path.exists(os.path.join(out_dir, "params")):
    raise FolderTaken(f"{out_dir} holds params/ without model.json: an unfinished import"
                      " (cut short, or its write failed); delete the folder or use a new one")
  if _holds_hf(out_dir):  # one folder, one checkpoint: which would load is not obvious
    raise FolderTaken(f"{out_dir} holds an HF checkpoint (config.json / safetensors); "
                      "import into a new folder")


def extra_files(hf_dir: str) -> list[str]:
  """The small files of an HF folder that are not weights or the config / index
  (tokenizer, modeling code, generation config, README), sorted."""
  out = []
  for name in sorted(os.listdir(hf_dir)):
    src = os.path.join(hf_dir, name)
    if (os.path.isfile(src) and name not in _SKIP and not name.endswith(_WEIGHT_SUFFIXES)
        and os.path.getsize(src) <= _EXTRA_MAX_BYTES):
      out.append(src)
  return out


def copy_files(files: list[str], out_dir: str) -> None:
  """Copy ``files`` into ``out_dir`` (created), keeping their names."""
  os.makedirs(out_dir, exist_ok=True)
  for src in files:
    shutil.copy2(src, os.path.join(out_dir, os.path.basename(src)))


def check_new_hf_dir(hf_dir: str) -> None:
  """FolderTaken (a FileExistsError) when ``hf_dir`` already holds an HF checkpoint (never
  overwritten), the tokenizer or generation files of one (:func:`read_beside_weights`: they
  would load with the export), or is a file; FolderBlocked (a NotADirectoryError) when a file
  stands on the way to it."""
  check_new_folder(hf_dir)
  if _holds_hf(hf_dir):
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):  # written last by an export
      raise FolderTaken(f"{hf_dir} holds *.safetensors without config.json: an unfinished"
                        " export (its write failed or was cut short); delete the folder or use"
                        " a new one")
    raise FolderTaken(f"{hf_dir} already holds an HF checkpoint; use a new folder")
  if os.path.isfile(os.path.join(hf_dir, "model.json")):
    raise FolderTaken(f"{hf_dir} holds a `convert import` checkpoint (model.json), which would"
                      " load instead of the export; use a new folder")
  stale = read_beside_weights(hf_dir)
  if stale:
    raise FolderTaken(f"{hf_dir} holds {', '.join(stale)}: read with the weights, a file that"
                      " another model left there would load with this export, which writes its"
                      " own model's files only; delete them or use a new folder")


# The files of an HF folder read with its weights (tokenizer, chat template, generation
# config; transformers' remote code), besides config.json and the safetensors: an export
# writes those of its own model, so one left in its folder by another model (one the export
# does not overwrite) would load with the export, e.g. a chat_template.jinja that wins over
# its tokenizer_config.json's template, or a tokenizer.json over its vocab.json + merges.txt.
READ_WITH_WEIGHTS = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                     "vocab.json", "merges.txt", "tokenizer.model", "special_tokens_map.json",
                     "added_tokens.json", "generation_config.json")
_CODE_PREFIXES = ("modeling_", "configuration_", "tokenization_", "generation_")


def read_beside_weights(folder: str) -> list[str]:
  """The files of ``folder`` that a loader reads beside an HF checkpoint's weights
  (:data:`READ_WITH_WEIGHTS`, and remote-code ``modeling_*.py`` files and the like), sorted;
  [] when the folder does not exist."""
  if not os.path.isdir(folder):
    return []
  return sorted(n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n)) and (
      n in READ_WITH_WEIGHTS or (n.endswith(".py") and n.startswith(_CODE_PREFIXES))))


def _holds_hf(folder: str) -> bool:
  return os.path.isdir(folder) and any(n.endswith(".safetensors") or n == "config.json"
                                       for n in os.listdir(folder))


class ImportedModel(NamedTuple):
  """A ``convert import`` folder loaded by :func:`load_imported`."""

  model_cfg: ModelConfig
  token_ids: hf.TokenIds
  graphdef: Any
  params: Any          # nnx.State placed on its shardings
  family: str
  hf_config: dict      # the source config.json


def is_imported(path: str) -> bool:
  """A folder written by ``python -m dllm_rl.convert import`` (Orbax params + model.json).
  ValueError for a folder that also holds an HF config.json: either could be meant."""
  meta = os.path.join(path, "model.json")
  if not os.path.isfile(meta):
    return False
  if os.path.isfile(os.path.join(path, "config.json")):
    raise ValueError(f"{path} holds two checkpoints: a `convert import` one ({meta}) and an HF"
                     f" one ({os.path.join(path, 'config.json')}); move one to its own folder")
  return True


def read_meta(ckpt_dir: str) -> dict[str, Any]:
  """The ``model.json`` of an imported folder (format checked): model_config, token_ids,
  family, hf_config, source."""
  path = os.path.join(ckpt_dir, "model.json")
  if not os.path.isfile(path):
    instead = (f"; {ckpt_dir} is an HF folder already (config.json)"
               if os.path.isfile(os.path.join(ckpt_dir, "config.json")) else
               hf.not_a_model(ckpt_dir))
    raise FileNotFoundError(f"{path} not found (not a folder written by `convert import`)"
                            + instead)
  with open(path) as f:
    meta = json.load(f)
  if meta.get("format") != FORMAT:
    raise ValueError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
  return meta


def source_hf_config(path: str) -> dict[str, Any]:
  """The config.json of an HF folder, or the copy in a ``convert import`` folder's model.json."""
  return read_meta(path)["hf_config"] if is_imported(path) else hf.read_hf_config(path)


def files_dir(path: str) -> str:
  """The folder of a checkpoint's tokenizer and modeling files: an HF folder itself, or the
  ``hf_extra/`` of a ``convert import`` folder."""
  return os.path.join(path, "hf_extra") if is_imported(path) else path


def load_tokenizer(path: str, ids: hf.TokenIds) -> HFTokenizer:
  """The tokenizer (and chat template) of the checkpoint at ``path`` (:func:`files_dir`) with
  its token ids, a missing pad id read as the EOS. FileNotFoundError / ValueError naming the
  problem (no tokenizer files; no EOS id in config.json)."""
  if ids.eos_id is None:
    raise ValueError(f"{path}: config.json names no EOS id, which the tokenizer needs")
  return HFTokenizer.from_dir(files_dir(path), mask_id=ids.mask_id, eos_id=ids.eos_id,
                              pad_id=ids.pad_id if ids.pad_id is not None else ids.eos_id)


def source_files(path: str) -> list[str]:
  """The tokenizer / modeling / README files that travel with a model: an HF folder's
  :func:`extra_files`, or the ``hf_extra/`` copies of a ``convert import`` folder."""
  if not is_imported(path):
    return extra_files(path)
  extra = files_dir(path)
  return sorted(os.path.join(extra, n) for n in os.listdir(extra)) if os.path.isdir(extra) else []


def load_imported(ckpt_dir: str, *, mesh=None, param_dtype: str | None = None,
                  meta: dict[str, Any] | None = None) -> ImportedModel:
  """An imported checkpoint → :class:`ImportedModel`, params restored onto
  ``param_shardings`` on ``mesh`` (default: one device), in ``param_dtype`` (default: the
  dtype they were imported in). ``meta``: its :func:`read_meta`, when already read."""
  meta = meta if meta is not None else read_meta(ckpt_dir)
  mc = dict(meta["model_config"])
  mc.update(dtype=jnp.dtype(mc["dtype"]).type,
            param_dtype=jnp.dtype(param_dtype or mc["param_dtype"]).type)
  if "lora_targets" in mc:  # a JSON list; ModelConfig is hashable (a static jit argument)
    mc["lora_targets"] = tuple(mc["lora_targets"])
  cfg, ids = ModelConfig(**mc), hf.TokenIds(**meta["token_ids"])
  mesh = mesh if mesh is not None else make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
  graphdef, target = abstract_params_sharded(cfg, mesh)
  with Checkpointer(os.path.join(ckpt_dir, "params"), keep=1,
                    async_save=False) as ckpt:
    params, _ = ckpt.restore(target, step=0)
  return ImportedModel(cfg, ids, graphdef, params, meta["family"], meta["hf_config"])


def export_hf(ckpt_dir: str, hf_dir: str, *, dtype: str | None = None,
              max_shard_bytes: float = 5e9) -> dict[str, Any]:
  """Imported checkpoint → HF folder ``hf_dir`` (config.json from the import)."""
  check_new_hf_dir(hf_dir)
  t0 = time.perf_counter()
  cfg, ids, _, params, family, hf_config = load_imported(ckpt_dir)
  t1 = time.perf_counter()
  hf_export.export_checkpoint(params, cfg, ids, family, hf_dir, hf_config=hf_config,
                              max_shard_bytes=max_shard_bytes, dtype=dtype,
                              side_files=lambda d: copy_files(source_files(ckpt_dir), d))
  t2 = time.perf_counter()
  return {"family": family, "bytes": tensor_bytes(hf_dir), "restore_s": t1 - t0,
          "write_s": t2 - t1, "total_s": time.perf_counter() - t0}


def compare_tensors(a_dir: str, b_dir: str) -> list[str]:
  """Differences between two HF folders' tensors (names, dtypes, shapes, bytes); [] = equal."""
  a_files, _ = hf.tensor_index(a_dir)
  b_files, _ = hf.tensor_index(b_dir)
  problems = [f"only in {a_dir}: {n}" for n in sorted(set(a_files) - set(b_files))]
  problems += [f"only in {b_dir}: {n}" for n in sorted(set(b_files) - set(a_files))]
  for name in sorted(set(a_files) & set(b_files)):
    with hf.open_safetensors(a_files[name]) as fa, hf.open_safetensors(b_files[name]) as fb:
      sa, sb = fa.get_slice(name), fb.get_slice(name)
      if (sa.get_dtype(), sa.get_shape()) != (sb.get_dtype(), sb.get_shape()):
        problems.append(f"{name}: {sa.get_dtype()}{sa.get_shape()} vs "
                        f"{sb.get_dtype()}{sb.get_shape()}")
      elif fa.get_tensor(name).tobytes() != fb.get_tensor(name).tobytes():
        problems.append(f"{name}: bytes differ")
  return problems


def source_dtype(hf_dir: str) -> str:
  """The dtype name of an HF folder's tensors (of its first tensor by name)."""
  files, _ = hf.tensor_index(hf_dir)
  name = sorted(files)[0]
  with hf.open_safetensors(files[name]) as f:
    return np.dtype(hf.ST_DTYPES[f.get_slice(name).get_dtype()]).name
