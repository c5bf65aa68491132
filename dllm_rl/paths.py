"""Workdir and checkpoint paths: local folders or URLs (``gs://bucket/run``, ``s3://...``).

Every path the framework writes goes through :func:`resolve`, which returns an
``etils.epath.Path``: a URL stays a URL (epath hands it to the cloud backend, Orbax
and TensorBoard write there), a local path becomes absolute. ``os.path.abspath``
would turn ``gs://bucket/run`` into a local folder named ``gs:``.
"""

from __future__ import annotations

import os
import re

from etils import epath

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str | os.PathLike) -> bool:
  """True for ``scheme://...`` paths (gs, s3, az, hf, memory, ...)."""
  return bool(_URL.match(os.fspath(path)))


def resolve(path: str | os.PathLike) -> epath.Path:
  """``path`` as an epath.Path: URLs untouched, local paths made absolute."""
  text = os.fspath(path)
  return epath.Path(text if is_url(text) else os.path.abspath(text))


def join(path: str | os.PathLike, *parts: str) -> str:
  """``path/part/...`` as a string, keeping a URL's ``scheme://``."""
  return os.fspath(epath.Path(os.fspath(path)).joinpath(*parts)) if is_url(path) else \
      os.path.join(os.fspath(path), *parts)
