"""Framework params → a Hugging Face checkpoint folder (safetensors + config.json), by the
tensor tables of :mod:`dllm_rl.models.hf` that import reads.

Export gathers one parameter at a time and writes safetensors files itself (header first,
then the data), in the byte layout ``safetensors`` uses (tensors sorted by dtype then name,
``{"format": "pt"}`` metadata), so an import → export round trip reproduces the original
file. In a multi-process run process 0 writes and every process gathers
(:class:`Process0Writes`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import struct
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx

from dllm_rl.errors import ConfigError
from dllm_rl.models.hf import (FAMILIES, ST_DTYPES, leaf_paths, lookup, model_config_from_hf,
                               tensor_table, to_hf)
from dllm_rl.models.hf_spec import TokenIds
from dllm_rl.models.transformer import ModelConfig, abstract_model
from dllm_rl.parallel.distributed import raise_agreed
from dllm_rl.paths import write_atomic

_ST_RANK = {code: i for i, code in enumerate(ST_DTYPES)}
_ST_CODE = {np.dtype(v).name: k for k, v in ST_DTYPES.items()}
# A multi-process export agrees on process 0's write failures at each file's start and then
# after about this many gathered bytes: a collective per agreement (~ms) rather than per tensor
# (15k tensors in an MoE); after a failure process 0 skips its writes and goes on gathering, so
# none waits on it, and the others learn of it within this many bytes.
_AGREE_EVERY_BYTES = 1 << 30


def _to_host(x: jax.Array) -> np.ndarray:
  if getattr(x, "is_fully_addressable", True):
    return np.asarray(x)
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


class Process0Writes:
  """Process 0's writes into the export folder ``out_dir``, each tried (the other processes
  skip them; none runs after process 0's first failure, and process 0 goes on taking part in
  the collectives). Every process calls :meth:`agree` at the same points (at each file's start,
  every ~1 GiB gathered, and after the last write): when process 0 failed, it raises its own
  error there (its traceback kept) and every other process a ConfigError naming ``--hf_dir``
  and the folder, so that none is left waiting in a collective for a process that stopped
  (one process: its error at the next :meth:`agree`)."""

  def __init__(self, out_dir: str):
    self.out_dir = out_dir
    self.primary = jax.process_index() == 0
    self.failure: Exception | None = None

  def __call__(self, write, *args, **kwargs):
    """``write(*args, **kwargs)`` in process 0 while nothing failed: its result, else None."""
    if not self.primary or self.failure is not None:
      return None
    try:
      return write(*args, **kwargs)
    except Exception as err:  # noqa: BLE001  (raised by agree(), in every process at once)
      self.failure = err
      return None

  def agree(self) -> None:
    raise_agreed(self.failure, ConfigError("--hf_dir", (
        f"process 0 failed to write the export folder {self.out_dir} (its own error says"
        " why); what it wrote there is incomplete: delete it before exporting there again")))


def _write_safetensors(path: str, entries: list, pure: dict, np_dtype,
                       writes: Process0Writes) -> None:
  """One safetensors file, header first, then tensor by tensor (a single gathered
  parameter on the host at a time), written by process 0 (``writes``); every process
  gathers, and agrees (``writes.agree()``) before the first gather and then every
  ``_AGREE_EVERY_BYTES`` gathered."""
  code = _ST_CODE[np.dtype(np_dtype).name]
  entries = sorted(entries, key=lambda e: (-_ST_RANK[code], e[0]))
  header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
  offset = 0
  for name, *_, shape in entries:
    size = math.prod(shape) * np.dtype(np_dtype).itemsize
    header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + size]}
    offset += size
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  f = writes(open, path, "wb")
  try:
    writes(lambda: f.write(struct.pack("<Q", len(blob)) + blob))
    since = None  # bytes gathered since the last agreement
    for t in entries:
      if since is None or since >= _AGREE_EVERY_BYTES:
        writes.agree()
        since = 0
      pieces = [to_hf(_to_host(lookup(pure, p.path) if p.index is None
                               else lookup(pure, p.path)[p.index]), p.kind) for p in t.parts]
      w = np.ascontiguousarray(pieces[0] if len(pieces) == 1 else np.concatenate(pieces),
                               dtype=np_dtype)
      since += w.nbytes
      writes(lambda: f.write(w.reshape(-1).view(np.uint8).data))
    if f is not None:
      writes(f.close)  # the buffer's last bytes: a full disk may show only here
  finally:
    if f is not None and not f.closed:
      with contextlib.suppress(OSError):  # the error that stopped the write is raised
        f.close()


def _write_json(path: str, value: dict) -> None:
  """``value`` as JSON at ``path``, whole or not at all (:func:`paths.write_atomic`): the
  export's last file, config.json, is what marks its folder as a finished checkpoint, so a
  failed write must not leave a partial one."""
  write_atomic(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


def config_differences(hf_config: dict, cfg: ModelConfig,
                       ids: TokenIds) -> list[tuple[str, Any, Any]]:
  """(field, config.json's value, the model's value) for each ModelConfig / TokenIds field
  where ``hf_config`` (a config.json) does not describe ``cfg`` / ``ids`` (dtypes, init,
  scan / remat, the MoE dispatch and LoRA adapter options aside)."""
  got_cfg, got_ids = model_config_from_hf(hf_config)
  got_cfg = dataclasses.replace(got_cfg, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                                init_std=cfg.init_std, scan_layers=cfg.scan_layers,
                                remat=cfg.remat, moe_dispatch=cfg.moe_dispatch,
                                lora_rank=cfg.lora_rank,  # adapters: not HF
                                lora_alpha=cfg.lora_alpha, lora_targets=cfg.lora_targets)
  return [(f.name, getattr(a, f.name), getattr(b, f.name))
          for a, b in ((got_cfg, cfg), (got_ids, ids)) for f in dataclasses.fields(a)
          if getattr(a, f.name) != getattr(b, f.name)]


def check_config(hf_config: dict, cfg: ModelConfig, ids: TokenIds) -> None:
  """ValueError listing each field where ``hf_config`` (a config.json) does not describe
  ``cfg`` / ``ids`` (:func:`config_differences`)."""
  diff = [f"{name}: config.json {want!r} vs model {got!r}"
          for name, want, got in config_differences(hf_config, cfg, ids)]
  if diff:
    raise ValueError("hf_config does not describe this model: " + "; ".join(diff))


def export_checkpoint(params: nnx.State, model_cfg: ModelConfig, token_ids: TokenIds,
                      family: str, out_dir: str, *, hf_config: dict | None = None,
                      max_shard_bytes: float = 5e9, dtype: str | None = None,
                      side_files: Callable[[str], None] | None = None) -> list[str]:
  """Writes ``params`` as an HF folder (safetensors + config.json); returns those files.

  Tensors keep the original HF names and torch layouts, stored in ``dtype``
  (default: the params' dtype). ``hf_config`` (e.g. the imported config.json)
  is written back with ``torch_dtype`` updated; it must describe ``model_cfg``
  and ``token_ids``. Without it a config.json is built from the family's keys.
  More than ``max_shard_bytes`` of tensors → ``model-0000i-of-0000n.safetensors``
  plus ``model.safetensors.index.json``. ``side_files(out_dir)``: writes the folder's
  other files (tokenizer, modeling code, records) after the tensors; config.json comes last,
  so that a folder with one is complete (a failed write leaves none: no loader reads it).
  In a multi-process run every process must call this (parameters are gathered
  collectively); process 0 writes, and a write failing there stops every process
  (:class:`Process0Writes`) at the next agreement.
  """
  if family not in FAMILIES:
    raise ValueError(f"unknown family {family!r}; supported: {sorted(FAMILIES)}")
  _, abstract = abstract_model(model_cfg)
  shapes, pure = nnx.to_pure_dict(abstract), nnx.to_pure_dict(params)
  entries = tensor_table(family, model_cfg, shapes)
  for path, want in leaf_paths(shapes):
    try:
      got = tuple(lookup(pure, path).shape)
    except (KeyError, IndexError, TypeError):
      raise ValueError(f"parameter {'/'.join(map(str, path))} is missing from params") from None
    if want != got:
      raise ValueError(f"parameter {'/'.join(map(str, path))} has shape {got}, "
                       f"the model config needs {want}")
  if len(list(leaf_paths(shapes))) != len(jax.tree_util.tree_leaves(pure)):
    raise ValueError("params hold leaves that the exported model does not use")
  dtype = dtype or np.dtype(jax.tree_util.tree_leaves(pure)[0].dtype).name
  if dtype not in _ST_CODE:
    raise ValueError(f"export dtype must be one of {sorted(_ST_CODE)}, got {dtype!r}")
  np_dtype = np.dtype(ST_DTYPES[_ST_CODE[dtype]])
  if hf_config is not None:
    check_config(hf_config, model_cfg, token_ids)
    config = dict(hf_config)
  else:
    config = FAMILIES[family].to_config(model_cfg, token_ids)
  # transformers >= 4.56 writes "dtype" where older versions wrote "torch_dtype"
  config["dtype" if "dtype" in config and "torch_dtype" not in config else "torch_dtype"] = dtype

  shards: list[list] = [[]]
  used = 0
  for e in entries:
    size = math.prod(e.shape) * np_dtype.itemsize
    if shards[-1] and used + size > max_shard_bytes:
      shards.append([])
      used = 0
    shards[-1].append(e)
    used += size
  n = len(shards)
  names = (["model.safetensors"] if n == 1 else
           [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])
  writes = Process0Writes(out_dir)
  writes(os.makedirs, out_dir, exist_ok=True)
  written = [os.path.join(out_dir, fname) for fname in names]
  for path, shard in zip(written, shards):
    _write_safetensors(path, shard, pure, np_dtype, writes)
  if n > 1:
    total = sum(math.prod(e.shape) for e in entries) * np_dtype.itemsize
    index = {"metadata": {"total_size": total},
             "weight_map": {e.name: f for f, s in zip(names, shards) for e in s}}
    written.append(os.path.join(out_dir, "model.safetensors.index.json"))
    writes(_write_json, written[-1], index)
  if side_files is not None:
    writes(side_files, out_dir)
  written.append(os.path.join(out_dir, "config.json"))
  writes(_write_json, written[-1], config)
  writes.agree()  # the others return once process 0 has written the whole folder
  return written
