"""Hugging Face checkpoints ⇄ :class:`~dllm_rl.models.transformer.Transformer` params.

Supported families (detected from ``config.json`` ``architectures`` / ``model_type``):

* ``"llada"`` — ``LLaDAModelLM`` (GSAI-ML LLaDA-8B, OLMo-style names
  ``model.transformer.{wte, blocks.i.*, ln_f, ff_out}``), bidirectional.
* ``"sdar"`` — ``SDARForCausalLM`` (JetLM SDAR, Qwen3-style names
  ``model.{embed_tokens, layers.i.*, norm}``, ``lm_head``) with qk-norm; the
  caller passes the block-causal mask (``block_size`` in :class:`TokenIds`).
* ``"dream"`` — ``DreamModel`` (Dream-org Dream-v0 7B, DiffuCoder; Qwen2-style
  names) with q/k/v biases, bidirectional, and the logit shift (raw row i
  scores token i + 1; ``ModelConfig.logit_shift``, dllm_rl.models.transformer).
* ``"llada2"`` — ``LLaDA2MoeModelLM`` (inclusionAI LLaDA2.0 / 2.1-mini, model_type
  ``llada2_moe``): qk-norm, partial RoPE, fused q|k|v, dense first layers then
  mixture-of-experts layers (dllm_rl.models.moe); block-causal mask from the caller.

Layouts: HF stores torch ``(out, in)`` matrices. The framework stores
``x @ W`` kernels with heads split out: q ``[D, H, Q]``, k/v ``[D, K, Q]``,
o ``[H, Q, D]``, gate/up ``[D, F]``, down ``[F, D]``, lm_head ``[D, V]``, q bias
``[H, Q]``, k/v biases ``[K, Q]``. Every mapping is one of four kinds: ``copy``
(embeddings, norm scales), ``in`` (HF ``(prod(rest), D0)`` →
``W.T.reshape(D0, *rest)``), ``out`` (HF ``(Dlast, prod(rest))`` →
``W.T.reshape(*rest, Dlast)``) and ``flat`` (HF ``(prod(shape),)`` →
``b.reshape(shape)``: the per-head biases). Usually one HF tensor
is one parameter; a :class:`Part` list also describes an HF tensor that is the row
concatenation of several parameters (LLaDA2's fused ``query_key_value`` = q | k | v)
and one expert ``[e]`` of a stacked ``[E, ...]`` parameter (LLaDA2's per-expert
tensors); the same table drives import and export.

Loading streams tensor by tensor: every name and shape is checked from the
safetensors headers first, then each tensor is read, viewed in the framework
layout and placed straight onto its sharding (each device copies only its
slice), so the model is never held twice in host memory. Export (the same tables, the
other way): :mod:`dllm_rl.models.hf_export`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from typing import Any, NamedTuple

import jax
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open

from dllm_rl.models import hf_dense, hf_llada2
from dllm_rl.models.hf_spec import COPY, FLAT, IN, OUT, Family, Part, TokenIds
from dllm_rl.models.transformer import ModelConfig, abstract_model
from dllm_rl.parallel.mesh import make_mesh
from dllm_rl.parallel.shard import param_shardings
from dllm_rl.paths import is_url
from dllm_rl.types import DTYPES

# safetensors dtype code → numpy dtype; the order is safetensors' own (files are
# sorted by dtype, highest first, then by name).
ST_DTYPES = {"F16": np.float16, "BF16": ml_dtypes.bfloat16, "F32": np.float32, "F64": np.float64}


class LoadedModel(NamedTuple):
  """A Hugging Face checkpoint loaded by :func:`load_checkpoint`."""

  model_cfg: ModelConfig
  token_ids: "TokenIds"
  graphdef: Any
  params: Any          # nnx.State placed on its shardings
  family: str          # "llada" | "sdar" | "dream" | "llada2"


FAMILIES: dict[str, Family] = {"llada": hf_dense.LLADA, "sdar": hf_dense.SDAR,
                                "dream": hf_dense.DREAM, "llada2": hf_llada2.FAMILY}


def detect_family(hf_config: dict) -> str:
  """The family name from ``architectures`` (first match), else ``model_type``."""
  archs = hf_config.get("architectures") or []
  for fam in FAMILIES.values():
    if fam.architecture in archs:
      return fam.name
  for fam in FAMILIES.values():
    if hf_config.get("model_type") == fam.model_type:
      return fam.name
  supported = ", ".join(f"{f.architecture} (model_type {f.model_type!r})"
                        for f in FAMILIES.values())
  raise ValueError(f"unsupported architecture: config.json has architectures={archs!r}, "
                   f"model_type={hf_config.get('model_type')!r}; supported: {supported}")


def model_config_from_hf(hf_config: dict, *, dtype: str = "float32",
                         param_dtype: str | None = None) -> tuple[ModelConfig, TokenIds]:
  """(ModelConfig, TokenIds) for a checkpoint's config.json. ``dtype`` is the compute
  dtype, ``param_dtype`` (default: ``dtype``) the storage dtype of the loaded params."""
  for name in (dtype, param_dtype or dtype):
    if name not in DTYPES:
      raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
  kwargs, ids = FAMILIES[detect_family(hf_config)].parse(hf_config)
  if not 0 <= ids.mask_id < kwargs["vocab_size"]:
    raise ValueError(f"config.json: 'mask_token_id'={ids.mask_id} is outside the vocabulary "
                     f"({kwargs['vocab_size']})")
  cfg = ModelConfig(**kwargs, dtype=DTYPES[dtype], param_dtype=DTYPES[param_dtype or dtype])
  return cfg, ids


def max_length(hf_config: dict) -> tuple[str, int] | None:
  """(config.json key, value) of the longest sequence the checkpoint was made for: LLaDA's
  ``max_sequence_length``, the Qwen-shaped families' ``max_position_embeddings``; None when
  config.json has no such key."""
  key = "max_sequence_length" if detect_family(hf_config) == "llada" else "max_position_embeddings"
  value = hf_config.get(key)
  return None if value is None else (key, int(value))


# ----------------------------------------------------------------------------- layouts

def hf_shape(fw_shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
  """The torch shape of a framework parameter of shape ``fw_shape``."""
  if kind == IN:
    return (math.prod(fw_shape[1:]), fw_shape[0])
  if kind == OUT:
    return (fw_shape[-1], math.prod(fw_shape[:-1]))
  if kind == FLAT:
    return (math.prod(fw_shape),)
  return tuple(fw_shape)


def to_framework(w: np.ndarray, fw_shape: tuple[int, ...], kind: str) -> np.ndarray:
  """HF tensor → framework layout (a view when numpy can make one)."""
  if kind == COPY:
    return w
  return w.reshape(fw_shape) if kind == FLAT else w.T.reshape(fw_shape)


def to_hf(x: np.ndarray, kind: str) -> np.ndarray:
  """Framework parameter → HF (torch ``(out, in)``) layout."""
  if kind == IN:
    return x.reshape(x.shape[0], -1).T
  if kind == OUT:
    return x.reshape(-1, x.shape[-1]).T
  if kind == FLAT:
    return x.reshape(-1)
  return x


class Tensor(NamedTuple):
  """One HF tensor of a model: its parts (framework shapes), rows and HF shape."""

  name: str
  parts: tuple[Part, ...]
  part_shapes: tuple[tuple[int, ...], ...]  # framework shape of each part
  rows: tuple[tuple[int, int], ...]         # HF rows [start, stop) of each part
  shape: tuple[int, ...]                    # HF shape


def tensor_table(family: str, cfg: ModelConfig, shapes: dict) -> list[Tensor]:
  """The family's tensors with their shapes (``shapes``: pure dict of parameter shapes).
  Checks that every parameter (each expert of a stacked one) is covered."""
  table, seen = [], set()
  for entry in FAMILIES[family].tensors(cfg):
    name, parts = (entry[0], (Part(entry[1], entry[2]),)) if len(entry) == 3 else entry
    part_shapes, rows, start = [], [], 0
    for part in parts:
      shape = tuple(lookup(shapes, part.path).shape)
      part_shapes.append(shape if part.index is None else shape[1:])
      hs = hf_shape(part_shapes[-1], part.kind)
      rows.append((start, start + hs[0]))
      start += hs[0]
      seen.add((part.path, part.index))
    table.append(Tensor(name, tuple(parts), tuple(part_shapes), tuple(rows), (start, *hs[1:])))
  for path, shape in leaf_paths(shapes):
    if (path, None) not in seen and not all((path, e) in seen for e in range(shape[0])):
      raise ValueError(f"{family}: no HF tensor holds parameter {'/'.join(map(str, path))}")
  return table


def leaf_paths(tree: Any, prefix: tuple = ()):
  """(path, shape) of each leaf of the pure dict ``tree`` (of arrays or shape structs)."""
  for k, v in tree.items():
    if isinstance(v, dict):
      yield from leaf_paths(v, prefix + (k,))
    else:
      yield prefix + (k,), tuple(v.shape)


def lookup(tree: Any, path: tuple) -> Any:
  """The entry of the nested dict ``tree`` at ``path`` (a tuple of keys)."""
  for p in path:
    tree = tree[p]
  return tree


# ----------------------------------------------------------------------------- import

def _in_run(ckpt_dir: str) -> tuple[str, str, str] | None:
  """(workdir, export flags, what ``ckpt_dir`` is) where it lies in a training run's
  ``checkpoints/`` folder (``checkpoints``, ``checkpoints/<phase>``,
  ``checkpoints/<phase>/<step>`` as Orbax writes them, or a folder of a step); None
  elsewhere. Read from the path's names alone; a URL's (``gs://b/run/checkpoints/rl/8``)
  workdir is a URL too (``gs://b/run``), not a local folder made of it."""
  url = is_url(ckpt_dir)
  if url:
    scheme, rest = os.fspath(ckpt_dir).split("://", 1)
    head, parts = f"{scheme}://", [p for p in rest.split("/") if p]
  else:
    head, parts = "/", [p for p in os.path.normpath(os.path.abspath(ckpt_dir)).split(os.sep) if p]
  for depth in range(min(3, len(parts) - 1 - url) + 1):  # a URL keeps its bucket
    if parts[-1 - depth] != "checkpoints":
      continue
    workdir, below = head + "/".join(parts[:-1 - depth]), parts[len(parts) - depth:]
    if (below and below[0] not in ("sft", "rl")) or (len(below) > 1 and not below[1].isdigit()):
      return None
    flags = "".join(f" --{k} {v}" for k, v in zip(("phase", "step"), below))
    what = ["holds a training run's checkpoints (Orbax)",
            f"holds a training run's {below[0] if below else ''} checkpoints (Orbax)",
            f"is a training run's {below[0] if below else ''} checkpoint (Orbax)",
            "lies in a training run's checkpoint (Orbax)"][depth]
    return workdir, flags, what
  return None


def not_a_model(ckpt_dir: str) -> str:
  """What else ``ckpt_dir`` (a folder without config.json) is, and what to load instead: a
  training run's workdir, a folder in its ``checkpoints/`` (an Orbax step, not an HF folder)
  or a PEFT adapter folder; "" for anything else. A gs:// folder's local copy
  (:func:`dllm_rl.infra.weights.staged_source`) is named by its URL, which export reads."""
  from dllm_rl.infra.weights import staged_source
  source = staged_source(ckpt_dir) or ckpt_dir
  if os.path.isdir(os.path.join(ckpt_dir, "checkpoints")):
    return (f"; {source} is a training run's --workdir: export its checkpoint with `python -m"
            f" dllm_rl.convert export --workdir {source} --hf_dir OUT` and load OUT")
  run = _in_run(source)
  if run:
    workdir, flags, what = run
    which = "it" if "--step" in flags else "the newest"
    return (f"; {source} {what}, not an HF folder: export {which} with `python -m"
            f" dllm_rl.convert export --workdir {workdir}{flags} --hf_dir OUT` and load OUT")
  if os.path.isfile(os.path.join(ckpt_dir, "adapter_config.json")):
    return (f"; {source} is a PEFT adapter folder: load the merged export of its run"
            " (`convert export --hf_dir`), or its base with the adapter in PEFT")
  return ""


def read_hf_config(ckpt_dir: str) -> dict:
  """The config.json of HF folder ``ckpt_dir``; FileNotFoundError (saying what the folder is
  instead, where it is a run's workdir or a PEFT folder) or ValueError naming it."""
  path = os.path.join(ckpt_dir, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} not found (an HF checkpoint folder needs config.json)"
                            + not_a_model(ckpt_dir))
  try:
    with open(path, encoding="utf-8") as f:
      config = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as err:  # cut short, or not text
    raise ValueError(f"{path}: not valid JSON ({err})") from err
  if not isinstance(config, dict):
    raise ValueError(f"{path}: not a JSON object (got {type(config).__name__})")
  return config


def open_safetensors(path: str):
  """``safe_open(path)`` for numpy; a file whose header safetensors cannot read (cut short
  by an interrupted download, or corrupt) is a ValueError naming it."""
  try:
    return safe_open(path, framework="numpy")
  except SafetensorError as err:
    raise ValueError(f"{path} looks truncated or corrupt (an interrupted download?): "
                     f"{err}; fetch the file again") from err


def tensor_index(ckpt_dir: str) -> tuple[dict[str, str], str]:
  """(tensor name → safetensors file, the file or index naming them)."""
  index = os.path.join(ckpt_dir, "model.safetensors.index.json")
  single = os.path.join(ckpt_dir, "model.safetensors")
  if os.path.isfile(index):
    try:
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
      raise ValueError(f"{index} looks truncated or corrupt: no readable \"weight_map\" "
                       f"({type(err).__name__}: {err})") from err
    return {k: os.path.join(ckpt_dir, v) for k, v in weight_map.items()}, index
  if os.path.isfile(single):
    with open_safetensors(single) as f:
      return {k: single for k in f.keys()}, single
  names = os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else []
  others = sorted(n for n in names if n.endswith(_OTHER_WEIGHTS))
  found = (f"; it has {', '.join(others[:4])}{', ...' if len(others) > 4 else ''} (only"
           " safetensors weights, one file or shards with their index, are read)" if others else "")
  raise FileNotFoundError(f"{ckpt_dir}: neither model.safetensors nor "
                          f"model.safetensors.index.json found{found}")


# weight files :func:`tensor_index` does not read (named when it finds no safetensors to read)
_OTHER_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")


def weight_files(ckpt_dir: str) -> tuple[dict[str, str], str]:
  """:func:`tensor_index` once every safetensors file it names is found and its header read
  (safetensors checks that the header's tensors cover the file exactly): a truncated
  download or a missing shard fails here, naming the file, before any model is built."""
  files, source = tensor_index(ckpt_dir)
  for path in dict.fromkeys(files.values()):
    if not os.path.isfile(path):
      raise FileNotFoundError(f"{path} (listed in {source}) not found")
    with open_safetensors(path):
      pass
  return files, source


# said after a tensor that config.json does not describe (a missing, extra or resized one)
MISMATCH_HINT = "(config.json and the weights come from different models?)"


def _tied_head(family: str, cfg: ModelConfig) -> tuple[str, str] | None:
  """(the output head's HF name, the embedding's) of a ``family`` model with tied embeddings
  (``cfg.tie_embeddings``): the head the untied layout would hold; None when untied."""
  if not cfg.tie_embeddings:
    return None
  entries = FAMILIES[family].tensors(dataclasses.replace(cfg, tie_embeddings=False))
  by_path = {entry[1]: entry[0] for entry in entries if len(entry) == 3}
  return by_path[("lm_head",)], by_path[("embed",)]


def _drop_tied_head(files: dict[str, str], extra: list[str], family: str,
                    cfg: ModelConfig) -> list[str]:
  """``extra`` (tensors the model does not use) without the output head of a model whose
  config.json ties it to the embedding, when the folder holds it as a copy of the embedding
  (a trainer or converter that saves both: transformers ties them and loads it); a head that
  differs from the embedding is a ValueError (the weights were trained untied). Reads those
  two tensors only."""
  tied = _tied_head(family, cfg)
  if tied is None or tied[0] not in extra:
    return extra
  head, embed = tied
  with open_safetensors(files[head]) as fh, open_safetensors(files[embed]) as fe:
    same = np.array_equal(fh.get_tensor(head), fe.get_tensor(embed))
  if not same:
    raise ValueError(f"tensor {head!r} in {files[head]} differs from the embedding {embed!r},"
                     f" but config.json ties them ({_TIE_KEY.get(family, 'tie_word_embeddings')}"
                     " true), so the model would drop it: weights trained untied need"
                     f" {_TIE_KEY.get(family, 'tie_word_embeddings')} false in config.json")
  return [name for name in extra if name != head]


_TIE_KEY = {"llada": "weight_tying"}  # config.json's key; the others: tie_word_embeddings


def _check_tensors(files: dict[str, str], source: str, family: str, plan: list[Tensor],
                   cfg: ModelConfig) -> None:
  """Names, shapes and dtypes from the headers, before any tensor is read (``files``: from
  :func:`weight_files`, which found every file); a tied model's copy of its embedding as the
  output head is let be (:func:`_drop_tied_head`, which reads those two)."""
  wanted = {t.name for t in plan}
  for name in sorted(wanted):
    if name not in files:
      raise ValueError(f"tensor {name!r} is missing from {source} {MISMATCH_HINT}")
  extra = _drop_tied_head(files, sorted(set(files) - wanted), family, cfg)
  if extra:
    raise ValueError(f"{source} has {len(extra)} unexpected tensor(s) that the {family} model "
                     f"with this config.json does not use: {extra[:10]} {MISMATCH_HINT}")
  by_file: dict[str, list] = {}
  for entry in plan:
    by_file.setdefault(files[entry.name], []).append(entry)
  for path, entries in by_file.items():
    with open_safetensors(path) as f:
      present = set(f.keys())
      for name, *_, want in entries:
        if name not in present:
          raise ValueError(f"tensor {name!r} is missing from {path} (listed in {source})")
        sl = f.get_slice(name)
        shape = tuple(sl.get_shape())
        if shape != want:
          raise ValueError(f"tensor {name!r} in {path} has shape {shape}, expected {want} "
                           f"from config.json {MISMATCH_HINT}")
        if sl.get_dtype() not in ST_DTYPES:
          raise ValueError(f"tensor {name!r} in {path} has dtype {sl.get_dtype()}; "
                           f"supported: {sorted(ST_DTYPES)}")


def check_tensors(files: dict[str, str], source: str, family: str, cfg: ModelConfig) -> None:
  """Every tensor the ``family`` model of ``cfg`` (from config.json) needs, against the
  safetensors headers (``files``, ``source``: from :func:`weight_files`): names, shapes and
  dtypes, no tensor data read. A ValueError names the first tensor that differs."""
  shapes = nnx.to_pure_dict(abstract_model(cfg)[1])
  _check_tensors(files, source, family, tensor_table(family, cfg, shapes), cfg)


def _place(view: np.ndarray, sharding, dtype) -> jax.Array:
  """A host array (or view) onto its sharding, each device copying only its slice."""
  return jax.make_array_from_callback(
      view.shape, sharding, lambda idx: np.ascontiguousarray(view[idx], dtype=dtype))


def _load_params(plan: list[Tensor], files: dict[str, str], values: dict, shardings: dict,
                 np_dtype) -> None:
  """Fills ``values`` (pure dict of shapes) with placed arrays, one parameter at a time:
  a parameter from one HF tensor (or rows of it) is placed from a view of it, a stacked
  one is assembled on the host from its per-expert tensors first."""
  sources: dict[tuple, list] = {}
  for t in plan:
    for part, shape, rows in zip(t.parts, t.part_shapes, t.rows):
      sources.setdefault(part.path, []).append((t.name, part, shape, rows))
  with contextlib.ExitStack() as stack:
    handles = {f: stack.enter_context(open_safetensors(f))
               for f in dict.fromkeys(files[t.name] for t in plan)}
    last: list = [None, None]  # the last tensor read (q, k and v share one)

    def read(name):
      if last[0] != name:
        last[:] = [name, handles[files[name]].get_tensor(name)]
      return last[1]

    for path, srcs in sources.items():
      views = [(part.index, to_framework(read(name)[r0:r1], shape, part.kind))
               for name, part, shape, (r0, r1) in srcs]
      if len(views) == 1 and views[0][0] is None:
        host = views[0][1]
      else:  # a stacked [E, ...] parameter
        host = np.empty((len(views), *views[0][1].shape), np_dtype)
        for e, view in views:
          host[e] = view
      lookup(values, path[:-1])[path[-1]] = _place(host, lookup(shardings, path), np_dtype)


def load_checkpoint(ckpt_dir: str, *, mesh: jax.sharding.Mesh | None = None,
                    dtype: str = "float32", param_dtype: str | None = None) -> LoadedModel:
  """Loads an HF folder → :class:`LoadedModel` (model_cfg, token_ids, graphdef, params, family).

  ``params`` is an ``nnx.State`` whose arrays already carry ``param_shardings``
  on ``mesh`` (default: one device). Raises ValueError naming the tensor for a
  missing/unexpected tensor or a shape mismatch, and for unsupported configs.
  """
  hf_config = read_hf_config(ckpt_dir)
  family = detect_family(hf_config)
  cfg, ids = model_config_from_hf(hf_config, dtype=dtype, param_dtype=param_dtype)
  files, source = weight_files(ckpt_dir)
  mesh = mesh if mesh is not None else make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
  graphdef, abstract = abstract_model(cfg)
  shapes, shardings = nnx.to_pure_dict(abstract), nnx.to_pure_dict(param_shardings(abstract, mesh))
  plan = tensor_table(family, cfg, shapes)
  _check_tensors(files, source, family, plan, cfg)
  values = shapes  # the pure dict of shapes, filled in place with placed arrays
  _load_params(plan, files, values, shardings, np.dtype(cfg.param_dtype))
  nnx.replace_by_pure_dict(abstract, values)
  return LoadedModel(cfg, ids, graphdef, abstract, family)
