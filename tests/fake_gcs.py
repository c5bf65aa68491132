"""An in-memory stand-in for Cloud Storage (no network): epath hands gs:// (and s3://) paths
to fsspec, which finds :class:`FakeGCS` under those protocols while the ``fake_gcs`` fixture
is active. tests/conftest.py imports the fixture, so any test may take ``fake_gcs``."""

import importlib
import os

import pytest
from etils.epath import backend as epath_backend
from fsspec.implementations.memory import MemoryFileSystem

from dllm_rl import paths


class FakeGCS(MemoryFileSystem):
  """An in-memory bucket store under the gs:// protocol (no append, like GCS)."""

  protocol = ("gs", "gcs", "s3")
  store: dict = {}
  pseudo_dirs = [""]

  @classmethod
  def _strip_protocol(cls, path):
    path = os.fspath(path)
    for prefix in ("gs://", "gcs://", "s3://"):
      path = path.removeprefix(prefix)
    return super()._strip_protocol(path)

  def info(self, path, **kwargs):
    """MemoryFileSystem's, plus a file's ``mtime`` (a datetime: when it was last written), as
    gcsfs reports an object's update time (epath's ``stat().mtime``)."""
    out = super().info(path, **kwargs)
    if out["type"] == "file":
      out["mtime"] = self.store[self._strip_protocol(path)].modified
    return out

  def _open(self, path, mode="rb", **kwargs):
    if "a" in mode:
      raise NotImplementedError("object stores cannot append")
    return super()._open(path, mode, **kwargs)


@pytest.fixture
def fake_gcs(tmp_path, monkeypatch):
  FakeGCS.store.clear()
  FakeGCS.pseudo_dirs[:] = [""]
  FakeGCS.clear_instance_cache()
  for name in FakeGCS.protocol:  # undone after the test
    monkeypatch.setitem(importlib.import_module("fsspec.registry")._registry, name, FakeGCS)
    # the fake is the backend: paths.check_backend must not ask for gcsfs / s3fs
    monkeypatch.delitem(paths._BACKENDS, name, raising=False)
  epath_backend.fsspec_backend._get_filesystem.cache_clear()
  monkeypatch.chdir(tmp_path)  # a wrong os.path.abspath would create ./gs:/...
  yield FakeGCS()
  epath_backend.fsspec_backend._get_filesystem.cache_clear()
  for scheme in ("gs:", "s3:"):
    assert not os.path.exists(tmp_path / scheme), f"a {scheme}// path became a local folder"
