"""Hugging Face tokenizer (``tokenizer.json``) behind the ``CharTokenizer`` interface.

A checkpoint directory holds ``tokenizer.json`` (read by the ``tokenizers``
library, no ``transformers``) and ``tokenizer_config.json`` (special-token
strings and the chat template; a ``chat_template.jinja`` file beside it takes
precedence, as in recent ``transformers``). Without ``tokenizer.json``, a
``tokenizer_class`` listed in :mod:`dllm_rl.tasks.bpe_tokenizer` (Qwen2, Dream)
is built from ``vocab.json`` + ``merges.txt`` instead. The PAD / EOS / MASK ids
come from the caller (the checkpoint's ``config.json``), never from constants here.

The chat template is rendered like ``transformers`` does: Jinja2 in an
immutable sandbox, ``trim_blocks`` and ``lstrip_blocks``, with ``messages``,
``add_generation_prompt=True``, the special-token strings, ``raise_exception``,
``strftime_now``, a ``tojson`` filter and the ``{% generation %}`` block (transformers'
assistant-mask tag: its body as written). A template that does not compile is a ValueError
naming its file. Template text such as ``<|eot_id|>``
is then encoded as the special token it names, so ``encode`` never adds
BOS/EOS itself (``add_special_tokens=False``): the template decides.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any, Iterable, Sequence

import numpy as np

from dllm_rl.tasks.bpe_tokenizer import MERGES_FILE, VOCAB_FILE

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
# The tokenizer files ``HFTokenizer.from_dir`` reads (a tokenizer_config.json beside either).
TOKENIZER_LAYOUTS = ((TOKENIZER_FILE,), (VOCAB_FILE, MERGES_FILE))
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                 "cls_token", "mask_token")


def _token_text(value: Any) -> str | None:
  """A special token as tokenizer_config stores it: a string or {"content": ...}."""
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) else None


def _read_json(path: str) -> dict:
  if not os.path.isfile(path):
    raise FileNotFoundError(f"tokenizer file {path!r} does not exist")
  with open(path, encoding="utf-8") as f:
    try:
      data = json.load(f)
    except json.JSONDecodeError as err:
      raise ValueError(f"{path}: not valid JSON ({err})") from err
  if not isinstance(data, dict):
    raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
  return data


def _template_source(path: str, config: dict) -> tuple[str | None, str]:
  """The chat template text: chat_template.jinja, else tokenizer_config's
  ``chat_template`` (a string, or a list of {"name", "template"} → "default"); and where it
  was read (the file, or the config's), for the error of a template that does not compile."""
  jinja_path = os.path.join(path, TEMPLATE_FILE)
  if os.path.isfile(jinja_path):
    with open(jinja_path, encoding="utf-8") as f:
      return f.read(), jinja_path
  source = config.get("chat_template")
  if isinstance(source, list):
    named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
    source = named.get("default")
    if source is None:
      raise ValueError(f"{os.path.join(path, CONFIG_FILE)}: chat_template is a list "
                       f"without a 'default' entry (names: {sorted(map(str, named))})")
  if source is not None and not isinstance(source, str):
    raise ValueError(f"{os.path.join(path, CONFIG_FILE)}: chat_template must be a "
                     f"string, got {type(source).__name__}")
  return source, f"{os.path.join(path, CONFIG_FILE)}'s"


def _generation_extension():
  """The ``{% generation %}...{% endgeneration %}`` tag of transformers' chat templates (it
  marks the assistant's tokens for a training mask): rendered as its body, as transformers
  does when it tracks nothing. Without it such a template does not compile."""
  from jinja2 import nodes
  from jinja2.ext import Extension

  class Generation(Extension):
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  return Generation


def _compile_template(source: str, where: str = "the chat template"):
  """Compiles ``source`` in an immutable Jinja2 sandbox configured like transformers;
  ValueError naming ``where`` (its file) when it does not compile."""
  import jinja2
  from jinja2 import sandbox
  from jinja2.ext import loopcontrols

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)

  env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                              extensions=[loopcontrols, _generation_extension()])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = strftime_now
  try:
    return env.from_string(source)
  except jinja2.exceptions.TemplateError as err:  # syntax, an unknown filter or tag
    line = getattr(err, "lineno", None)
    raise ValueError(f"{where} does not compile as Jinja ({type(err).__name__}: {err}"
                     + (f", template line {line})" if line else ")")) from err


def _load_tokenizer_json(tok_path: str):
  """``tokenizer.json`` through ``tokenizers.Tokenizer.from_file``."""
  from tokenizers import Tokenizer

  try:
    return Tokenizer.from_file(tok_path)
  except Exception as err:  # the Rust library raises a bare Exception
    raise ValueError(f"{tok_path}: cannot be loaded by `tokenizers` ({err})") from err


def _build_from_vocab(path: str, config: dict, special: dict[str, Any]):
  """The slow-tokenizer layout (vocab.json + merges.txt + added tokens) of a
  supported ``tokenizer_class``; FileNotFoundError naming tokenizer.json and the
  supported classes otherwise."""
  from dllm_rl.tasks import bpe_tokenizer as bpe

  name = config.get("tokenizer_class")
  if name not in bpe.SUPPORTED_CLASSES:
    raise FileNotFoundError(
        f"tokenizer file {os.path.join(path, TOKENIZER_FILE)!r} does not exist, and "
        f"tokenizer_class {name!r} in {CONFIG_FILE} is not one built from "
        f"{bpe.VOCAB_FILE} + {bpe.MERGES_FILE} (supported: {', '.join(bpe.SUPPORTED_CLASSES)})")
  added_path = os.path.join(path, bpe.ADDED_TOKENS_FILE)
  added_json = _read_json(added_path) if os.path.isfile(added_path) else {}
  strings = [v for k, v in special.items() if k != "additional_special_tokens" and v]
  strings += special["additional_special_tokens"]
  try:
    specs = bpe.added_token_specs(config.get("added_tokens_decoder"), added_json, strings)
  except ValueError as err:
    raise ValueError(f"{path}: {err}") from err
  return bpe.qwen2_tokenizer(os.path.join(path, bpe.VOCAB_FILE),
                             os.path.join(path, bpe.MERGES_FILE), specs)


def _unk_id(tokenizer, special: set[int]) -> int | None:
  """The id of ``tokenizer``'s unknown token (its model's ``unk_token``, or a Unigram
  model's ``unk_id`` read from its JSON), None without one or when it is one of
  ``special``."""
  name = getattr(tokenizer.model, "unk_token", None)
  unk = tokenizer.token_to_id(name) if name else None
  if unk is None and type(tokenizer.model).__name__ == "Unigram":
    unk = json.loads(tokenizer.to_str()).get("model", {}).get("unk_id")
  return None if unk is None or int(unk) in special else int(unk)


class HFTokenizer:
  """``tokenizers.Tokenizer`` with caller-given special ids and an optional chat template.

  ``vocab_size`` is the larger of the tokenizer's id range and the special
  ids + 1. ``decode`` stops at the first EOS (or any of ``stop_ids``) when
  ``stop_at_eos``, drops PAD, renders the other special tokens as their text
  (MASK as ``"<mask>"`` when the tokenizer has no token with that id) and ids
  the tokenizer does not know as ``"<unk_id_N>"``.
  """

  def __init__(self, tokenizer, *, mask_id: int, eos_id: int, pad_id: int,
               chat_template: str | None = None,
               special_tokens: dict[str, Any] | None = None,
               stop_ids: Sequence[int] = (), template_file: str = ""):
    """``template_file``: where ``chat_template`` was read, named by the ValueError of a
    template that does not compile."""
    ids = {"mask_id": mask_id, "eos_id": eos_id, "pad_id": pad_id}
    ids.update({f"stop_ids[{i}]": s for i, s in enumerate(stop_ids)})
    for name, value in ids.items():
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if mask_id in (eos_id, pad_id):
      raise ValueError(f"mask_id={mask_id} must differ from eos_id={eos_id} and "
                       f"pad_id={pad_id}")
    self._tok = tokenizer
    self._mask_id, self._eos_id, self._pad_id = int(mask_id), int(eos_id), int(pad_id)
    self._stop_ids = frozenset([self._eos_id, *map(int, stop_ids)])
    self._known = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    self._vocab_size = max(self._known, self._mask_id + 1, self._eos_id + 1,
                           self._pad_id + 1, *(s + 1 for s in self._stop_ids))
    self._unk_id = _unk_id(tokenizer, {self._mask_id, self._eos_id, self._pad_id})
    self._special_tokens = dict(special_tokens or {})
    self.chat_template = chat_template
    self._template = (_compile_template(chat_template, f"{template_file or 'the'} chat template")
                      if chat_template else None)

  @classmethod
  def from_dir(cls, path: str, *, mask_id: int, eos_id: int, pad_id: int,
               stop_ids: Sequence[int] = ()) -> "HFTokenizer":
    """Loads ``path/tokenizer_config.json`` and ``path/tokenizer.json`` (or, without
    it, the ``vocab.json`` + ``merges.txt`` layout of a supported ``tokenizer_class``).

    Raises FileNotFoundError naming the missing directory or file (and, without
    tokenizer.json, the supported classes); ValueError for a file that cannot be read.
    """
    if not os.path.isdir(path):
      raise FileNotFoundError(f"tokenizer directory {path!r} does not exist")
    tok_path = os.path.join(path, TOKENIZER_FILE)
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(tok_path) and not os.path.isfile(config_path):
      raise FileNotFoundError(f"tokenizer file {tok_path!r} does not exist")
    config = _read_json(config_path)
    special = {k: _token_text(config.get(k)) for k in _SPECIAL_KEYS}
    special["additional_special_tokens"] = [
        t for t in map(_token_text, config.get("additional_special_tokens") or []) if t]
    if os.path.isfile(tok_path):
      tokenizer = _load_tokenizer_json(tok_path)
    else:
      tokenizer = _build_from_vocab(path, config, special)
    template, template_file = _template_source(path, config)
    return cls(tokenizer, mask_id=mask_id, eos_id=eos_id, pad_id=pad_id,
               chat_template=template, special_tokens=special, stop_ids=stop_ids,
               template_file=template_file)

  @property
  def vocab_size(self) -> int:
    return self._vocab_size

  @property
  def pad_id(self) -> int:
    return self._pad_id

  @property
  def eos_id(self) -> int:
    return self._eos_id

  @property
  def mask_id(self) -> int:
    return self._mask_id

  @property
  def unk_id(self) -> int | None:
    """The id the tokenizer gives text its vocabulary lacks (its model's unknown token: a
    WordPiece, WordLevel, Unigram or non-byte-level BPE one); None without one (byte-level
    BPE encodes every character) or when it is the MASK, EOS or PAD id."""
    return self._unk_id

  def unknown_chars(self, text: str) -> list[str]:
    """The characters of ``text`` that became :attr:`unk_id`, distinct, in order of
    appearance: those of each span the tokenizer's offsets give an unknown token that (once
    normalized) appear in no token of the vocabulary, or the whole span when none does (a word
    a WordPiece vocabulary cannot split). Empty without an unknown token."""
    if self._unk_id is None:
      return []
    enc = self._tok.encode(text, add_special_tokens=False)
    spans = [text[start:end] for tok, (start, end) in zip(enc.ids, enc.offsets)
             if tok == self._unk_id]
    if not spans:
      return []
    vocab = set("".join(self._tok.get_vocab(with_added_tokens=True)))
    norm = self._tok.normalizer.normalize_str if self._tok.normalizer else (lambda c: c)
    found: list[str] = []
    for span in spans:
      lacking = [c for c in span if not set(norm(c)) <= vocab]
      found += [c for c in dict.fromkeys(lacking or [span]) if c not in found]
    return found

  def format_prompt(self, text: str, system: str = "") -> str:
    """``text`` as one user turn of the chat template (after a system turn when
    ``system``), ready for the assistant's reply. Without a chat template: ``text``,
    after ``system`` and a blank line when given."""
    if self._template is None:
      return f"{system}\n\n{text}" if system else text
    messages = [{"role": "system", "content": system}] if system else []
    return self._template.render(messages=messages + [{"role": "user", "content": text}],
                                 add_generation_prompt=True, **self._special_tokens)

  def encode(self, text: str) -> list[int]:
    """Token ids of ``text``; special-token strings in it become their ids, and
    no BOS/EOS is added."""
    return list(self._tok.encode(text, add_special_tokens=False).ids)

  def decode(self, ids: Sequence[int] | Iterable[int] | np.ndarray,
             stop_at_eos: bool = True) -> str:
    """Turns a 1-D sequence of ids (list or numpy array) back into text. Ids the
    tokenizer does not know, e.g. a model's padded embedding rows (Dream-7B has 152064
    rows for 151667 tokens), become ``<unk_id_N>``; a negative id is an error."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
      raise ValueError(f"decode expects a 1-D sequence of ids, got shape {arr.shape}")
    pieces: list[str] = []
    run: list[int] = []  # ids decoded together (byte-level BPE spans tokens)

    def flush():
      if run:
        pieces.append(self._tok.decode(run, skip_special_tokens=False))
        run.clear()

    for tok in arr.tolist():
      tok = int(tok)
      if tok < 0:
        raise ValueError(f"token id {tok} is negative")
      if stop_at_eos and tok in self._stop_ids:
        break
      if tok == self._pad_id and tok != self._eos_id:
        continue
      if tok < self._known and self._tok.id_to_token(tok) is not None:
        run.append(tok)
        continue
      flush()
      if tok == self._mask_id:
        pieces.append("<mask>")
      elif tok == self._eos_id:
        pieces.append("<eos>")
      else:
        pieces.append(f"<unk_id_{tok}>")
    flush()
    return "".join(pieces)
