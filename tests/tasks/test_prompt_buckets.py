"""data.prompt_buckets: batches cut to the smallest bucket holding their prompts, same tokens."""

import jax
import numpy as np
import pytest

from dllm_rl.train import evaluation
from dllm_rl.config import ConfigError, base_config
from dllm_rl.train.validate import validate
from dllm_rl.models import transformer as T
from dllm_rl.sampling.sampler import SamplerConfig
from dllm_rl.tasks.data import bucket_width, trim_to_bucket
from tests.helpers import small_model


def _left_padded(lengths, p):
  valid = np.zeros((len(lengths), p), bool)
  for i, n in enumerate(lengths):
    valid[i, p - n:] = True
  tokens = np.where(valid, np.arange(p)[None, :] % 20 + 3, 0).astype(np.int32)
  return tokens, valid


def test_bucket_width_is_the_smallest_that_holds_the_batch():
  _, valid = _left_padded([3, 5], 16)
  assert bucket_width(valid, (4, 8, 12)) == 8
  assert bucket_width(valid, (5,)) == 5
  assert bucket_width(valid, (2, 4)) == 16  # none holds it: the full width
  assert bucket_width(valid, ()) == 16


def test_trim_drops_only_padding_and_reports_the_padding_fraction():
  tokens, valid = _left_padded([3, 5], 16)
  out, pad = trim_to_bucket({"prompt_BP": tokens, "prompt_valid_BP": valid, "index": [0, 1]},
                            (8, 12))
  assert out["prompt_BP"].shape == (2, 8) and out["index"] == [0, 1]
  np.testing.assert_array_equal(out["prompt_BP"], tokens[:, -8:])
  assert out["prompt_valid_BP"].sum() == valid.sum()
  assert pad == pytest.approx(1 - 8 / 16)
  with pytest.raises(ValueError, match="left-padded"):
    trim_to_bucket({"prompt_BP": tokens, "prompt_valid_BP": valid[:, ::-1]}, (8,))


def test_bucketed_generation_gives_the_same_tokens():
  cfg = small_model(vocab_size=24)
  graphdef, params = T.init_model(cfg, jax.random.key(0))
  tokens, valid = _left_padded([2, 3, 4, 3, 7, 8, 6, 5], 12)
  fn = evaluation.make_sample_fn(graphdef, SamplerConfig(completion_len=8, steps=4, block_len=4),
                                 mask_id=2, eos_id=1)
  full = evaluation.generate(fn, params, tokens, valid, jax.random.key(1), 4)
  bucketed = evaluation.generate(fn, params, tokens, valid, jax.random.key(1), 4, (4, 8))
  np.testing.assert_array_equal(bucketed, full)
  assert fn._cache_size() == 3  # widths 12 (unbucketed), 4 and 8


def test_buckets_are_validated():
  c = base_config()
  c.data.prompt_buckets = (8, 4)
  with pytest.raises(ConfigError, match="data.prompt_buckets"):
    validate(c)
  c.data.prompt_buckets = (4, 32)  # > data.prompt_len = 16
  with pytest.raises(ConfigError, match="data.prompt_buckets"):
    validate(c)
  c.data.prompt_buckets = (4, 8)
  validate(c)
