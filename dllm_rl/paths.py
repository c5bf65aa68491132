"""Workdir and checkpoint paths: local folders or URLs (``gs://bucket/run``, ``s3://...``).

Every path the framework writes goes through :func:`resolve`, which returns an
``etils.epath.Path``: a URL stays a URL (epath hands it to the cloud backend, Orbax
and TensorBoard write there), a local path becomes absolute. ``os.path.abspath``
would turn ``gs://bucket/run`` into a local folder named ``gs:``.
"""

from __future__ import annotations

import importlib.util
import os
import re

from etils import epath

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# URL scheme → (the fsspec backend package it needs, how to install it).
_BACKENDS = {
    "gs": ("gcsfs", 'pip install "dllm-rl[gcs]" (from a checkout: pip install -e ".[gcs]" or '
                    "pip install -r requirements-gcs.txt)"),
    "s3": ("s3fs", "pip install s3fs"),
}


class BackendMissing(ImportError):
  """A URL whose storage backend package is not installed (the message says which)."""


def check_backend(path: str | os.PathLike) -> None:
  """Raise :class:`BackendMissing` naming the package when ``path`` is a URL whose fsspec
  backend is not installed (gs:// needs gcsfs): before a run creates anything."""
  match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", os.fspath(path))
  if match and match.group(1) in _BACKENDS:
    package, how = _BACKENDS[match.group(1)]
    if importlib.util.find_spec(package) is None:
      raise BackendMissing(f"{os.fspath(path)}: {match.group(1)}:// paths need the {package} "
                           f"package, which is not installed: {how}")


def is_url(path: str | os.PathLike) -> bool:
  """True for ``scheme://...`` paths (gs, s3, az, hf, memory, ...)."""
  return bool(_URL.match(os.fspath(path)))


def expand(path: str | os.PathLike) -> str:
  """``path`` with a leading ``~`` / ``~user`` expanded (local paths; a URL is untouched). A
  shell leaves ``--workdir=~/run`` as it is: taken literally it names a folder called ``~`` in
  the current directory."""
  text = os.fspath(path)
  return text if is_url(text) else os.path.expanduser(text)


def resolve(path: str | os.PathLike) -> epath.Path:
  """``path`` as an epath.Path: URLs untouched, local paths ``~``-expanded and made
  absolute."""
  text = os.fspath(path)
  return epath.Path(text if is_url(text) else os.path.abspath(os.path.expanduser(text)))


def join(path: str | os.PathLike, *parts: str) -> str:
  """``path/part/...`` as a string, keeping a URL's ``scheme://``."""
  return os.fspath(epath.Path(os.fspath(path)).joinpath(*parts)) if is_url(path) else \
      os.path.join(os.fspath(path), *parts)


def write_atomic(path: str | os.PathLike, text: str) -> None:
  """Write ``text`` to ``path`` whole: a local file through a temporary file and a rename (a
  crash leaves the old file or the new one, never half of one); a URL's object is replaced
  whole by its one write."""
  text_path = os.fspath(path)
  if is_url(text_path):
    resolve(text_path).write_text(text, encoding="utf-8")
    return
  tmp = text_path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, text_path)
