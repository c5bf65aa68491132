"""encode_examples layout and BatchIterator determinism / resume / coverage."""

import numpy as np
import pytest

from dllm_rl.tasks import CharTokenizer, Example, make_task
from dllm_rl.tasks.data import BatchIterator, TooLong, encode_examples


def test_encode_layout():
  tok = CharTokenizer()
  exs = [Example("12+3=", "51"), Example("1+1=", "2"), Example("", "")]
  out = encode_examples(exs, tok, prompt_len=6, completion_len=4)
  assert set(out) == {"prompt_BP", "prompt_valid_BP", "completion_BL", "completion_valid_BL"}
  assert out["prompt_BP"].dtype == np.int32 and out["completion_BL"].dtype == np.int32
  assert out["prompt_valid_BP"].dtype == bool and out["completion_valid_BL"].dtype == bool
  assert out["prompt_BP"].shape == (3, 6) and out["completion_BL"].shape == (3, 4)
  pad, eos = tok.pad_id, tok.eos_id
  np.testing.assert_array_equal(out["prompt_BP"][0], [pad] + tok.encode("12+3="))
  np.testing.assert_array_equal(out["prompt_BP"][1], [pad, pad] + tok.encode("1+1="))
  np.testing.assert_array_equal(out["prompt_BP"][2], [pad] * 6)
  np.testing.assert_array_equal(out["prompt_valid_BP"], out["prompt_BP"] != pad)
  np.testing.assert_array_equal(out["completion_BL"][0], tok.encode("51") + [eos, eos])
  np.testing.assert_array_equal(out["completion_BL"][1], tok.encode("2") + [eos] * 3)
  np.testing.assert_array_equal(out["completion_BL"][2], [eos] * 4)
  assert out["completion_valid_BL"].all()
  for b, ex in enumerate(exs):
    assert tok.decode(out["prompt_BP"][b]) == ex.prompt
    assert tok.decode(out["completion_BL"][b]) == ex.answer


def test_encode_length_errors_name_index_and_key():
  tok = CharTokenizer()
  exs = [Example("1=", "1"), Example("123+456=", "975")]
  with pytest.raises(ValueError, match=r"example 1: prompt has 8 tokens > data\.prompt_len=7"):
    encode_examples(exs, tok, prompt_len=7, completion_len=8)
  # The answer needs one EOS after it: 3 + 1 > 3.
  with pytest.raises(ValueError, match=r"example 1: answer has 3 tokens.*data\.completion_len=3"):
    encode_examples(exs, tok, prompt_len=8, completion_len=3)
  encode_examples(exs, tok, prompt_len=8, completion_len=4)  # exact fit is fine
  with pytest.raises(ValueError, match="position 0"):
    encode_examples([Example("é", "1")], tok, prompt_len=8, completion_len=4)


def test_a_prompt_too_long_is_named_by_its_file_line_and_the_longest_sets_the_key():
  """Read from a file, the prompt that does not fit is named where the user finds it; the
  longest of those that do not fit is named, with the value of the key that fits them all
  (what a user sets after one run, whichever example the shuffle put first)."""
  tok = CharTokenizer()
  exs = [Example("1+1=", "2", source="d.jsonl:3"), Example("12+34=", "46", source="d.jsonl:9"),
         Example("123+456=", "579", source="d.jsonl:58"), Example("1=", "1", source="d.jsonl:60")]
  with pytest.raises(TooLong, match=r"^d\.jsonl:58: prompt has 8 tokens > data\.prompt_len=5"
                     r" \(prompt '123\+456='\); 2 of the 4 prompts do not fit, this one is the"
                     r" longest: data\.prompt_len=8 fits them all$") as err:
    encode_examples(exs, tok, prompt_len=5, completion_len=8)
  assert err.value.key == "data.prompt_len"
  with pytest.raises(TooLong, match=r"^d\.jsonl:58: answer has 3 tokens \+ 1 EOS >"
                     r" data\.completion_len=3 .*: data\.completion_len=4 fits them all$") as err:
    encode_examples(exs, tok, prompt_len=8, completion_len=3)
  assert err.value.key == "data.completion_len"
  # the value that fits is one validation accepts: a multiple of the sampler's block length
  with pytest.raises(TooLong, match=r": data\.completion_len=8 fits them all \(a multiple of"
                     r" sampler\.block_len=8\)$"):
    encode_examples(exs, tok, prompt_len=8, completion_len=3, completion_multiple=8)
  # and the steps that suit it: 1 block of 2 at 3 steps per block -> 2 blocks need 6 steps
  with pytest.raises(TooLong, match=r": data\.completion_len=4 fits them all \(a multiple of"
                     r" sampler\.block_len=2\), with sampler\.steps=6 \(3 per block: the steps"
                     r" must be a multiple of its 2 blocks, and sampler\.steps=3 is not\)$"):
    encode_examples(exs, tok, prompt_len=8, completion_len=2, completion_multiple=2,
                    sampler_steps=3)
  with pytest.raises(TooLong, match=r"\(a multiple of sampler\.block_len=2\)$"):  # 2 suits 2
    encode_examples(exs, tok, prompt_len=8, completion_len=2, completion_multiple=2,
                    sampler_steps=2)


def test_encode_real_task():
  tok = CharTokenizer()
  exs = make_task("countdown", num_numbers=4).generate("train", 64, 0)
  out = encode_examples(exs, tok, prompt_len=16, completion_len=24)
  assert (out["prompt_BP"][:, -1] == tok.encode("=")[0]).all()  # prompts end aligned


def _arrays(n):
  return {"x": np.arange(n), "y": np.arange(n)[:, None] * np.ones((1, 3), int)}


def test_batches_consistent_and_epoch_coverage():
  it = BatchIterator(_arrays(10), batch_size=3, seed=0)
  assert it.batches_per_epoch == 3
  seen = []
  for _ in range(3):
    batch = next(it)
    np.testing.assert_array_equal(batch["y"][:, 0], batch["x"])
    assert batch["x"].shape == (3,) and batch["y"].shape == (3, 3)
    seen += batch["x"].tolist()
  assert len(set(seen)) == 9 and it.position == 3 and it.epoch == 1  # one row dropped
  epoch1 = np.concatenate([next(it)["x"] for _ in range(3)])
  assert len(set(epoch1.tolist())) == 9
  assert epoch1.tolist() != seen  # reshuffled per epoch
  # Over many epochs every row is served.
  it = BatchIterator(_arrays(10), batch_size=3, seed=0)
  assert set(np.concatenate([next(it)["x"] for _ in range(30)]).tolist()) == set(range(10))


def test_exact_epoch_is_a_permutation():
  it = BatchIterator(_arrays(12), batch_size=4, seed=7)
  for _ in range(4):
    rows = np.concatenate([next(it)["x"] for _ in range(3)])
    assert sorted(rows.tolist()) == list(range(12))


def test_resume_equals_uninterrupted():
  arrays = _arrays(17)
  ref = BatchIterator(arrays, batch_size=4, seed=3)
  ref_batches = [next(ref)["x"] for _ in range(20)]
  for k in (0, 1, 4, 5, 13):
    resumed = BatchIterator(arrays, batch_size=4, seed=3, position=k)
    for j in range(k, 20):
      np.testing.assert_array_equal(next(resumed)["x"], ref_batches[j])
    assert resumed.position == 20
  other = BatchIterator(arrays, batch_size=4, seed=4)
  assert any((next(other)["x"] != b).any() for b in ref_batches[:4])


def test_iterator_errors():
  with pytest.raises(ValueError, match="batch_size"):
    BatchIterator(_arrays(4), batch_size=5, seed=0)
  with pytest.raises(ValueError, match="leading sizes"):
    BatchIterator({"a": np.zeros(3), "b": np.zeros(4)}, batch_size=1, seed=0)
  with pytest.raises(ValueError, match="at least one"):
    BatchIterator({}, batch_size=1, seed=0)


def test_a_prompt_or_answer_holding_the_mask_token_is_named(tmp_path):
  """An HF tokenizer turns a special token's text into its id: the mask token written in the
  data would be a position for the sampler to fill (and an SFT target); named, not encoded."""
  from dllm_rl.tasks.hf_tokenizer import HFTokenizer
  from tests.helpers import hf_fixture_with_tokenizer
  tok = HFTokenizer.from_dir(str(hf_fixture_with_tokenizer(tmp_path)), mask_id=126, eos_id=125,
                             pad_id=125)
  good = Example("1+1=", "2", source="d.jsonl:1")
  for bad, what in ((Example("1+<|mdm_mask|>=", "2", source="d.jsonl:7"), "prompt"),
                    (Example("1+1=", "<|mdm_mask|>", source="d.jsonl:7"), "answer")):
    with pytest.raises(ValueError, match=rf"^d\.jsonl:7: the {what} holds the mask token"
                                         r" \(id 126, '<\|mdm_mask\|>'\)"):
      encode_examples([good, bad], tok, prompt_len=16, completion_len=16)
  # config.json's mask id is the tokenizer's "a" (config.json and tokenizer of two models):
  # the message shows the text, not only an id that plain text cannot seem to hold
  other = HFTokenizer.from_dir(str(tmp_path / "llada_tiny"), mask_id=10, eos_id=125, pad_id=125)
  with pytest.raises(ValueError, match=r"^d\.jsonl:1: the prompt holds the mask token \(id 10,"
                                       r" 'a'\) in 'a\+1=': .*config.json names another"
                                       r" mask_token_id than its tokenizer's"):
    encode_examples([Example("a+1=", "2", source="d.jsonl:1")], other, prompt_len=16,
                    completion_len=16)
  assert encode_examples([good], tok, prompt_len=16, completion_len=16)["prompt_BP"].shape == (
      1, 16)
