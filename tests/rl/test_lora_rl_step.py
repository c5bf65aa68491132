"""An RL step of a LoRA model moves the adapters only: the step's scorer reads the base
behind stop_gradient (``lora.freeze_base``), so even a plain Adam, which would move any
parameter with a gradient, leaves the base bit-identical."""

import types

import jax
import numpy as np
import optax

from dllm_rl.models import lora
from dllm_rl.models import transformer as T
from dllm_rl.parallel.shard import init_train_state
from dllm_rl.rl.step import make_rl_step
from tests.helpers import random_rollout_batch, rl_step_config, tiny_model

CFG = lora.configure(tiny_model(), types.SimpleNamespace(
    rank=2, alpha=4.0, targets=("q", "v", "o", "down"), base_dtype="bfloat16"))


def test_rl_step_moves_only_the_adapters():
  graphdef, params = T.init_model(CFG, jax.random.key(0))
  opt = optax.adam(1e-2)  # no masking: only the step decides what gets a gradient
  state = init_train_state(params, opt, jax.random.key(1))
  adapters0, base0 = jax.device_get(lora.split_adapters(state.params))
  step = make_rl_step(graphdef, opt, lambda s: 1e-2, rl_step_config(inner_steps=2))
  state, metrics = step(state, random_rollout_batch(0, 2, 4, 3, 8, vocab_size=12,
                                                    unmask_period=4), jax.random.key(2))
  adapters, base = jax.device_get(lora.split_adapters(state.params))
  for x, y in zip(jax.tree.leaves(base0), jax.tree.leaves(base)):
    np.testing.assert_array_equal(x, y)
  assert all(not np.array_equal(x, y)
             for x, y in zip(jax.tree.leaves(adapters0), jax.tree.leaves(adapters)))
  assert float(metrics["grad_norm"]) > 0
