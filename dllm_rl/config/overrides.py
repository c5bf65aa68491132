"""Command-line overrides: ``--config.a.b=value``, each parsed as the type of the key."""

from __future__ import annotations

import difflib

import ml_collections

from dllm_rl.errors import ConfigError

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _parse_value(path: str, default, text: str):
  """``text`` as the type of ``default``; raises ConfigError naming ``path``."""
  import ast
  if isinstance(default, ml_collections.ConfigDict):
    raise ConfigError(path, "is a section: set one of its keys, e.g. "
                      f"--config.{path}.{next(iter(default.keys()), 'KEY')}=...")
  try:
    if isinstance(default, bool):
      if text.lower() not in _TRUE + _FALSE:
        raise ValueError
      return text.lower() in _TRUE
    if isinstance(default, int):
      return int(text)
    if isinstance(default, float):
      return float(text)
    if isinstance(default, tuple):
      value = ast.literal_eval(text if text.strip().startswith(("(", "[")) else f"({text},)")
      if not isinstance(value, (tuple, list)):
        raise ValueError
      return tuple(value)
  except (ValueError, SyntaxError):
    raise ConfigError(path, f"expected {type(default).__name__}, got {text!r}") from None
  return text


def _free_form(text: str):
  """A task option value: a Python literal when it parses as one, else the string."""
  import ast
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def apply_overrides(config: ml_collections.ConfigDict,
                    overrides: list[tuple[str, str]]) -> list[ConfigError]:
  """Set ``(dotted key, text)`` pairs (from ``--config.KEY=TEXT``) on ``config``, each parsed
  as the type of the key's current value. Returns every problem (unknown key with a "did you
  mean", wrong type) instead of stopping at the first; good overrides are applied."""
  errors = []
  for dotted, text in overrides:
    *parents, leaf = dotted.split(".")
    node, prefix = config, ""
    try:
      for part in parents:
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
          raise KeyError(prefix + part)
        node, prefix = node[part], prefix + part + "."
      if not isinstance(node, ml_collections.ConfigDict):
        raise KeyError(prefix.rstrip("."))
      if prefix == "task.options." and leaf not in node:
        with node.unlocked():
          node[leaf] = _free_form(text)
        continue
      if leaf not in node:
        raise KeyError(dotted)
      value = (_free_form(text) if prefix == "task.options."
               else _parse_value(dotted, node[leaf], text))
      with node.unlocked():
        node[leaf] = value
    except KeyError as e:
      bad = e.args[0]
      parent = config
      for part in bad.split(".")[:-1]:
        parent = parent[part]
      choices = list(parent.keys()) if isinstance(parent, ml_collections.ConfigDict) else []
      close = difflib.get_close_matches(bad.split(".")[-1], choices, n=1)
      stem = bad.rsplit(".", 1)[0] + "." if "." in bad else ""
      hint = f"; did you mean {stem}{close[0]}?" if close else ""
      errors.append(ConfigError(bad, f"unknown key{hint}"))
    except ConfigError as e:
      errors.append(e)
    except (TypeError, ValueError) as e:
      errors.append(ConfigError(dotted, str(e)))
  return errors
