"""LoRA adapters as a PEFT adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``).

PEFT computes ``W_hf·x + (α/r)·lora_B(lora_A(x))`` on torch ``(out, in)`` weights. The
framework's adapter of a weight ``W`` [*I, *O] is ``A`` [*I, r], ``B`` [r, *O] with
``ΔW = (α/r)·A·B`` in the framework layout, and the HF tensor is ``W`` flattened to
[in, out] (``I`` and ``O`` row-major, ``hf.to_hf``) and transposed. So
``lora_A.weight = A.reshape(in, r).T`` [r, in] and ``lora_B.weight = B.reshape(r, out).T``
[out, r], under ``base_model.model.<HF module>`` (the HF tensor name without ``.weight``).
``target_modules`` lists the adapted modules by full name (PEFT matches a name exactly), so
e.g. LLaDA's per-layer ``ff_out`` is adapted and its head, also named ``ff_out``, is not.
"""

from __future__ import annotations

import json
import os

import numpy as np

from dllm_rl.models import hf, lora
from dllm_rl.models.transformer import ModelConfig

WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


def _lookup(tree: dict, path: tuple):
  for p in path:
    tree = tree.get(p) if isinstance(tree, dict) else None
    if tree is None:
      return None
  return tree


def peft_tensors(pure: dict, model_cfg: ModelConfig, family: str) -> dict[str, np.ndarray]:
  """PEFT key → float32 torch-layout array for every adapter in ``pure`` (a pure-dict
  params tree with adapters)."""
  out = {}
  for entry in hf.FAMILIES[family].tensors(lora.without_lora(model_cfg)):
    if len(entry) != 3:  # stacked expert tensors: never adapted
      continue
    name, path, _ = entry
    adapter = _lookup(pure, (*path[:-1], f"{path[-1]}{lora.SUFFIX}"))
    if adapter is None:
      continue
    a, b = np.asarray(adapter["a"], np.float32), np.asarray(adapter["b"], np.float32)
    module = f"base_model.model.{name.removesuffix('.weight')}"
    out[f"{module}.lora_A.weight"] = a.reshape(-1, a.shape[-1]).T
    out[f"{module}.lora_B.weight"] = b.reshape(b.shape[0], -1).T
  return out


def adapter_config(model_cfg: ModelConfig, modules: list[str], base: str) -> dict:
  """PEFT's ``adapter_config.json`` for rank / alpha of ``model_cfg``, no dropout or bias."""
  return {"peft_type": "LORA", "r": model_cfg.lora_rank, "lora_alpha": model_cfg.lora_alpha,
          "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
          "init_lora_weights": True, "inference_mode": True, "target_modules": modules,
          "base_model_name_or_path": base, "task_type": None}


def export_peft(pure: dict, model_cfg: ModelConfig, family: str, out_dir: str,
                base: str) -> list[str]:
  """Writes the adapters of ``pure`` as a PEFT folder; returns the files written."""
  tensors = peft_tensors(pure, model_cfg, family)
  if not tensors:
    raise ValueError("the parameters hold no LoRA adapter (lora.rank = 0?)")
  from safetensors.numpy import save_file
  os.makedirs(out_dir, exist_ok=True)
  files = [os.path.join(out_dir, WEIGHTS_FILE), os.path.join(out_dir, CONFIG_FILE)]
  save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, files[0],
            metadata={"format": "pt"})
  modules = sorted({k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] for k in tensors})
  with open(files[1], "w", encoding="utf-8") as f:
    json.dump(adapter_config(model_cfg, modules, base), f, indent=2, sort_keys=True)
    f.write("\n")
  return files
