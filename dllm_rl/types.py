"""Shared pytrees and the shape-letter legend.

Shape suffixes on array names (``logits_BNV``, ``mask_BL``):

* ``B`` batch (prompts), ``G`` completions per prompt (group size)
* ``P`` prompt length, ``L`` completion length, ``N`` = P + L full sequence
* ``V`` vocabulary, ``D`` model width, ``H`` query heads, ``J`` key/value heads
* ``Q`` head dimension, ``F`` MLP hidden width, ``S`` denoising states/steps
* ``K`` Monte-Carlo draws of the likelihood estimators (``logp_KBL``)
* ``T`` in KV-cached forwards (``Transformer.forward_cached``): the new tokens fed
  against the cache
* ``M`` attention keys / KV-cache slots

Log-probabilities, ratios and advantages are always float32.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

# Compute / parameter dtypes by config name (model.dtype, model.param_dtype, HF loads).
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@struct.dataclass
class PromptBatch:
  """Left-padded prompts; ``prompt_valid_BP`` is False on padding."""

  prompt_BP: jax.Array
  prompt_valid_BP: jax.Array


@struct.dataclass
class SequenceBatch:
  """Prompt + completion: SFT targets (answer, EOS, EOS fill) or RL rollouts.

  ``completion_valid_BL`` marks completion positions that are targets (and may
  be masked); everything else is never masked and carries no loss.
  ``unmask_step_BL``: for RL rollouts, the denoising step at which the sampler
  committed each completion position (-1 = never; SampleOutput), read by the
  ``trajectory`` estimator; None elsewhere.
  """

  prompt_BP: jax.Array
  prompt_valid_BP: jax.Array
  completion_BL: jax.Array
  completion_valid_BL: jax.Array
  unmask_step_BL: Any = None


@struct.dataclass
class TrainState:
  """Everything a step needs, as one pytree (checkpointed whole).

  ``params`` is an ``nnx.State`` of the model's Params; the graph definition is
  static and lives outside the state (see ``dllm_rl.models.transformer``).
  ``step`` counts optimizer updates. ``ref_params``: frozen reference policy
  for a KL penalty (None when unused).
  """

  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
  ref_params: Any = None


@struct.dataclass
class SampleOutput:
  """Sampler result.

  ``completion_BL``: committed tokens (EOS-filled after the first EOS when the
  sampler stops at EOS). ``unmask_step_BL``: the (0-based, global) denoising
  step at which each completion token was committed. ``num_steps``: denoising
  steps the sampler ran (model evaluations), ``num_blocks``: blocks visited.
  ``trajectory_SBL``: tokens after each step when recorded, else None.
  """

  completion_BL: jax.Array
  unmask_step_BL: jax.Array
  num_steps: jax.Array
  num_blocks: jax.Array
  trajectory_SBL: Any = None
