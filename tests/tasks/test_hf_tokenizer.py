"""HFTokenizer over a small byte-level BPE built here: round trips, caller-given
special ids, chat template rendering (sandboxed), missing-file errors."""

import json

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from tokenizers.trainers import BpeTrainer  # noqa: E402

from dllm_rl.tasks.base import Example  # noqa: E402
from dllm_rl.tasks.data import encode_examples  # noqa: E402
from dllm_rl.tasks.hf_tokenizer import HFTokenizer  # noqa: E402
from dllm_rl.config import ConfigError  # noqa: E402
from dllm_rl.train.context import _encode  # noqa: E402
from tests.helpers import tiny_run_config  # noqa: E402

SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>"]
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
            "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
CORPUS = ["the answer is 42", "Natalia sold clips to 48 of her friends", "héllo wörld 日本",
          "What is 3 + 5? #### 8", "\\boxed{\\frac{1}{2}}"] * 20


def _save(path, template=TEMPLATE, config_extra=None):
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(CORPUS, trainer)
  tok.save(str(path / "tokenizer.json"))
  config = {"bos_token": "<|bos|>", "eos_token": {"content": "<|eos|>", "special": True},
            "pad_token": "<|pad|>"}
  if template is not None:
    config["chat_template"] = template
  config.update(config_extra or {})
  (path / "tokenizer_config.json").write_text(json.dumps(config))
  return tok


@pytest.fixture
def tok_dir(tmp_path):
  raw = _save(tmp_path)
  return tmp_path, raw


def _load(path, raw, mask_id=1000, **kw):
  return HFTokenizer.from_dir(str(path), mask_id=mask_id, eos_id=raw.token_to_id("<|eos|>"),
                              pad_id=raw.token_to_id("<|pad|>"), **kw)


def test_round_trip_and_caller_ids(tok_dir):
  path, raw = tok_dir
  tok = _load(path, raw)
  assert (tok.pad_id, tok.eos_id, tok.mask_id) == (0, 2, 1000)
  # The mask id is the caller's (beyond the tokenizer's vocabulary here).
  assert raw.get_vocab_size() < 1000 and tok.vocab_size == 1001
  for text in ["the answer is 42", "héllo wörld 日本 ✓", "  spaces\n\nand\ttabs ", ""]:
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode(np.asarray(ids + [tok.eos_id, 7, 8])) == text
  ids = tok.encode("the answer")
  # PAD dropped, MASK rendered, stop at EOS unless asked not to.
  seq = [tok.pad_id] + ids + [tok.mask_id] + ids + [tok.eos_id] + ids
  assert tok.decode(seq) == "the answer<mask>the answer"
  assert tok.decode(seq, stop_at_eos=False) == (
      "the answer<mask>the answer<|eos|>the answer")
  assert tok.decode([999]) == "<unk_id_999>"
  # Above the tokenizer's ids: a model's padded embedding rows (Dream-7B: 152064 rows,
  # 151667 tokens) can be sampled; they decode like unknown ids instead of stopping a run.
  assert tok.decode([1001]) == "<unk_id_1001>"
  with pytest.raises(ValueError, match="negative"):
    tok.decode([-1])
  with pytest.raises(ValueError, match="1-D"):
    tok.decode(np.zeros((2, 2), int))


def test_ids_inside_the_vocabulary_and_stop_ids(tok_dir):
  path, raw = tok_dir
  user = raw.token_to_id("<|user|>")
  tok = _load(path, raw, mask_id=user, stop_ids=[raw.token_to_id("<|assistant|>")])
  assert tok.mask_id == user and tok.vocab_size == raw.get_vocab_size()
  ids = tok.encode("the answer")
  assert tok.decode(ids + [user]) == "the answer<|user|>"
  assert tok.decode(ids + tok.encode("<|assistant|>") + ids) == "the answer"
  with pytest.raises(ValueError, match="must differ"):
    _load(path, raw, mask_id=raw.token_to_id("<|eos|>"))
  with pytest.raises(ValueError, match="non-negative"):
    _load(path, raw, mask_id=-1)


def test_chat_template(tok_dir):
  path, raw = tok_dir
  tok = _load(path, raw)
  prompt = tok.format_prompt("What is 3 + 5?")
  assert prompt == "<|bos|><|user|>What is 3 + 5?<|eos|><|assistant|>"
  ids = tok.encode(prompt)
  # Template special tokens become their ids; no BOS/EOS added by encode.
  assert ids[0] == raw.token_to_id("<|bos|>") and ids[1] == raw.token_to_id("<|user|>")
  assert ids[-1] == raw.token_to_id("<|assistant|>") and ids.count(tok.eos_id) == 1
  batch = encode_examples([Example(prompt=prompt, answer="#### 8")], tok, 32, 8)
  assert batch["prompt_BP"][0, -1] == raw.token_to_id("<|assistant|>")
  assert batch["prompt_BP"][0, 0] == tok.pad_id
  assert tok.decode(batch["completion_BL"][0]) == "#### 8"


def test_template_sources(tmp_path):
  (tmp_path / "a").mkdir()
  raw = _save(tmp_path / "a", template=None)
  assert _load(tmp_path / "a", raw).format_prompt("hi {x}") == "hi {x}"
  (tmp_path / "b").mkdir()
  raw = _save(tmp_path / "b",
              template=[{"name": "tool_use", "template": "T"},
                        {"name": "default", "template": "D{{ messages[0].content }}"}])
  assert _load(tmp_path / "b", raw).format_prompt("hi") == "Dhi"
  (tmp_path / "b" / "chat_template.jinja").write_text("J{{ messages[0]['content'] }}")
  assert _load(tmp_path / "b", raw).format_prompt("hi") == "Jhi"


def test_template_is_sandboxed(tmp_path):
  import jinja2
  raw = _save(tmp_path, template="{{ ''.__class__.__mro__[1].__subclasses__() }}")
  with pytest.raises(jinja2.exceptions.SecurityError):
    _load(tmp_path, raw).format_prompt("x")
  raw = _save(tmp_path, template="{{ raise_exception('only user turns') }}")
  with pytest.raises(jinja2.exceptions.TemplateError, match="only user turns"):
    _load(tmp_path, raw).format_prompt("x")


def test_a_template_that_needs_a_system_turn_names_the_checkpoint(tmp_path):
  """A template that rejects one user turn (its raise_exception) stopped the run with a Jinja
  traceback; it is a ConfigError on model.hf_checkpoint naming the split and the key that adds
  a system turn."""
  raw = _save(tmp_path, template="{% if messages[0]['role'] != 'system' %}"
                                 "{{ raise_exception('System message required') }}{% endif %}"
                                 "{{ messages[-1]['content'] }}")
  tok = _load(tmp_path, raw)
  config = tiny_run_config("eval", {"data.prompt_len": 32})
  with pytest.raises(ConfigError, match=r"^config\.model\.hf_checkpoint: its chat template fails"
                                        r" on a prompt of the test split of task 'arithmetic'"
                                        r" \(one user turn\): TemplateError: System message"
                                        r" required \(data\.system_prompt gives"):
    _encode([Example(prompt="hi", answer="")], tok, config, "test")
  config.data.system_prompt = "Be brief."
  encoded = _encode([Example(prompt="hi", answer="")], tok, config, "test")
  assert encoded["prompt_BP"].shape == (1, 32)


def test_a_template_that_does_not_compile_names_its_file(tmp_path):
  """A syntax error or an unknown filter was a bare Jinja traceback at load; a ValueError
  naming the file it came from (chat_template.jinja wins over tokenizer_config.json)."""
  raw = _save(tmp_path, template="{% for m in messages %}{{ m['content'] }}{% endfor")
  with pytest.raises(ValueError, match=rf"^{tmp_path}/tokenizer_config.json's chat template does"
                                       r" not compile as Jinja \(TemplateSyntaxError: unexpected"
                                       r" end of template.*, template line 1\)$"):
    _load(tmp_path, raw)
  (tmp_path / "chat_template.jinja").write_text("\n{{ messages[0].content | shout }}")
  with pytest.raises(ValueError, match=rf"^{tmp_path}/chat_template.jinja chat template does not"
                                       r" compile as Jinja \(TemplateAssertionError: No filter"
                                       r" named 'shout'.*, template line 2\)$"):
    _load(tmp_path, raw)


def test_the_generation_tag_renders_its_body(tmp_path):
  """transformers' {% generation %} block (assistant-token masks in training templates) is
  its body, as transformers renders it; it did not compile ("unknown tag 'generation'")."""
  raw = _save(tmp_path, template="{% for m in messages %}{% if m['role'] == 'assistant' %}"
                                 "{% generation %}A:{{ m['content'] }}{% endgeneration %}"
                                 "{% else %}U:{{ m['content'] }}{% endif %}{% endfor %}"
                                 "{% if add_generation_prompt %}|A:{% endif %}")
  assert _load(tmp_path, raw).format_prompt("hi") == "U:hi|A:"
  tok = _load(tmp_path, raw)
  assert tok._template.render(messages=[{"role": "assistant", "content": "x"}]) == "A:x"


def test_missing_files_are_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="nowhere"):
    HFTokenizer.from_dir(str(tmp_path / "nowhere"), mask_id=3, eos_id=1, pad_id=0)
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    HFTokenizer.from_dir(str(tmp_path), mask_id=3, eos_id=1, pad_id=0)
  raw = _save(tmp_path)
  (tmp_path / "tokenizer_config.json").unlink()
  with pytest.raises(FileNotFoundError, match="tokenizer_config.json"):
    _load(tmp_path, raw)
  (tmp_path / "tokenizer_config.json").write_text("{not json")
  with pytest.raises(ValueError, match="tokenizer_config.json"):
    _load(tmp_path, raw)


def test_system_turn(tok_dir):
  """data.system_prompt: a system turn before the user turn; no template: a blank line."""
  path, raw = tok_dir
  tok = _load(path, raw)
  assert tok.format_prompt("What is 3 + 5?", system="Be brief.") == (
      "<|bos|><|system|>Be brief.<|eos|><|user|>What is 3 + 5?<|eos|><|assistant|>")
  (path / "plain").mkdir()
  plain = _load(path / "plain", _save(path / "plain", template=None))
  assert plain.format_prompt("hi", system="Be brief.") == "Be brief.\n\nhi"
  assert plain.format_prompt("hi") == "hi"


def test_a_template_without_a_system_role_names_the_key(tmp_path):
  raw = _save(tmp_path, template="{% if messages[0]['role'] == 'system' %}"
                                 "{{ raise_exception('System role not supported') }}{% endif %}"
                                 "{{ messages[-1]['content'] }}")
  tok = _load(tmp_path, raw)
  config = tiny_run_config("eval", {"data.prompt_len": 32, "data.system_prompt": "Be brief."})
  with pytest.raises(ConfigError, match=r"config\.data\.system_prompt: the chat template .* "
                                        "rejects a system turn: System role not supported"):
    _encode([Example(prompt="hi", answer="")], tok, config, "test")
  config.data.system_prompt = ""
  encoded = _encode([Example(prompt="hi", answer="")], tok, config, "test")
  assert encoded["prompt_BP"].shape == (1, 32)


def test_the_unknown_token_and_the_characters_that_became_it(tok_dir):
  """unk_id: the model's unknown token (BPE, WordPiece, Unigram), None for byte-level BPE
  (every character encodes); unknown_chars: the characters of the text that became it (a
  WordPiece word it cannot split: the characters in no vocabulary token, after the
  normalizer), which the data checks name (train/run_notes.unknown_token_notes)."""
  from tokenizers import normalizers
  path, raw = tok_dir
  assert _load(path, raw).unk_id is None and _load(path, raw).unknown_chars("日本€") == []
  bpe = Tokenizer(models.BPE(vocab={**{c: i for i, c in enumerate("abc ")}, "<u>": 9},
                             merges=[], unk_token="<u>"))
  tok = HFTokenizer(bpe, mask_id=20, eos_id=21, pad_id=22)
  assert tok.unk_id == 9 and tok.encode("abé c€é") == [0, 1, 9, 3, 2, 9, 9]
  assert tok.unknown_chars("abé c€é") == ["é", "€"] and tok.unknown_chars("ab c") == []
  wordpiece = Tokenizer(models.WordPiece(vocab={"[UNK]": 0, "ab": 1, "c": 2, "é": 3},
                                         unk_token="[UNK]"))
  wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
  wordpiece.normalizer = normalizers.Lowercase()
  tok = HFTokenizer(wordpiece, mask_id=20, eos_id=21, pad_id=22)
  assert tok.unknown_chars("AB abx é zz Abc") == ["x", "z", "Abc"]  # "Abc": no "##c" piece
  unigram = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), ("b", -1.0)], unk_id=0,
                                     byte_fallback=False))
  tok = HFTokenizer(unigram, mask_id=20, eos_id=21, pad_id=22)
  assert tok.unk_id == 0 and tok.unknown_chars("abxa") == ["x"]
  assert HFTokenizer(unigram, mask_id=20, eos_id=0, pad_id=22).unk_id is None  # the EOS id
