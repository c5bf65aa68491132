"""The cached modes' later-step forward (``OpenBlockModel.step``) on its own.

A cached step differs from the exact forward only through the tokens committed since the
block-start forward, so on the very tokens of that forward it must give the exact logits:
the same positions, the cached prompt, committed blocks and (``dual``) masked suffix. The
sampler tests exercise ``step`` only through whole rollouts, whose decisions the schedule
and single-step-block checks do not pin down.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.models import transformer as T
from dllm_rl.sampling.open_block import CACHES
from tests.helpers import small_model

MASK = 2
L, BL = 12, 4


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_a_step_on_the_block_start_tokens_is_the_exact_forward(cache):
  graphdef, params = T.init_model(small_model(vocab_size=24), jax.random.key(0))
  prompt = jax.random.randint(jax.random.key(7), (2, 5), 3, 24)
  valid = jnp.ones((2, 5), bool).at[0, :2].set(False)  # one left-padded row
  x = jax.random.randint(jax.random.key(8), (2, L), 3, 24)
  x = x.at[:, 6:].set(MASK).at[1, 5].set(MASK)  # block 1 partly decoded, the suffix masked
  exact = CACHES.get("none")(graphdef, params, prompt, valid, completion_len=L, block_len=BL)
  model = CACHES.get(cache)(graphdef, params, prompt, valid, completion_len=L, block_len=BL)
  want = jax.jit(lambda x: exact.refresh(x, 1)[0])(x)
  start, stepped = jax.jit(lambda x: (lambda r: (r[0], model.step(r[1], x, 1)))(
      model.refresh(x, 1)))(x)
  np.testing.assert_allclose(start, want, atol=1e-5)
  np.testing.assert_allclose(stepped, want, atol=1e-5)
