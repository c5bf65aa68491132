"""The study command's own arguments, checked before anything trains.

``python -m dllm_rl.study`` (``__main__``) and the library call ``studies.study`` run
:func:`argument_problems` first: a bad count, seed or path is a ConfigError naming its flag
(``--seeds: must be at least 1, got 0``), every one at once, instead of a study that runs the
default size, runs nothing, or trains for hours and then fails writing its report.
"""

from __future__ import annotations

import os

from dllm_rl.errors import ConfigError


def at_least(flag: str, value: int | None, low: int) -> ConfigError | None:
  """A ConfigError naming ``flag`` when ``value`` is given and below ``low``; None given means
  the flag's default. (0 is not "unset": ``--seeds=0`` once ran the default 5 seeds.)"""
  if value is not None and value < low:
    return ConfigError(flag, f"must be at least {low}, got {value}")
  return None


def not_empty(flag: str, values: list[str] | None) -> ConfigError | None:
  """A ConfigError naming ``flag`` when the list flag is given with nothing in it (``--arms=``,
  as an unset shell variable writes it): it read as the flag left out, so ``--arms=$ARMS``
  ran every arm of the full study and ``--reuse_from=$FILE`` reused nothing."""
  if values is not None and not values:
    return ConfigError(flag, "is empty; leave the flag out for its default")
  return None


def folder_problem(path: str) -> str | None:
  """Why a folder cannot be made at ``path`` without touching the disk: ``path`` is a file, a
  file stands where one of its parent folders would be, or the nearest folder that exists is
  not writable; None when it can be (or is one).
  A study writes its runs into the folder only once every check passed, so nothing is
  created here."""
  if os.path.exists(path):
    return None if os.path.isdir(path) else f"{path} is a file, not a folder"
  parent = os.path.dirname(os.path.abspath(path))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    return f"{parent} is a file, so {path} cannot be made under it"
  if not os.access(parent, os.W_OK):
    return f"cannot create {path}: {parent} is not writable"
  return None


def results_problem(path: str) -> str | None:
  """Why the markdown report cannot be written at ``path``: it is a folder (or ends in a
  path separator), its parent folder cannot be made (:func:`folder_problem`), or the folder
  of its plots beside it (``docs/results.md`` → ``docs/results/``) is a file. Checked up
  front: the report is written only after the whole study trained."""
  if path.endswith(os.sep) or os.path.isdir(path):
    example = os.path.join(path, "results.md")
    return f"{path} is a folder; give the markdown file to write, e.g. {example}"
  parent = os.path.dirname(os.path.abspath(path))
  if (problem := folder_problem(parent)) is not None:
    return problem
  plots = os.path.join(parent, os.path.splitext(os.path.basename(path))[0])
  if os.path.exists(plots) and not os.path.isdir(plots):
    return f"{plots}, the folder of its plots and study JSON, is a file"
  return None


def is_under(path: str, folder: str) -> bool:
  """Whether ``path`` lies inside ``folder`` (by their absolute paths)."""
  return os.path.abspath(path).startswith(os.path.join(os.path.abspath(folder), ""))


def argument_problems(*, workdir: str | None = None, results: str | None = None,
                      seeds: int | None = None, rl_steps: int | None = None,
                      eval_every: int | None = None, first_seed: int = 0,
                      sft_seed: int = 0, arms: list[str] | None = None,
                      reuse_from: list[str] | None = None) -> list[ConfigError]:
  """Every problem of the study's arguments, each a ConfigError naming its flag: counts below
  1 (``--seeds``, ``--rl_steps``, ``--eval_every``; None is the default), seeds below 0
  (``--first_seed``, ``--sft_seed``), ``--arms`` or ``--reuse_from`` given empty
  (:func:`not_empty`; None is the flag left out), a ``--workdir`` that is a file or cannot be made
  (:func:`folder_problem`, as ``dllm_rl.train.context`` checks the main CLI's) and a
  ``--results`` that cannot be written (:func:`results_problem`; not checked again when it
  lies in a ``--workdir`` already reported; a path given as None is not checked)."""
  errors = [e for e in (at_least("--seeds", seeds, 1), at_least("--rl_steps", rl_steps, 1),
                        at_least("--eval_every", eval_every, 1),
                        at_least("--first_seed", first_seed, 0),
                        at_least("--sft_seed", sft_seed, 0), not_empty("--arms", arms),
                        not_empty("--reuse_from", reuse_from)) if e is not None]
  if workdir is not None and (problem := folder_problem(workdir)) is not None:
    errors.append(ConfigError("--workdir", problem))
    if results is not None and is_under(results, workdir):  # the same problem, said once
      return errors
  if results is not None and (problem := results_problem(results)) is not None:
    errors.append(ConfigError("--results", problem))
  return errors
