"""The study command's own arguments, checked before anything trains.

``python -m dllm_rl.study`` (``__main__``) and the library call ``studies.study`` run
:func:`argument_problems` first: a bad count, seed or path is a ConfigError naming its flag
(``--seeds: must be at least 1, got 0``), every one at once, instead of a study that runs the
default size or runs nothing.
"""

from __future__ import annotations

from dllm_rl.errors import ConfigError


def at_least(flag: str, value: int | None, low: int) -> ConfigError | None:
  """A ConfigError naming ``flag`` when ``value`` is given and below ``low``; None given means
  the flag's default. (0 is not "unset": ``--seeds=0`` once ran the default 5 seeds.)"""
  if value is not None and value < low:
    return ConfigError(flag, f"must be at least {low}, got {value}")
  return None


def argument_problems(*, seeds: int | None = None, rl_steps: int | None = None,
                      eval_every: int | None = None, first_seed: int = 0,
                      sft_seed: int = 0) -> list[ConfigError]:
  """Every problem of the study's arguments, each a ConfigError naming its flag: counts below
  1 (``--seeds``, ``--rl_steps``, ``--eval_every``; None is the default), seeds below 0
  (``--first_seed``, ``--sft_seed``)."""
  errors = [e for e in (at_least("--seeds", seeds, 1), at_least("--rl_steps", rl_steps, 1),
                        at_least("--eval_every", eval_every, 1),
                        at_least("--first_seed", first_seed, 0),
                        at_least("--sft_seed", sft_seed, 0)) if e is not None]
  return errors
