"""The one command-line config parser of every entry point (``main``, ``plan``, ``study``).

``--config=PATH`` names a config file (``get_config()``); each ``--config.KEY=VALUE`` is set
aside before absl parses the other flags and applied after the file is loaded, parsed as the
type of the key. Every problem (a broken file, unknown keys with a "did you mean", wrong
types, failed validation) is printed at once as ``error: config.<key>: <message>``, one line
each, and the process exits with status 2 before anything compiles.
"""

from __future__ import annotations

import os
import sys
import traceback
from types import ModuleType
from typing import Callable, NoReturn

import ml_collections
from absl import app, flags

from dllm_rl.config.overrides import apply_overrides, value_at
from dllm_rl.config.schema import load_config_file
from dllm_rl.errors import ConfigError, each

PREFIX = "--config."
EXIT_CONFIG = 2
HELP = ("-h", "-help", "--help", "--helpshort", "--helpfull", "-?")  # usage, status 0


def usage_error(message: str) -> app.UsageError:
  """A UsageError exiting with status 2, as a config error and an absl flag error
  (:func:`flags_parser`) do (status 1 is a failed run's); :func:`run_app` prints it."""
  return app.UsageError(message, exitcode=EXIT_CONFIG)


def run_app(main: Callable[[list[str]], object], sink: list, module: ModuleType,
            aliases: tuple[str, ...] = ()) -> None:
  """``app.run(main)`` for the entry point ``module`` (:func:`flags_parser`'s overrides into
  ``sink``, its help), where a :func:`usage_error` prints one ``error:`` line and where the
  usage is, as a flag error does: absl printed its usage text first (the module's docstring
  and flags under ``python -m``, a bare ``USAGE: dllm-rl [flags]`` under a console script)
  and the message last."""

  def checked(argv: list[str]):
    try:
      return main(argv)
    except app.UsageError as err:
      print(f"error: {err}\nPass --help to see the usage.", file=sys.stderr)
      sys.exit(err.exitcode)

  app.run(checked, flags_parser=flags_parser(sink, aliases, module=module))


def fail(errors: list[ConfigError]) -> NoReturn:
  """Print every problem (``error: config.<key>: ...``) and exit with status 2."""
  for err in errors:
    for one in each(err):
      print(f"error: {one}", file=sys.stderr)
  sys.exit(EXIT_CONFIG)


def split_overrides(argv: list[str], aliases: tuple[str, ...] = ()) -> tuple[list[str], list]:
  """(the other arguments, ``[(dotted key, text), ...]``) from ``--config.KEY=VALUE`` (and any
  ``aliases`` prefix such as the study's ``--set=``); a missing ``=`` exits with status 2."""
  rest, overrides = [], []
  for arg in argv:
    prefix = next((p for p in (PREFIX, *aliases) if arg.startswith(p)), None)
    if prefix is None:
      rest.append(arg)
      continue
    key, sep, value = arg[len(prefix):].partition("=")
    if not sep or not key:
      fail([ConfigError(key or "?", f"expected {PREFIX}KEY=VALUE, got {arg!r}")])
    overrides.append((key, value))
  return rest, overrides


def usage(module: ModuleType, *, full: bool = False) -> str:
  """The help of the entry point ``module``: its docstring, then its own flags (every flag,
  absl's and JAX's too, with ``full``). absl's ``app.usage`` prints ``__main__``'s docstring
  and the flags filed under ``sys.argv[0]``: right for ``python -m dllm_rl.main``, but a
  console script's ``__main__`` is pip's launcher, which has no docstring, and the module's
  flags are filed under its name, so ``dllm-rl --help`` printed ``USAGE: dllm-rl [flags]``
  alone."""
  doc = module.__doc__ or f"\nUSAGE: {sys.argv[0]} [flags]\n"
  listed = flags.FLAGS.get_help() if full else flags.FLAGS.module_help(module)
  return f"{doc}\nflags:\n{listed}\n" if listed else f"{doc}\n"


def flags_parser(sink: list, aliases: tuple[str, ...] = (), *, module: ModuleType | None = None,
                 ) -> Callable[[list[str]], list[str]]:
  """An ``app.run(..., flags_parser=...)`` that sets the config overrides aside into ``sink``
  and parses the remaining flags with absl (an absl flag error also exits with status 2).
  ``-h`` / ``--help`` print :func:`usage` of ``module`` (the entry point's own module, which
  a console script's ``__main__`` is not; default ``__main__``) and exit 0."""

  def parse(argv: list[str]) -> list[str]:
    asked = [a for a in argv[1:] if a in HELP]
    if asked:  # absl's own --help exits with status 1 (a failed run's) and knows no -h
      sys.stdout.write(usage(module or sys.modules["__main__"], full=asked[0] == "--helpfull"))
      sys.stdout.flush()
      sys.exit(0)
    rest, overrides = split_overrides(argv, aliases)
    sink.extend(overrides)
    try:
      return flags.FLAGS(rest)
    except flags.Error as e:
      print(f"error: {e}\nPass --helpfull to see the flags.", file=sys.stderr)
      sys.exit(EXIT_CONFIG)

  return parse


def load(path: str | None, overrides: list[tuple[str, str]], *,
         check: Callable[[ml_collections.ConfigDict], object],
         default: Callable[[], ml_collections.ConfigDict] | None = None,
         ) -> ml_collections.ConfigDict:
  """The config file (or ``default()``) with the overrides applied and ``check`` run on it
  (the CLIs pass ``dllm_rl.train.validate.validate``, the planner its variant of it); exits
  with status 2 listing every problem."""
  if path is None and default is None:
    fail([ConfigError("file", "--config=PATH is required")])
  try:
    config = load_config_file(path) if path else default()
  except Exception as e:  # noqa: BLE001 - a broken config file: report it, no traceback
    print(f"error: --config={path}{config_line(e, path)}: {type(e).__name__}: {e}"
          f"{import_hint(e, path)}", file=sys.stderr)
    sys.exit(EXIT_CONFIG)
  notes: list[str] = []
  errors = apply_overrides(config, overrides, notes)
  try:
    check(config)
  except ConfigError as err:
    errors += getattr(err, "errors", [err])
  if errors:
    fail(errors)
  for note in notes:
    print(f"note: {note}", file=sys.stderr, flush=True)
  return config


def config_line(err: BaseException, path: str) -> str:
  """``", line N"``: where in the config file ``path`` (``PATH:ARG`` too) ``err`` was raised
  (the innermost frame in that file; a SyntaxError's own line); "" when not in it."""
  target = os.path.realpath(path if os.path.exists(path) else path.rsplit(":", 1)[0])
  if isinstance(err, SyntaxError) and err.filename and os.path.realpath(err.filename) == target:
    return f", line {err.lineno}"
  lines = [tb.lineno for tb in traceback.extract_tb(err.__traceback__)
           if os.path.realpath(tb.filename) == target]
  return f", line {lines[-1]}" if lines else ""


def import_hint(err: BaseException, path: str) -> str:
  """For a config file's import of a module that lies beside it (the user's own components,
  README "Out-of-tree components"): that a config file's folder is not on the import path,
  as a script's is, and how to put it there; "" otherwise."""
  name = getattr(err, "name", None)
  if not isinstance(err, ModuleNotFoundError) or not name:
    return ""
  folder = os.path.dirname(os.path.abspath(path if os.path.exists(path)
                                           else path.rsplit(":", 1)[0]))
  top = name.partition(".")[0]
  if not (os.path.isfile(os.path.join(folder, f"{top}.py"))
          or os.path.isdir(os.path.join(folder, top))):
    return ""
  if folder in (os.path.abspath(entry or os.getcwd()) for entry in sys.path):
    return ""  # on the path already: what is missing is something else (e.g. a submodule)
  return (f" ({top} is beside the config file, but a config file's folder is not on the"
          f" import path: run with PYTHONPATH={folder})")


def typed_overrides(base: ml_collections.ConfigDict,
                    overrides: list[tuple[str, str]]) -> dict[str, object]:
  """``{dotted key: value}`` of ``overrides`` parsed against ``base`` (a copy is changed, not
  ``base``); exits with status 2 listing every problem."""
  config = ml_collections.ConfigDict(base.to_dict())
  errors = apply_overrides(config, overrides)
  if errors:
    fail(errors)
  return override_values(config, overrides)


def override_values(config: ml_collections.ConfigDict,
                    overrides: list[tuple[str, str]]) -> dict[str, object]:
  """``{dotted key: value}`` in ``config`` of each overridden key (after they were applied)."""
  return {key: value_at(config, key) for key, _ in overrides}
