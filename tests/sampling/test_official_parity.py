"""The default masked sampler reproduces the official LLaDA ``generate`` token for token.

tests/fixtures/llada_tiny/sampler_parity.npz (README there, "Sampler parity data") holds the
outputs of ML-GSAI/LLaDA ``generate.py`` (greedy, ``low_confidence``) on the tiny fixture
checkpoint for four shapes. The official code proposes x0 = argmax over the whole vocabulary
(mask token included) and scores it with the softmax over the whole vocabulary; dropping the
mask token renormalises the confidences and changes a row of shape ``a``. Rows are compared up
to and including their first EOS (the official code does not stop there).
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.models import hf
from dllm_rl.sampling import sampler as S

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                       "llada_tiny")


@pytest.fixture(scope="module")
def checkpoint():
  _, ids, graphdef, params, _ = hf.load_checkpoint(FIXTURE)
  return ids, graphdef, params, np.load(os.path.join(FIXTURE, "sampler_parity.npz"))


def _sample(checkpoint, shape, **overrides):
  ids, graphdef, params, data = checkpoint
  b, p, l, steps, block = (int(v) for v in data[f"{shape}_params"])
  prompt_BP = jnp.asarray(data[f"{shape}_prompt"], jnp.int32)
  assert prompt_BP.shape == (b, p)
  cfg = S.SamplerConfig(completion_len=l, steps=steps, block_len=block, temperature=0.0,
                        remasking="low_confidence", stop_at_eos=False, **overrides)
  fn = jax.jit(functools.partial(S.sample, graphdef, cfg=cfg, mask_id=ids.mask_id,
                                 eos_id=ids.eos_id))
  with jax.default_matmul_precision("highest"):
    out = fn(params, prompt_BP, jnp.ones((b, p), bool), jax.random.key(0))
  return np.asarray(out.completion_BL), data[f"{shape}_output"][:, p:], ids.eos_id


def _rows_differing(got_BL, official_BL, eos_id):
  """Rows whose tokens differ from the official row up to and including its first EOS."""
  bad = []
  for r, (g, o) in enumerate(zip(got_BL, official_BL)):
    eos = np.flatnonzero(o == eos_id)
    n = eos[0] + 1 if eos.size else o.size
    if not np.array_equal(g[:n], o[:n]):
      bad.append(r)
  return bad


@pytest.mark.parametrize("shape", ["a", "b", "c", "d"])
def test_default_sampler_reproduces_official_generate(checkpoint, shape):
  got, official, eos_id = _sample(checkpoint, shape)
  assert _rows_differing(got, official, eos_id) == []


def test_excluding_the_mask_token_is_a_different_sampler(checkpoint):
  """The option exists and is not the default: on shape ``a`` it changes a row."""
  got, official, eos_id = _sample(checkpoint, "a", exclude_mask=True)
  assert _rows_differing(got, official, eos_id) != []
