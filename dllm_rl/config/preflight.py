"""The launchers' check of a run's config before they create or reach any machine.

``python -m dllm_rl.config.preflight CONFIG SLICES [--config.KEY=VALUE ...]`` loads the config
file, applies the overrides and checks what needs no accelerator and no import of the training
stack (a fraction of a second): the file loads, every override names a key and parses as its
type, the other arguments are flags ``dllm_rl.main`` takes (absl's own, such as
``--alsologtostderr``), and with ``SLICES`` > 1 (TPU multislice) ``mesh.data`` is a multiple
of the slice count — the mesh's data axis alone spans the slices (``dllm_rl.parallel.mesh``),
which the workers would otherwise find only after the slices were created, set up and staged.
Every problem is printed as ``error: config.<key>: ...`` and the status is 2; 0 when all is
well. A config with no problem that sets a key its own choices do not read gets the line the
workers' run prints (``warning: config.<key>=<value> is not read: ...``,
:mod:`dllm_rl.config.unread`) on stderr, status still 0: the launch goes on, but the user learns
it before any machine starts. ``CONFIG`` may be ``FILE:ARG`` (``get_config("ARG")``), read as
``dllm_rl.main`` reads it.
A config file importing a package this Python lacks (one installed on the workers only, say)
cannot be checked here: a ``note:`` says so and the status is 3 (:data:`EXIT_UNCHECKED`), which
the launchers take as "the workers check it"; dllm_rl's own missing modules are problems. The
full validation (``dllm_rl.train.validate``) still runs on the workers, before anything
compiles.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import sys

from absl import flags

from dllm_rl.config.cli import (EXIT_CONFIG, HELP, config_line, fail, import_hint,
                                split_overrides)
from dllm_rl.config.overrides import apply_overrides
from dllm_rl.config.schema import load_config_file
from dllm_rl.config.unread import unread_settings
from dllm_rl.errors import ConfigError

# dllm_rl.main's own flags beside absl's (dllm_rl.config may not import dllm_rl.main;
# tests/test_preflight.py checks that these are all it defines).
MAIN_FLAGS = ("config", "workdir")
EXIT_UNCHECKED = 3  # the config file cannot be loaded here (launch/common.sh: any status but 0, 2)


class Unchecked(Exception):
  """The config file imports a package (not dllm_rl's) this Python lacks: not checkable here."""


@contextlib.contextmanager
def _logging_levels_kept():
  """Restores every logger's level on exit: parsing absl's logging flags sets them on the
  process's loggers even on a copy of the flags (``--verbosity=1`` puts the root logger at
  DEBUG, ``--logger_levels=NAME:LEVEL`` that logger), which a check must not."""
  manager = logging.root.manager
  before = {name: lg.level for name, lg in list(manager.loggerDict.items())
            if isinstance(lg, logging.Logger)}
  root = logging.root.level
  try:
    yield
  finally:
    logging.root.setLevel(root)
    for name, lg in list(manager.loggerDict.items()):
      if isinstance(lg, logging.Logger):
        lg.setLevel(before.get(name, logging.NOTSET))


def _flag_problems(rest: list[str]) -> list[ConfigError]:
  """The arguments in ``rest`` (no ``--config.`` override) that the workers' ``dllm_rl.main``
  would refuse, as its absl parser (on a copy of the flags: none is set here, and the logging
  levels absl's flags set are restored) reads them: absl's own flags (``--alsologtostderr``,
  ``--verbosity=1``) pass, as a help flag does."""
  rest = [arg for arg in rest if arg not in HELP]  # main prints its usage for those
  if not rest:
    return []
  parser = copy.deepcopy(flags.FLAGS)  # absl's own flags (app, logging), and main's below
  for name in MAIN_FLAGS:
    if name not in parser:  # a string flag, as main's are
      parser[name] = flags.Flag(flags.ArgumentParser(), flags.ArgumentSerializer(), name, None,
                                "dllm_rl.main's")
  try:
    with _logging_levels_kept():
      extra = parser(["dllm_rl.main", *rest])[1:]
  except flags.UnrecognizedFlagError as e:
    extra = [e.flagvalue or f"--{e.flagname}"]
  except flags.Error as e:
    return [ConfigError("overrides", f"{e} (a flag of the workers' dllm_rl.main)")]
  return [ConfigError("overrides", f"{arg!r} is neither a --config.KEY=VALUE override nor a flag"
                      " of the workers' dllm_rl.main") for arg in extra]


def problems(path: str, slices: int, argv: list[str]) -> list[ConfigError]:
  """The problems of config file ``path`` under the ``--config.`` overrides in ``argv`` for a
  run on ``slices`` TPU slices (empty when there are none)."""
  return check(path, slices, argv)[0]


def check(path: str, slices: int, argv: list[str]) -> tuple[list[ConfigError], list[str]]:
  """(:func:`problems`, the warnings): with no problem, one line per setting the run's choices
  do not read (:func:`dllm_rl.config.unread.unread_settings`, as the workers' run says it)."""
  rest, overrides = split_overrides(argv)
  errors = _flag_problems(rest)
  try:
    config = load_config_file(path)
  except ImportError as e:  # a missing module of dllm_rl's own is a problem (status 2)
    if not e.name or e.name.partition(".")[0] == "dllm_rl":
      raise
    raise Unchecked(f"--config={path}{config_line(e, path)}: {type(e).__name__}: {e} (not"
                    f" dllm_rl's: a package {sys.executable} lacks, that the workers may"
                    f" have); not checked here{import_hint(e, path)}") from e
  errors += apply_overrides(config, overrides, [])
  data = config.mesh.data  # -1 (the devices the other axes leave) is resolved on the workers
  if slices > 1 and not errors and data != -1 and (data < 1 or data % slices):
    errors.append(ConfigError(
        "mesh.data", f"{data} is not a multiple of the {slices} slices (--slices {slices}): the "
        "data axis alone spans the slices; set --config.mesh.data to a multiple of it (and "
        "check the plan: python -m dllm_rl.plan --topology=TYPE --slices="
        f"{slices} with the same overrides)"))
  return errors, ([] if errors else unread_settings(config))


USAGE = "usage: python -m dllm_rl.config.preflight CONFIG SLICES [--config.KEY=VALUE ...]"


def main(argv: list[str]) -> int:
  if argv[:1] and argv[0] in HELP:  # as every entry point: the usage on stdout, status 0
    print(f"{USAGE}\n\n{__doc__}")
    return 0
  if len(argv) < 2 or not argv[1].isdigit() or int(argv[1]) < 1:
    print(USAGE, file=sys.stderr)
    return EXIT_CONFIG
  try:
    errors, warnings = check(argv[0], int(argv[1]), argv[2:])
  except Unchecked as e:
    print(f"note: {e}", file=sys.stderr)
    return EXIT_UNCHECKED
  except Exception as e:  # noqa: BLE001 - a broken config file: its line, no traceback
    print(f"error: --config={argv[0]}{config_line(e, argv[0])}: {type(e).__name__}: {e}",
          file=sys.stderr)
    return EXIT_CONFIG
  if errors:
    fail(errors)
  for line in warnings:  # the launch goes on: status 0
    print(f"warning: {line}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
