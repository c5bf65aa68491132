"""Test-only fault injection, driven by the ``DLLM_FAULT`` environment variable.

Unset (the normal case) every hook is a no-op that returns its value unchanged. The
fault-injection benchmark (``python -m dllm_rl.benchmarks.faults``) and the tests set it to
make a fault happen at an exact point of the RL loop::

  DLLM_FAULT=<action>@<point>:<step>[;<action>@<point>:<step>...]

* ``point``: ``rollout`` (the rollout of RL step ``step`` has been dispatched and is running),
  ``update`` (the jitted update of that step has been dispatched and is running),
  ``checkpoint`` (an asynchronous checkpoint save of that step has started and is being
  written), ``reward`` (the host rewards of that step);
* ``action``: ``sigterm``, ``sigint`` or ``sigkill`` (the process sends itself that signal, as
  a scheduler would), or ``nan`` (at ``reward``: every reward of the step becomes NaN).

For ``rollout``, ``reward`` and ``update``, ``step`` is the 0-based index of the rollout batch
(the step in progress is ``rl`` step ``step + 1``); for ``checkpoint`` it is the step saved.
"""

from __future__ import annotations

import functools
import os
import signal

import numpy as np

ENV = "DLLM_FAULT"
ACTIONS = ("sigterm", "sigint", "sigkill", "nan")
POINTS = ("rollout", "update", "checkpoint", "reward")


@functools.lru_cache(maxsize=None)
def parse(spec: str) -> dict[tuple[str, int], str]:
  """``"sigterm@rollout:3;nan@reward:5"`` → {("rollout", 3): "sigterm", ("reward", 5): "nan"}."""
  faults = {}
  for item in filter(None, (part.strip() for part in spec.split(";"))):
    try:
      action, rest = item.split("@")
      point, step = rest.split(":")
      step = int(step)
    except ValueError:
      raise ValueError(f"{ENV}: cannot parse {item!r} (expected action@point:step)") from None
    if action not in ACTIONS or point not in POINTS:
      raise ValueError(f"{ENV}: {item!r}: action must be one of {ACTIONS}, point one of {POINTS}")
    faults[(point, step)] = action
  return faults


def at(point: str, step: int, value=None):
  """The hook: perform the fault planned for (``point``, ``step``), if any; return ``value``
  (NaN-filled for a ``nan`` fault)."""
  spec = os.environ.get(ENV)
  if not spec:
    return value
  action = parse(spec).get((point, int(step)))
  if action is None:
    return value
  if action == "nan":
    return np.full_like(np.asarray(value, np.float32), np.nan)
  os.kill(os.getpid(), getattr(signal, action.upper()))
  return value
