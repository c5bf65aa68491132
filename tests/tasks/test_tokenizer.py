"""CharTokenizer: round trip, special ids, errors."""

import numpy as np
import pytest

from dllm_rl.tasks import CharTokenizer


def test_special_ids_and_vocab():
  tok = CharTokenizer()
  assert (tok.pad_id, tok.eos_id, tok.mask_id) == (0, 1, 2)
  assert tok.vocab_size == 3 + len(tok.chars)
  assert len(set(tok.chars)) == len(tok.chars)
  ids = tok.encode(tok.chars)
  assert ids == list(range(3, tok.vocab_size))


def test_round_trip_all_characters():
  tok = CharTokenizer()
  text = "12+34=|_<>?!;:.,()*/-\n Hello World"
  assert tok.decode(tok.encode(text)) == text
  assert tok.decode(np.asarray(tok.encode(text), np.int32)) == text


def test_unknown_character_names_char_and_position():
  tok = CharTokenizer()
  with pytest.raises(ValueError, match=r"'\^' at position 2"):
    tok.encode("1+^2")
  with pytest.raises(ValueError, match="position 0"):
    tok.encode("é")


def test_decode_specials():
  tok = CharTokenizer()
  a, b = tok.encode("ab")
  ids = [tok.pad_id, a, tok.mask_id, b, tok.eos_id, a, tok.pad_id]
  assert tok.decode(ids) == "a<mask>b"
  assert tok.decode(ids, stop_at_eos=False) == "a<mask>b<eos>a"
  assert tok.decode([]) == ""
  assert tok.decode([tok.eos_id, a]) == ""


def test_decode_rejects_bad_ids_and_shapes():
  tok = CharTokenizer()
  with pytest.raises(ValueError, match="outside"):
    tok.decode([tok.vocab_size])
  with pytest.raises(ValueError, match="1-D"):
    tok.decode(np.zeros((2, 2), np.int32))
