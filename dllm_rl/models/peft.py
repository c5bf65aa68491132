"""LoRA adapters as a PEFT adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``).

PEFT computes ``W_hf·x + (α/r)·lora_B(lora_A(x))`` on torch ``(out, in)`` weights. The
framework's adapter of a weight ``W`` [*I, *O] is ``A`` [*I, r], ``B`` [r, *O] with
``ΔW = (α/r)·A·B`` in the framework layout, and the HF tensor is ``W`` flattened to
[in, out] (``I`` and ``O`` row-major, ``hf.to_hf``) and transposed. So
``lora_A.weight = A.reshape(in, r).T`` [r, in] and ``lora_B.weight = B.reshape(r, out).T``
[out, r], under ``base_model.model.<HF module>`` (the HF tensor name without ``.weight``).
``target_modules`` lists the adapted modules by full name (PEFT matches a name exactly), so
e.g. LLaDA's per-layer ``ff_out`` is adapted and its head, also named ``ff_out``, is not.
An HF tensor that fuses several adapted parameters (LLaDA2's ``query_key_value`` = q | k |
v) gets one LoRA of rank n·r (A stacked, B block-diagonal: exactly the parts' updates),
listed in ``rank_pattern`` with ``alpha_pattern`` n·α, so its scale stays α/r.
``task_type`` follows the base's config.json (:func:`task_fields`), so PEFT's auto classes
(``AutoPeftModelForCausalLM`` / ``AutoPeftModel``) load the folder onto its base.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from dllm_rl.models import hf, lora
from dllm_rl.models.transformer import ModelConfig

WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


def _adapter(pure: dict, path: tuple) -> dict | None:
  """The adapter (``{"a", "b"}``) of the parameter at ``path`` of ``pure``; None where the
  parameter has none (its sibling ``<name>_lora`` is absent)."""
  return hf.lookup(pure, path[:-1]).get(f"{path[-1]}{lora.SUFFIX}")


def peft_tensors(pure: dict, model_cfg: ModelConfig, family: str) -> dict[str, np.ndarray]:
  """PEFT key → float32 torch-layout array for every adapter in ``pure`` (a pure-dict
  params tree with adapters)."""
  out = {}
  for entry in hf.FAMILIES[family].tensors(lora.without_lora(model_cfg)):
    parts = (hf.Part(entry[1], entry[2]),) if len(entry) == 3 else entry[1]
    if any(part.index is not None for part in parts):  # stacked experts: never adapted
      continue
    pair = _fused_pair(pure, [part.path for part in parts])
    if pair is not None:
      module = f"base_model.model.{entry[0].removesuffix('.weight')}"
      out[f"{module}.lora_A.weight"], out[f"{module}.lora_B.weight"] = pair
  return out


def _fused_pair(pure: dict, paths: list[tuple]) -> tuple[np.ndarray, np.ndarray] | None:
  """(lora_A [n·r, in], lora_B [out, n·r]) of the HF tensor whose rows are the parameters at
  ``paths`` in turn (one, or LLaDA2's fused query_key_value = q | k | v), from the n of them
  that have an adapter (None when none has): their A stacked, their B block-diagonal, so
  B·A is exactly each part's own update in its rows (rank n·r; a part without an adapter
  gets zero rows, ``in``-layout parts hold prod(shape[1:]) rows)."""
  adapters = [_adapter(pure, p) for p in paths]
  a_list = [np.asarray(x["a"], np.float32) for x in adapters if x is not None]
  if not a_list:
    return None
  rank = a_list[0].shape[-1]
  cols, at, blocks = rank * len(a_list), 0, []
  for path, adapter in zip(paths, adapters):
    if adapter is None:
      blocks.append(np.zeros((math.prod(np.shape(hf.lookup(pure, path))[1:]), cols), np.float32))
      continue
    b = np.asarray(adapter["b"], np.float32)
    block = np.zeros((math.prod(b.shape[1:]), cols), np.float32)
    block[:, at:at + rank] = b.reshape(rank, -1).T
    blocks.append(block)
    at += rank
  return (np.concatenate([a.reshape(-1, rank).T for a in a_list], axis=0),
          np.concatenate(blocks, axis=0))


def task_fields(hf_config: dict | None) -> dict:
  """PEFT's ``task_type`` for a base with config.json ``hf_config``: ``CAUSAL_LM`` where its
  ``auto_map`` names an ``AutoModelForCausalLM`` class (LLaDA, SDAR, LLaDA2), which
  ``AutoPeftModelForCausalLM`` loads; otherwise (Dream: ``AutoModel`` only) none, with the
  ``auto_mapping`` PEFT writes for a model without a task, naming ``transformers.AutoModel``
  (``AutoPeftModel``). With neither, PEFT's auto classes cannot load the folder ("Cannot
  infer the auto class from the config"); ``PeftModel.from_pretrained`` loads it either way."""
  if "AutoModelForCausalLM" in ((hf_config or {}).get("auto_map") or {}):
    return {"task_type": "CAUSAL_LM"}
  return {"task_type": None,
          "auto_mapping": {"base_model_class": "AutoModel", "parent_library": "transformers"}}


def adapter_config(model_cfg: ModelConfig, modules: list[str], base: str,
                   ranks: dict[str, int] | None = None, hf_config: dict | None = None) -> dict:
  """PEFT's ``adapter_config.json`` for rank / alpha of ``model_cfg``, no dropout or bias;
  ``ranks``: modules of another rank (a fused tensor's n·r), in ``rank_pattern`` with the
  alpha that keeps their scale α/r (``alpha_pattern``); ``hf_config``: the base's
  config.json (:func:`task_fields`)."""
  ranks = ranks or {}
  scale = model_cfg.lora_alpha / model_cfg.lora_rank
  return {"peft_type": "LORA", "r": model_cfg.lora_rank, "lora_alpha": model_cfg.lora_alpha,
          "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
          "init_lora_weights": True, "inference_mode": True, "target_modules": modules,
          "rank_pattern": ranks, "alpha_pattern": {m: scale * r for m, r in ranks.items()},
          "base_model_name_or_path": base, **task_fields(hf_config)}


def export_peft(pure: dict, model_cfg: ModelConfig, family: str, out_dir: str,
                base: str, hf_config: dict | None = None) -> list[str]:
  """Writes the adapters of ``pure`` as a PEFT folder for the base ``base`` (its path or hub
  id) with config.json ``hf_config``; returns the files written."""
  tensors = peft_tensors(pure, model_cfg, family)
  if not tensors:
    raise ValueError("the parameters hold no LoRA adapter (lora.rank = 0?)")
  from safetensors.numpy import save_file
  os.makedirs(out_dir, exist_ok=True)
  files = [os.path.join(out_dir, WEIGHTS_FILE), os.path.join(out_dir, CONFIG_FILE)]
  save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, files[0],
            metadata={"format": "pt"})
  modules = sorted({k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] for k in tensors})
  ranks = {m: r for m in modules
           if (r := tensors[f"base_model.model.{m}.lora_A.weight"].shape[0]) != model_cfg.lora_rank}
  with open(files[1], "w", encoding="utf-8") as f:
    json.dump(adapter_config(model_cfg, modules, base, ranks, hf_config), f, indent=2,
              sort_keys=True)
    f.write("\n")
  return files
