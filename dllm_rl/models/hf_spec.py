"""The vocabulary Hugging Face families are written in (dllm_rl.models.hf and the
family modules beside it): special token ids, a family's functions, tensor parts,
config.json helpers."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

from dllm_rl.models.transformer import ModelConfig

COPY, IN, OUT, FLAT = "copy", "in", "out", "flat"  # tensor layouts, see dllm_rl.models.hf
MISSING = object()


@dataclasses.dataclass(frozen=True)
class TokenIds:
  """Special token ids read from the checkpoint's config.json (None = absent)."""

  mask_id: int
  eos_id: int | None
  pad_id: int | None
  bos_id: int | None
  block_size: int | None  # SDAR decoding block length; None for LLaDA, Dream, LLaDA2


@dataclasses.dataclass(frozen=True)
class Family:
  name: str
  architecture: str
  model_type: str
  parse: Callable[[dict], tuple[dict, TokenIds]]            # config.json → ModelConfig kwargs
  to_config: Callable[[ModelConfig, TokenIds], dict]         # inverse (a fresh config.json)
  # (HF name, param path, kind), or (HF name, (Part, ...)): see :func:`tensor_table`
  tensors: Callable[[ModelConfig], list[tuple]]


class Part(NamedTuple):
  """A piece of one HF tensor: parameter ``path`` in layout ``kind``, the whole
  parameter (``index`` None) or its slice ``[index]`` along the leading (expert) axis."""

  path: tuple
  kind: str
  index: int | None = None


def get(c: dict, key: str, default: Any = MISSING) -> Any:
  value = c.get(key, default)
  if value is MISSING:
    raise ValueError(f"config.json: required key {key!r} is missing")
  return value


def check_options(c: dict, family: str, allowed: dict[str, tuple[tuple, Any]]) -> None:
  """``allowed``: key → (supported values, value assumed when the key is absent)."""
  for key, (ok, default) in allowed.items():
    value = c.get(key, default)
    if value not in ok:
      shown = "absent (reference default differs)" if value is MISSING else repr(value)
      raise ValueError(f"config.json: {family} option {key!r} = {shown} is not supported "
                       f"(supported: {', '.join(map(repr, ok))})")


def first(value: Any) -> int | None:
  """An id that HF may give as a list (several EOS ids): the first one."""
  if isinstance(value, (list, tuple)):
    return int(value[0]) if value else None
  return None if value is None else int(value)
