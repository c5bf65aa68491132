"""Edges of Dream's decision pieces that the official-run fixtures do not reach
(shared/fixtures/dream_tiny/README.md, "Sampler semantics"): the linspace end points, the
threshold's ≥ and ``origin`` leaving decoded positions alone."""

import jax
import jax.numpy as jnp
import numpy as np

from dllm_rl.sampling.dream_ops import (DreamSamplerConfig, origin_step, threshold_pick,
                                        timesteps)


def test_timesteps_end_exactly_at_eps_as_torch_linspace():
  """torch's linspace counts the second half back from the end, so the last entry is eps
  itself (accumulating from the start would miss it in the last bits)."""
  for steps in (4, 32, 512):
    ts = timesteps(steps, 1e-3)
    assert ts.dtype == np.float32 and ts.shape == (steps + 1,)
    assert ts[0] == np.float32(1.0) and ts[-1] == np.float32(1e-3)
    np.testing.assert_allclose(ts, np.linspace(1.0, 1e-3, steps + 1), rtol=1e-6)


def test_threshold_pick_accepts_a_confidence_equal_to_the_threshold():
  """The first of the top ``budget`` always; each other one when its probability ≥ threshold."""
  conf = jnp.array([[0.5, 0.75, 0.25, 0.5, 0.9]])
  open_ = jnp.array([[True, True, True, True, False]])
  take, rejected = threshold_pick(conf, open_, 4, 0.5)
  np.testing.assert_array_equal(take[0], [1, 1, 0, 1, 0])
  assert int(rejected) == 1
  take, rejected = threshold_pick(conf, open_, 4, 0.8)
  np.testing.assert_array_equal(take[0], [0, 1, 0, 0, 0])  # the best alone
  assert int(rejected) == 3


def test_origin_changes_only_masked_positions():
  """At the last step (fraction 1) every masked position takes its proposal, and nothing
  else changes."""
  cfg = DreamSamplerConfig(max_new_tokens=6, mask_id=9)
  x = jnp.array([[1, 9, 2, 9, 9, 3]])
  logits = jax.nn.one_hot(jnp.full((1, 6), 7), 10) * 5.0
  got = origin_step(x, logits, x == 9, jnp.float32(1.0), jax.random.key(0), cfg=cfg)
  np.testing.assert_array_equal(got[0], [1, 7, 2, 7, 7, 3])
