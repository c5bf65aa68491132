"""Byte-level BPE ``tokenizers.Tokenizer`` built from a slow-tokenizer layout.

Some checkpoints (Dream-v0, Qwen2 exports without a fast tokenizer) ship
``vocab.json`` + ``merges.txt`` (+ ``added_tokens.json``) instead of
``tokenizer.json``. ``transformers`` converts them to a fast tokenizer on load;
this module builds the same pipeline from the ``tokenizers`` building blocks,
for an explicit list of ``tokenizer_class`` names only (anything else fails
fast in the caller):

* Qwen2 (``Qwen2Tokenizer``, ``Qwen2TokenizerFast`` and Dream's
  ``DreamTokenizer``, which is Qwen2-shaped): NFC normalizer; pre-tokenizer =
  Split on the Qwen2 regex (isolated) then ByteLevel without its own regex and
  without a prefix space; a BPE model from vocab/merges (no unk token); a
  ByteLevel decoder.

Added tokens (``added_tokens_decoder`` in ``tokenizer_config.json``, and
``added_tokens.json``) are registered at exactly their recorded ids, special
ones as special tokens; an id the library would place elsewhere is an error.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
ADDED_TOKENS_FILE = "added_tokens.json"

# Qwen2's pre-tokenizer pattern: contractions, letter runs with at most one
# leading non-letter/digit, single digits, punctuation runs, newline runs, spaces.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_CLASSES = ("Qwen2Tokenizer", "Qwen2TokenizerFast", "DreamTokenizer")
SUPPORTED_CLASSES = QWEN2_CLASSES

_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def added_token_specs(decoder: dict[str, Any] | None, added_json: dict[str, Any] | None,
                      special_strings: Iterable[str] = ()) -> list[tuple[int, dict]]:
  """Added tokens as ``(id, {"content", single_word, lstrip, rstrip, normalized,
  special})``, sorted by id.

  ``decoder`` is tokenizer_config's ``added_tokens_decoder`` (id string → token
  dict); ``added_json`` is ``added_tokens.json`` (content → id). An entry only in
  ``added_json`` is special when its content is one of ``special_strings``.
  Raises ValueError on a malformed entry or when the two sources disagree.
  """
  specials = set(special_strings)
  by_id: dict[int, dict] = {}
  for key, entry in (decoder or {}).items():
    try:
      tid = int(key)
    except (TypeError, ValueError):
      raise ValueError(f"added_tokens_decoder: key {key!r} is not an integer id") from None
    if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
      raise ValueError(f"added_tokens_decoder[{key!r}]: expected an object with a string "
                       f"'content', got {entry!r}")
    special = bool(entry.get("special", False))
    spec = {"content": entry["content"], "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": not special, "special": special}
    spec.update({k: bool(entry[k]) for k in _FLAGS if k in entry})
    by_id[tid] = spec
  for content, tid in (added_json or {}).items():
    if isinstance(tid, bool) or not isinstance(tid, int) or tid < 0:
      raise ValueError(f"{ADDED_TOKENS_FILE}: id of {content!r} must be a non-negative "
                       f"integer, got {tid!r}")
    if tid in by_id:
      if by_id[tid]["content"] != content:
        raise ValueError(f"{ADDED_TOKENS_FILE} puts {content!r} at id {tid}, "
                         f"added_tokens_decoder puts {by_id[tid]['content']!r} there")
      continue
    special = content in specials
    by_id[tid] = {"content": content, "single_word": False, "lstrip": False,
                  "rstrip": False, "normalized": not special, "special": special}
  contents: dict[str, int] = {}
  for tid, spec in sorted(by_id.items()):
    if spec["content"] in contents:
      raise ValueError(f"added token {spec['content']!r} has two ids: "
                       f"{contents[spec['content']]} and {tid}")
    contents[spec["content"]] = tid
  return sorted(by_id.items())


def _add_at_ids(tokenizer, specs: list[tuple[int, dict]]) -> None:
  """Registers ``specs`` one by one in id order and checks each landed on its id."""
  from tokenizers import AddedToken

  for tid, spec in specs:
    token = AddedToken(**spec)
    if spec["special"]:
      tokenizer.add_special_tokens([token])
    else:
      tokenizer.add_tokens([token])
    got = tokenizer.token_to_id(spec["content"])
    if got != tid:
      raise ValueError(f"added token {spec['content']!r} should have id {tid} but the "
                       f"vocabulary places it at {got} (ids must follow vocab.json "
                       f"without gaps, or name a vocab.json entry)")


def qwen2_tokenizer(vocab_path: str, merges_path: str, specs: list[tuple[int, dict]]):
  """The Qwen2 byte-level BPE pipeline over ``vocab_path``/``merges_path`` with
  the added tokens ``specs`` (from :func:`added_token_specs`).

  Raises FileNotFoundError naming a missing file, ValueError when the files
  cannot be read or an added token's id cannot be honoured.
  """
  from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

  for file in (vocab_path, merges_path):
    if not os.path.isfile(file):
      raise FileNotFoundError(f"tokenizer file {file!r} does not exist")
  try:
    model = models.BPE.from_file(vocab_path, merges_path, unk_token=None,
                                 continuing_subword_prefix="", end_of_word_suffix="",
                                 fuse_unk=False, byte_fallback=False)
  except Exception as err:  # the Rust library raises a bare Exception
    raise ValueError(f"{vocab_path} + {merges_path}: cannot be read as a BPE model "
                     f"({err})") from err
  tokenizer = Tokenizer(model)
  tokenizer.normalizer = normalizers.NFC()
  tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
  ])
  tokenizer.decoder = decoders.ByteLevel()
  _add_at_ids(tokenizer, specs)
  return tokenizer
