"""Named registries for pluggable components (remasking policies, tasks, losses, ...).

Algorithm variants are registered functions selected by name in the config; the
config validator checks names against these registries before anything compiles.
"""

from __future__ import annotations

import difflib
import sys
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")
# config key → the registry whose names it selects (``Registry(..., key=...)``), once the
# module that defines that registry is imported: dllm_rl.config.unread reads it without
# importing the layers above it.
SELECTED_BY: dict[str, "Registry"] = {}


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
  """A name → object mapping with helpful errors for unknown names. ``key``: the config key
  that selects one of its names (``rl.loss``, ``task.name``, ...): a module outside dllm_rl
  may register more (README "Out-of-tree components"), an unknown name's message says how
  they become known, and :data:`SELECTED_BY` holds the registry under that key."""

  def __init__(self, kind: str, *, key: str | None = None):
    self.kind = kind
    self.key = key
    self._items: dict[str, T] = {}
    self._modules: dict[str, str] = {}
    if key is not None:
      SELECTED_BY.setdefault(key, self)  # the first: dllm_rl's own

  def register(self, name: str) -> Callable[[T], T]:
    """Decorator: ``@REG.register("name")``. The module that calls it is recorded
    (:meth:`module`)."""
    module = sys._getframe(1).f_globals.get("__name__", "")

    def deco(obj: T) -> T:
      if name in self._items:
        first = _where(self._items[name])
        raise ValueError(f"{self.kind} {name!r} is already registered"
                         + (f" (by {first})" if first else "")
                         + f": register {_where(obj) or 'this one'} under another name")
      self._items[name] = obj
      self._modules[name] = module
      return obj

    return deco

  def get(self, name: str) -> T:
    if name not in self._items:
      raise KeyError(self.unknown_message(name))
    return self._items[name]

  def unknown_message(self, name: str) -> str:
    """:func:`unknown_message`; for a registry a config key selects from (:attr:`key`) and
    a name close to none of its own, also how a name registered outside dllm_rl becomes
    known."""
    msg = unknown_message(self.kind, name, self._items)
    if self.key is not None and not msg.endswith("?"):
      msg += (f" A {self.kind} registered outside dllm_rl is known once the module that"
              " registers it is imported: import it in the config file (--config=PATH), with"
              " its folder on PYTHONPATH.")
    return msg

  def module(self, name: str) -> str:
    """The module that registered ``name`` (``__name__`` where ``register`` was called)."""
    return self._modules[name]

  def in_tree(self, name: str) -> bool:
    """Whether ``name`` is one of dllm_rl's own (registered by a module of the package), not
    a component registered from outside it (README "Out-of-tree components")."""
    return self._modules.get(name, "").partition(".")[0] == "dllm_rl"

  def names(self) -> list[str]:
    return sorted(self._items)

  def __contains__(self, name: object) -> bool:
    return name in self._items

  def __iter__(self) -> Iterator[str]:
    return iter(sorted(self._items))
