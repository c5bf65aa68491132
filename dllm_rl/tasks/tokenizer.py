"""Character-level tokenizer shared by every built-in task.

Ids 0..2 are special (PAD, EOS, MASK); the rest is a fixed character set that
covers every task's prompts and answers. The vocabulary never depends on data,
so a checkpoint and a task always agree on it.
"""

from __future__ import annotations

import json
import string
from typing import Iterable, Sequence

import numpy as np

PAD_ID = 0
EOS_ID = 1
MASK_ID = 2
SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<eos>", "<mask>")

# Order is part of the checkpoint format: append only, never reorder.
CHARS: str = (string.digits + "+-*/()=,:;.?!" + " \n" + "<>|_" +
              string.ascii_lowercase + string.ascii_uppercase)


class CharTokenizer:
  """Maps text to ids one character per token.

  ``encode`` raises on characters outside the vocabulary (naming the character
  and its position); ``decode`` drops PAD, renders MASK as ``"<mask>"`` and
  stops at the first EOS when ``stop_at_eos`` (otherwise renders ``"<eos>"``).
  """

  def __init__(self):
    self._chars = CHARS
    self._to_id = {ch: i + len(SPECIAL_TOKENS) for i, ch in enumerate(CHARS)}
    assert len(self._to_id) == len(CHARS), "duplicate characters in CHARS"

  @property
  def vocab_size(self) -> int:
    return len(SPECIAL_TOKENS) + len(self._chars)

  @property
  def pad_id(self) -> int:
    return PAD_ID

  @property
  def eos_id(self) -> int:
    return EOS_ID

  @property
  def mask_id(self) -> int:
    return MASK_ID

  @property
  def chars(self) -> str:
    """The non-special characters, in id order (first id is 3)."""
    return self._chars

  def unknown(self, text: str) -> str | None:
    """The first character of ``text`` outside the vocabulary; None when it encodes."""
    return next((ch for ch in text if ch not in self._to_id), None)

  def encode(self, text: str) -> list[int]:
    """Returns one id per character; ValueError on an unknown character."""
    ids = []
    for pos, ch in enumerate(text):
      tok = self._to_id.get(ch)
      if tok is None:
        raise ValueError(f"character {ch!r} at position {pos} of {text[:60]!r} "
                         "is not in the CharTokenizer vocabulary")
      ids.append(tok)
    return ids

  def decode(self, ids: Sequence[int] | Iterable[int] | np.ndarray,
             stop_at_eos: bool = True) -> str:
    """Turns a 1-D sequence of ids (list or numpy array) back into text."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
      raise ValueError(f"decode expects a 1-D sequence of ids, got shape {arr.shape}")
    out = []
    for tok in arr.tolist():
      tok = int(tok)
      if tok == PAD_ID:
        continue
      if tok == EOS_ID:
        if stop_at_eos:
          break
        out.append(SPECIAL_TOKENS[EOS_ID])
      elif tok == MASK_ID:
        out.append(SPECIAL_TOKENS[MASK_ID])
      elif len(SPECIAL_TOKENS) <= tok < self.vocab_size:
        out.append(self._chars[tok - len(SPECIAL_TOKENS)])
      else:
        raise ValueError(f"token id {tok} is outside [0, {self.vocab_size})")
    return "".join(out)

  def hf_files(self) -> dict[str, str]:
    """``tokenizer.json`` and ``tokenizer_config.json`` (name → text) of a Hugging Face
    tokenizer with this vocabulary: the same id for every character and special token, one
    token per character (a BPE without merges), no chat template. An exported model
    trained with this tokenizer ships them, so ``dllm_rl.tasks.hf_tokenizer.HFTokenizer``
    (and ``transformers.AutoTokenizer``) encode and decode as this class does."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update(self._to_id)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.decoder = decoders.Fuse()
    pad, eos, mask = (SPECIAL_TOKENS[i] for i in (PAD_ID, EOS_ID, MASK_ID))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": pad,
              "eos_token": eos, "mask_token": mask, "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": tokenizer.to_str(pretty=True),
            "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}

