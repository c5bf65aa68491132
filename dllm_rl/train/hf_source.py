"""A Hugging Face checkpoint as a run reads it (``model.hf_checkpoint``): the local folder it
resolves to, the architecture its config.json gives, its tokenizer and token ids, the checks
of its weights' headers and block size, and its weights placed on the mesh; each problem a
ConfigError naming the key. :mod:`dllm_rl.train.context` builds the run from these."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, NamedTuple

import ml_collections
import numpy as np

from dllm_rl.config import ConfigError
from dllm_rl.models import transformer


@dataclasses.dataclass
class HFSource:
  """What a Hugging Face checkpoint directory provides before any weight is read."""

  model_cfg: transformer.ModelConfig
  token_ids: Any
  family: str
  tokenizer: Any
  max_length: tuple[str, int] | None = None  # config.json's longest sequence (hf.max_length)


class HFArchitecture(NamedTuple):
  """What a checkpoint folder's config.json says before any weight is read."""

  model_cfg: transformer.ModelConfig
  token_ids: Any  # models.hf.TokenIds
  family: str


def checkpoint_folder(spec: str, *, config_only: bool = False) -> str:
  """The local folder of ``model.hf_checkpoint``: a local folder, a gs:// folder staged to the
  local cache, or a hub id fetched into the hub cache (:mod:`dllm_rl.infra.weights`);
  ``config_only``: what planning reads (config.json). Anything unavailable is a ConfigError
  naming the key and how to fetch it."""
  from dllm_rl.infra import weights
  from dllm_rl.paths import BackendMissing

  try:
    return weights.resolve_checkpoint(spec, config_only=config_only)
  except (weights.WeightsUnavailable, BackendMissing) as err:
    raise ConfigError("model.hf_checkpoint", str(err)) from err


def hf_run_options(model: ml_collections.ConfigDict) -> dict:
  """The ``config.model`` keys a run keeps with an HF checkpoint beyond the dtypes (its
  config.json gives the rest): keyword arguments of :func:`hf_model_config` /
  :func:`load_hf_source`, one list for the run and the planner."""
  return {"scan_layers": model.scan_layers, "remat": model.remat,
          "moe_dispatch": model.moe_dispatch}


def hf_model_config(path: str, dtype: str, param_dtype: str, *, scan_layers: bool = False,
                    remat: str = "none", moe_dispatch: str = "auto") -> HFArchitecture:
  """The architecture of a HF checkpoint dir or of its ``convert import`` output (its
  config.json, or the copy in model.json), compute in ``dtype`` and parameters (hence the
  optimizer moments) stored in ``param_dtype`` whatever the file holds; ``scan_layers`` /
  ``remat`` / ``moe_dispatch`` as ``config.model`` asks."""
  from dllm_rl.models import convert, hf

  if not os.path.isdir(path):
    raise ConfigError("model.hf_checkpoint", f"{path!r} is not a directory")
  try:
    hf_config = convert.source_hf_config(path)
    family = hf.detect_family(hf_config)
    model_cfg, ids = hf.model_config_from_hf(hf_config, dtype=dtype, param_dtype=param_dtype)
  except (ValueError, KeyError, FileNotFoundError) as err:
    text = str(err)  # a message naming a file of the folder (its config.json) names it once
    raise ConfigError("model.hf_checkpoint",
                      text if text.startswith(path) else f"{path}: {text}") from err
  model_cfg = dataclasses.replace(model_cfg, scan_layers=scan_layers, remat=remat,
                                  moe_dispatch=moe_dispatch)
  return HFArchitecture(model_cfg, ids, family)


def load_hf_params(path: str, model_cfg: transformer.ModelConfig, mesh):
  """(graphdef, params) of a HF checkpoint dir or of its ``convert import`` output,
  placed on their shardings and cast to ``model_cfg.param_dtype`` (fp32 master
  weights from a bf16 file); the graphdef computes in ``model_cfg.dtype``. Weights the
  folder's config.json does not describe (a folder changed since the run checked it) are a
  ConfigError on ``model.hf_checkpoint``."""
  from dllm_rl.models import convert, hf

  param_dtype = np.dtype(model_cfg.param_dtype).name
  if convert.is_imported(path):
    params = convert.load_imported(path, mesh=mesh, param_dtype=param_dtype).params
  else:
    try:
      params = hf.load_checkpoint(path, mesh=mesh, dtype=np.dtype(model_cfg.dtype).name,
                                  param_dtype=param_dtype).params
    except ValueError as err:
      raise ConfigError("model.hf_checkpoint", str(err)) from err
  graphdef, _ = transformer.abstract_model(model_cfg)  # this run's compute dtype
  return graphdef, params


def check_block_size(path: str, family: str, ids, block_size: int) -> None:
  """``model.block_size`` against the checkpoint at ``path`` (``family``, its token ``ids``):
  an SDAR checkpoint's own block size, 0 for a bidirectional LLaDA or Dream one; a
  ConfigError naming the key otherwise (the run, the evaluation and the plan check alike)."""
  if family == "sdar" and ids.block_size != block_size:
    raise ConfigError("model.block_size", f"{path} is a block-diffusion (SDAR) checkpoint with"
                      f" block_size={ids.block_size}; set model.block_size={ids.block_size}"
                      f" (got {block_size})")
  if family in ("llada", "dream") and block_size:
    raise ConfigError("model.block_size", f"{path} is a bidirectional"
                      f" {'LLaDA' if family == 'llada' else 'Dream'} checkpoint: use 0")


def load_hf_source(path: str, dtype: str, block_size: int = 0,
                   param_dtype: str = "float32", *, scan_layers: bool = False,
                   remat: str = "none", moe_dispatch: str = "auto") -> HFSource:
  """Architecture, token ids and tokenizer of a HF checkpoint dir, or of its
  ``python -m dllm_rl.convert import`` output (weights are read later, onto the mesh, by
  :func:`dllm_rl.train.context.init_params`; an HF folder's safetensors headers are read now,
  so a truncated or missing file, or a tensor whose name or shape config.json does not
  describe, is a ConfigError before anything is built)."""
  from dllm_rl.models import hf
  from dllm_rl.models.convert import is_imported, load_tokenizer, source_hf_config

  model_cfg, ids, family = hf_model_config(path, dtype, param_dtype, scan_layers=scan_layers,
                                           remat=remat, moe_dispatch=moe_dispatch)
  if not is_imported(path):
    try:  # a truncated download, a missing shard, a tensor config.json does not describe
      # (the headers' names and shapes only, no tensor data), named before the build
      hf.check_tensors(*hf.weight_files(path), family, model_cfg)
    except (ValueError, FileNotFoundError) as err:
      raise ConfigError("model.hf_checkpoint", str(err)) from err
  check_block_size(path, family, ids, block_size)
  try:
    tokenizer = load_tokenizer(path, ids)
  except (ValueError, FileNotFoundError) as err:
    raise ConfigError("model.hf_checkpoint", f"tokenizer: {err}") from err
  if tokenizer.vocab_size > model_cfg.vocab_size:
    raise ConfigError("model.hf_checkpoint", f"{path}: tokenizer has {tokenizer.vocab_size} ids,"
                      f" the model's embedding only {model_cfg.vocab_size}")
  return HFSource(model_cfg, ids, family, tokenizer, hf.max_length(source_hf_config(path)))


def check_local_source(m) -> None:
  """``model.hf_checkpoint`` a local path (``m``: config.model): a ConfigError when it is no
  folder or its config.json is missing or bad (e.g. a run's --workdir given), before --workdir
  is created. A gs:// folder or a hub id is fetched after the workdir's checks."""
  from dllm_rl import paths
  from dllm_rl.infra import weights
  spec = m.hf_checkpoint
  if spec and not paths.is_url(spec) and weights.hub_id(os.path.expanduser(spec)) is None:
    hf_model_config(checkpoint_folder(spec), m.dtype, m.param_dtype)
