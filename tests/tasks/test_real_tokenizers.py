"""HFTokenizer on the real tokenizer files of the model zoo (tests/fixtures/arch/).

Dream-v0-Instruct-7B ships the Qwen2 slow layout (vocab.json + merges.txt +
added tokens, no tokenizer.json): it is built by dllm_rl.tasks.bpe_tokenizer.
Expected ids are read from the checkpoint's own files (vocab.json, config.json,
added_tokens_decoder), never from the code under test. LLaDA2.0-mini has no
tokenizer.json (absent from the source snapshot): only its chat template and
special-token strings can be checked, and from_dir must say what is missing.
"""

import json
import os

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from tokenizers import Tokenizer, models  # noqa: E402

from dllm_rl.tasks.hf_tokenizer import HFTokenizer  # noqa: E402

ARCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "fixtures", "arch")
DREAM = os.path.join(ARCH, "dream_v0_instruct_7b")
LLADA2 = os.path.join(ARCH, "llada2_mini")


def _json(*parts):
  with open(os.path.join(*parts), encoding="utf-8") as f:
    return json.load(f)


@pytest.fixture(scope="module")
def dream():
  """(tokenizer, config.json, vocab.json, added id by content) for Dream."""
  config = _json(DREAM, "config.json")
  tok = HFTokenizer.from_dir(DREAM, mask_id=config["mask_token_id"],
                             eos_id=config["eos_token_id"], pad_id=config["pad_token_id"])
  decoder = _json(DREAM, "tokenizer_config.json")["added_tokens_decoder"]
  added = {entry["content"]: int(tid) for tid, entry in decoder.items()}
  return tok, config, _json(DREAM, "vocab.json"), added


def test_dream_vocabulary_and_special_ids(dream):
  tok, config, vocab, added = dream
  assert len(vocab) == 151643 and len(added) == 24
  assert tok.vocab_size == 151667 <= config["vocab_size"]
  assert (tok.mask_id, tok.eos_id, tok.pad_id) == (151666, 151643, 151643)
  assert tok.encode("<|mask|>") == [config["mask_token_id"]] == [added["<|mask|>"]]
  assert tok.encode("<|endoftext|>") == [config["eos_token_id"]] == [config["pad_token_id"]]
  # The tokenizer's own BOS is <|beginoftext|> (151665); config.json's
  # bos_token_id is 151643 (= eos). Neither is added by encode.
  assert tok.encode("<|beginoftext|>") == [151665] != [config["bos_token_id"]]
  for content, tid in added.items():
    assert tok.encode(content) == [tid], content
  assert (added["<|im_start|>"], added["<|im_end|>"]) == (151644, 151645)
  # added_tokens.json agrees with added_tokens_decoder.
  assert _json(DREAM, "added_tokens.json") == added


def test_dream_known_ids_from_vocab(dream):
  tok, _, vocab, _ = dream
  assert tok.encode("Hello") == [vocab["Hello"]]
  assert tok.encode("Hello world") == [vocab["Hello"], vocab["Ġworld"]]
  assert tok.encode("I'll") == [vocab["I"], vocab["'ll"]]
  assert tok.encode("You are a helpful assistant.") == [
      vocab[t] for t in ("You", "Ġare", "Ġa", "Ġhelpful", "Ġassistant", ".")]
  # \p{N} is split one digit per token, the space before a digit stands alone.
  assert tok.encode("2024") == [vocab[d] for d in "2024"]
  assert tok.encode("x 12") == [vocab["x"], vocab["Ġ"], vocab["1"], vocab["2"]]
  # \s+(?!\S) leaves the last space to the word; newline runs are one piece.
  assert tok.encode("   x") == [vocab["ĠĠ"], vocab["Ġx"]]
  assert tok.encode("\n\n\n") == [vocab["ĊĊĊ"]]


def test_dream_round_trips(dream):
  tok, _, _, _ = dream
  for text in ["The answer is 42.", "naïve 数学 🙂", "1234567890", "a\n\n\nb \t c  \n ",
               "  leading and trailing  ", "<|im_start|>user\nhi<|im_end|>", "", "🙂🙂",
               "def f(x):\n    return x ** 2\n"]:
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids, stop_at_eos=False) == text
  assert len(tok.encode("9876543210")) == 10
  # NFC: a decomposed é encodes as the composed one.
  assert tok.encode("cafe\u0301") == tok.encode("caf\u00e9")
  assert tok.decode(tok.encode("cafe\u0301")) == "caf\u00e9"
  # Decoding stops at EOS and renders the mask token by name.
  ids = tok.encode("hi") + [tok.mask_id] + [tok.eos_id] + tok.encode("after")
  assert tok.decode(ids) == "hi<|mask|>"


def test_dream_chat_template(dream):
  tok, _, vocab, added = dream
  prompt = tok.format_prompt("What is 2+2?")
  assert prompt == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
  start, end, nl = added["<|im_start|>"], added["<|im_end|>"], vocab["Ċ"]
  expected = ([start, vocab["system"], nl] + tok.encode("You are a helpful assistant.")
              + [end, nl, start, vocab["user"], nl] + tok.encode("What is 2+2?")
              + [end, nl, start, vocab["assistant"], nl])
  ids = tok.encode(prompt)
  assert ids == expected
  assert [i for i, t in enumerate(ids) if t == start] == [0, 11, 23]
  assert [i for i, t in enumerate(ids) if t == end] == [9, 21]
  assert tok.decode(ids) == prompt


def test_llada2_special_tokens_and_ids():
  config = _json(LLADA2, "config.json")
  tok_config = _json(LLADA2, "tokenizer_config.json")
  special_map = _json(LLADA2, "special_tokens_map.json")
  for source in (tok_config, special_map):
    assert source["eos_token"] == source["pad_token"] == "<|endoftext|>"
    assert source["mask_token"] == "<|mask|>"
    assert source["bos_token"] == "<|startoftext|>"
  assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
  # config.json has only the pad id; eos = pad and mask = 156895 are the
  # defaults of the official generate() (fixtures/llada2_moe_tiny/README.md).
  assert config["pad_token_id"] == 156892 and config["vocab_size"] == 157184
  assert "eos_token_id" not in config and "mask_token_id" not in config
  assert not os.path.exists(os.path.join(LLADA2, "tokenizer.json"))


def test_llada2_chat_template():
  template = _json(LLADA2, "tokenizer_config.json")["chat_template"]
  # No tokenizer.json: the template is rendered through an empty model.
  tok = HFTokenizer(Tokenizer(models.BPE()), mask_id=156895, eos_id=156892, pad_id=156892,
                    chat_template=template)
  assert tok.format_prompt("What is 2+2?") == (
      "<role>SYSTEM</role>detailed thinking off<|role_end|>"
      "<role>HUMAN</role>What is 2+2?<|role_end|><role>ASSISTANT</role>")


def test_llada2_from_dir_names_the_missing_file():
  with pytest.raises(FileNotFoundError) as err:
    HFTokenizer.from_dir(LLADA2, mask_id=156895, eos_id=156892, pad_id=156892)
  message = str(err.value)
  assert "tokenizer.json" in message and "PreTrainedTokenizerFast" in message
  assert "Qwen2Tokenizer" in message and "DreamTokenizer" in message
