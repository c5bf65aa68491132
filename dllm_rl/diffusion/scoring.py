"""Scorers: one forward pass → log p(target) and the predictive entropy at the scored rows.

The likelihood estimators need, per Monte-Carlo draw, ``log p_θ(o_i | noisy input)``
and the entropy at L rows of a longer input (the completion rows of
[prompt | completion], or the noisy copy of the staircase layout). A scorer is

    scorer(tokens_BN, positions_BN, mask, start, targets_BL) -> (logp_BL, entropy_BL)

for rows [start, start + L) of the forward pass, both float32.

* :class:`ModelScorer` (training): the transformer's hidden states, then the LM
  head only at those rows, through the chunked log-softmax with its own VJP
  (dllm_rl.models.logprob): the [B, N, V] logits are never formed.
* :class:`LogitsScorer`: any ``logits_fn(tokens, positions, mask) -> logits_BNV``
  (tests, probes, reference models), sliced, then a plain log-softmax.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from dllm_rl.models import logprob, transformer


@dataclasses.dataclass(frozen=True)
class ModelScorer:
  """The transformer (``graphdef``, ``params``) scored at selected rows only;
  ``chunk`` rows of the sequence axis per vocabulary slab (0 = all L at once)."""

  graphdef: Any
  params: Any
  chunk: int = 0

  def __call__(self, tokens_BN, positions_BN, mask, start: int, targets_BL):
    h_BND, head_DV = transformer.apply_hidden(self.graphdef, self.params, tokens_BN,
                                              positions_BN, mask)
    h_BLD = h_BND[:, start:start + targets_BL.shape[1]]
    return logprob.logp_entropy(h_BLD, head_DV, targets_BL, self.chunk)


@dataclasses.dataclass(frozen=True)
class LogitsScorer:
  """A plain ``logits_fn`` as a scorer (full logits, sliced)."""

  logits_fn: Callable

  def __call__(self, tokens_BN, positions_BN, mask, start: int, targets_BL):
    logits_BLV = self.logits_fn(tokens_BN, positions_BN, mask)[
        :, start:start + targets_BL.shape[1]]
    return logprob.logp_entropy_reference(logits_BLV, targets_BL)


def as_scorer(model) -> ModelScorer | LogitsScorer:
  """A scorer as is; any other callable is taken for a ``logits_fn``."""
  if isinstance(model, (ModelScorer, LogitsScorer)):
    return model
  return LogitsScorer(model)
