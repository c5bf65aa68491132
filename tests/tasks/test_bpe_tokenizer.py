"""The vocab.json + merges.txt layout on a tiny hand-written byte-level BPE:
added tokens land at their recorded ids or fail loudly, unsupported classes and
missing files are named, tokenizer.json keeps precedence."""

import json

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from dllm_rl.tasks import bpe_tokenizer as bpe  # noqa: E402
from dllm_rl.tasks.hf_tokenizer import HFTokenizer  # noqa: E402

VOCAB = {"a": 0, "b": 1, "Ġ": 2, "ab": 3, "Ġab": 4, "1": 5, "Ċ": 6}
MERGES = "#version: 0.2\na b\nĠ ab\n"
DECODER = {"7": {"content": "<|x|>", "special": True},
           "8": {"content": "<y>", "special": False, "normalized": False}}


def _write(path, tokenizer_class="Qwen2Tokenizer", decoder=None, added_json=None, **extra):
  (path / bpe.VOCAB_FILE).write_text(json.dumps(VOCAB), encoding="utf-8")
  (path / bpe.MERGES_FILE).write_text(MERGES, encoding="utf-8")
  config = {"tokenizer_class": tokenizer_class, "eos_token": "<|x|>",
            "added_tokens_decoder": DECODER if decoder is None else decoder, **extra}
  (path / "tokenizer_config.json").write_text(json.dumps(config))
  if added_json is not None:
    (path / bpe.ADDED_TOKENS_FILE).write_text(json.dumps(added_json))
  return path


def _load(path, mask_id=9):
  return HFTokenizer.from_dir(str(path), mask_id=mask_id, eos_id=7, pad_id=7)


@pytest.mark.parametrize("name", bpe.SUPPORTED_CLASSES)
def test_builds_at_recorded_ids(tmp_path, name):
  tok = _load(_write(tmp_path, name, added_json={"<|x|>": 7, "<z>": 9}))
  assert tok.vocab_size == 10
  assert tok.encode("ab ab") == [3, 4]
  assert tok.encode("ab<|x|>ab<y>11\n") == [3, 7, 3, 8, 5, 5, 6]
  assert tok.encode("<z>") == [9] and tok.decode([9]) == "<z>"
  assert tok.decode([3, 4, 8, 7, 3]) == "ab ab<y>"


def test_added_token_specs():
  specs = bpe.added_token_specs(DECODER, {"<|x|>": 7, "<z>": 10, "<s>": 9}, ["<s>"])
  assert [(tid, s["content"], s["special"], s["normalized"]) for tid, s in specs] == [
      (7, "<|x|>", True, False), (8, "<y>", False, False), (9, "<s>", True, False),
      (10, "<z>", False, True)]
  with pytest.raises(ValueError, match="added_tokens_decoder puts"):
    bpe.added_token_specs(DECODER, {"<w>": 7})
  with pytest.raises(ValueError, match="two ids"):
    bpe.added_token_specs(DECODER, {"<y>": 9})
  with pytest.raises(ValueError, match="not an integer"):
    bpe.added_token_specs({"seven": {"content": "<|x|>"}}, None)
  with pytest.raises(ValueError, match="non-negative"):
    bpe.added_token_specs(None, {"<w>": -1})


def test_ids_that_cannot_be_honoured(tmp_path):
  with pytest.raises(ValueError, match="should have id 12"):
    _load(_write(tmp_path, decoder={"12": {"content": "<gap>", "special": True}}))
  # An added token naming a vocab.json entry keeps that entry's id ...
  assert _load(_write(tmp_path, decoder={"3": {"content": "ab"}})).encode("ab") == [3]
  # ... and cannot be moved elsewhere.
  with pytest.raises(ValueError, match="'ab' should have id 7"):
    _load(_write(tmp_path, decoder={"7": {"content": "ab"}}))


def test_unsupported_class_and_missing_files(tmp_path):
  for name in ("LlamaTokenizer", None):
    with pytest.raises(FileNotFoundError, match="tokenizer.json") as err:
      _load(_write(tmp_path, name))
    assert "Qwen2Tokenizer" in str(err.value) and repr(name) in str(err.value)
  _write(tmp_path)
  (tmp_path / bpe.MERGES_FILE).unlink()
  with pytest.raises(FileNotFoundError, match="merges.txt"):
    _load(tmp_path)


def test_tokenizer_json_takes_precedence(tmp_path):
  raw = bpe.qwen2_tokenizer(str(_write(tmp_path) / bpe.VOCAB_FILE),
                            str(tmp_path / bpe.MERGES_FILE), [])
  raw.add_special_tokens(["<only-in-json>"])
  raw.save(str(tmp_path / "tokenizer.json"))
  (tmp_path / bpe.VOCAB_FILE).unlink()
  tok = _load(tmp_path, mask_id=20)
  assert tok.encode("<only-in-json>") == [7] and tok.encode("ab ab") == [3, 4]
