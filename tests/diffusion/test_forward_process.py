"""The forward process: masking rates t ~ U[eps, 1] (LLaDA: (1 − eps)·u + eps) and d1's
prompt masking."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.diffusion import masking
from dllm_rl.diffusion.estimators import mask_prompt
from dllm_rl.types import SequenceBatch


@pytest.mark.parametrize("eps", [1e-3, 0.5])
def test_sample_t_is_uniform_on_eps_to_one(eps):
  t = np.asarray(masking.sample_t(jax.random.key(0), 4096, eps))
  assert t.dtype == np.float32
  assert t.min() >= eps and t.max() <= 1.0
  # U[eps, 1]: mean (1 + eps)/2, sd (1 − eps)/√12; 4096 draws put the mean within ±0.02
  assert t.mean() == pytest.approx((1 + eps) / 2, abs=0.02)
  assert t.std() == pytest.approx((1 - eps) / np.sqrt(12), rel=0.05)


def test_prompt_masking_leaves_padding_alone():
  """d1's prompt masking hits valid prompt tokens only (probability 1: all of them)."""
  prompt = jnp.array([[5, 6, 7, 3], [4, 4, 4, 4]])
  valid = jnp.array([[False, False, True, True], [True, True, True, True]])
  seqs = SequenceBatch(prompt, valid, jnp.zeros((2, 1), jnp.int32), jnp.ones((2, 1), bool))
  got = np.asarray(mask_prompt(jax.random.key(0), seqs, 1.0, 2))
  np.testing.assert_array_equal(got, np.where(np.asarray(valid), 2, np.asarray(prompt)))
