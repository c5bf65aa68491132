"""The content fingerprint of an HF folder's weights (dllm_rl.models.hf_fingerprint): the same
for a copy or a re-save of the same tensors, another for any one tensor changed by one ulp in
every element, a dtype change told apart from a value change, and a few windows read."""

import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from dllm_rl.models import hf_fingerprint
from dllm_rl.models.hf_fingerprint import BYTES, DTYPES, SAME, TENSORS, compare, fingerprint
from tests.helpers import ROOT

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "llada_tiny")


def rewrite(folder, change) -> None:
  """Rewrite ``folder``'s model.safetensors in place, whole, with ``change(name, w)`` for each
  tensor (a re-download or a re-save over the same path)."""
  path = os.path.join(folder, "model.safetensors")
  tensors = load_file(path)
  save_file({name: change(name, w) for name, w in tensors.items()}, path, metadata={"format": "pt"})


def _copy(tmp_path, name="copy"):
  shutil.copytree(FIXTURE, tmp_path / name)
  return str(tmp_path / name)


def test_a_copy_and_a_resharded_resave_fingerprint_the_same(tmp_path):
  original = fingerprint(FIXTURE)
  assert original["n_tensors"] == 21 and original["dtype_names"] == ["F32"]
  assert compare(original, fingerprint(_copy(tmp_path))) == SAME
  # the same tensors in two shards with an index (another file layout, other offsets)
  tensors = load_file(os.path.join(FIXTURE, "model.safetensors"))
  sharded = tmp_path / "sharded"
  shutil.copytree(FIXTURE, sharded, ignore=shutil.ignore_patterns("*.safetensors"))
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[::2],
            "model-00002-of-00002.safetensors": names[1::2]}
  for file, part in shards.items():
    save_file({n: tensors[n] for n in part}, str(sharded / file), metadata={"format": "pt"})
  (sharded / "model.safetensors.index.json").write_text(json.dumps(
      {"weight_map": {n: file for file, part in shards.items() for n in part}}))
  assert compare(original, fingerprint(str(sharded))) == SAME


def test_any_one_tensor_changed_by_one_ulp_is_other_bytes(tmp_path):
  """Each tensor in turn, every element moved to the next float32 (the smallest change a
  training step makes): the whole file rewritten, so the sampled window changes for sure."""
  original = fingerprint(FIXTURE)
  names = sorted(load_file(os.path.join(FIXTURE, "model.safetensors")))
  for changed in names:
    folder = _copy(tmp_path, changed)
    rewrite(folder, lambda name, w: np.nextafter(w, np.inf) if name == changed else w)
    assert compare(original, fingerprint(folder)) == BYTES, changed


def test_another_dtype_or_other_tensors_are_told_apart_from_other_values(tmp_path):
  original = fingerprint(FIXTURE)
  half = _copy(tmp_path, "half")
  rewrite(half, lambda name, w: w.astype(np.float16))  # a re-save in another dtype
  assert fingerprint(half)["dtype_names"] == ["F16"]
  assert compare(original, fingerprint(half)) == DTYPES
  wider = _copy(tmp_path, "wider")  # one tensor of another shape
  rewrite(wider, lambda name, w: np.concatenate([w, w]) if "ln_f" in name else w)
  assert compare(original, fingerprint(wider)) == TENSORS
  assert compare({**original, "format": 0}, fingerprint(wider)) == hf_fingerprint.UNKNOWN


def test_only_a_window_of_each_probed_tensor_is_read(tmp_path, monkeypatch):
  """The data read: at most PROBE_BYTES from each of at most MAX_PROBES tensors (the headers
  aside), whatever the file's size."""
  reads = []
  pread = os.pread

  def counted(fd, n, offset):
    reads.append(n)
    return pread(fd, n, offset)

  monkeypatch.setattr(hf_fingerprint.os, "pread", counted)
  fingerprint(FIXTURE)
  assert len(reads) == 21 and max(reads) == hf_fingerprint.PROBE_BYTES
  reads.clear()
  monkeypatch.setattr(hf_fingerprint, "MAX_PROBES", 5)
  assert fingerprint(FIXTURE)["n_tensors"] == 21 and len(reads) == 5


def test_a_folder_without_safetensors_is_named():
  with pytest.raises(FileNotFoundError, match="neither model.safetensors"):
    fingerprint(os.path.join(ROOT, "tests"))
