"""Named registries for pluggable components (remasking policies, tasks, losses, ...).

Algorithm variants are registered functions selected by name in the config; the
config validator checks names against these registries before anything compiles.
"""

from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


def unknown_message(kind: str, name: object, choices) -> str:
  """"unknown KIND 'name'; available: a, b. Did you mean 'a'?" for a name not in ``choices``."""
  close = difflib.get_close_matches(str(name), list(choices), n=1)
  hint = f" Did you mean {close[0]!r}?" if close else ""
  return f"unknown {kind} {name!r}; available: {', '.join(sorted(choices))}.{hint}"


def _where(obj: object) -> str:
  """``module.qualname`` of a registered function or class; "" for anything else (an
  instance such as an ``Estimator``, whose repr would be its whole docstring)."""
  qualname = getattr(obj, "__qualname__", None)
  module = getattr(obj, "__module__", None)
  return f"{module}.{qualname}" if isinstance(qualname, str) and module else ""


class Registry(Generic[T]):
  """A name → object mapping with helpful errors for unknown names."""

  def __init__(self, kind: str):
    self.kind = kind
    self._items: dict[str, T] = {}

  def register(self, name: str) -> Callable[[T], T]:
    """Decorator: ``@REG.register("name")``."""

    def deco(obj: T) -> T:
      if name in self._items:
        first = _where(self._items[name])
        raise ValueError(f"{self.kind} {name!r} is already registered"
                         + (f" (by {first})" if first else "")
                         + f": register {_where(obj) or 'this one'} under another name")
      self._items[name] = obj
      return obj

    return deco

  def get(self, name: str) -> T:
    if name not in self._items:
      raise KeyError(self.unknown_message(name))
    return self._items[name]

  def unknown_message(self, name: str) -> str:
    return unknown_message(self.kind, name, self._items)

  def names(self) -> list[str]:
    return sorted(self._items)

  def __contains__(self, name: object) -> bool:
    return name in self._items

  def __iter__(self) -> Iterator[str]:
    return iter(sorted(self._items))
