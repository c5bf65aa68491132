"""A cheap content fingerprint of an HF checkpoint folder's safetensors weights.

:func:`fingerprint` records, as a small JSON dict: the tensors (names and shapes), their
dtypes, and one hash of a fixed set of sampled bytes, a window of :data:`PROBE_BYTES` from the
middle of each tensor (of :data:`MAX_PROBES` tensors evenly spread over the sorted names when
there are more: a mixture-of-experts model's thousands of expert tensors). Only the
safetensors headers and those windows are read: under 1 MB of data for a dense 8B model
(about 300 tensors), a few MB of disk pages at most, whatever the model's size. Tensors are
taken in name order and located through the headers, so the fingerprint does not depend on how
the weights are split into files (a re-save with another shard size fingerprints the same).

Why sampling suffices: two different checkpoints of the same architecture (another revision,
a fine-tune of it, a merged LoRA) differ in essentially every element of every tensor their
training touched (an optimizer step moves every weight it updates, and a merged LoRA's
``B·A`` is dense), so a window of 128 bf16 values in each tensor differs whenever that tensor
does. What it misses: a change confined to a few elements (a handful of edited rows), or, in
a model with more than :data:`MAX_PROBES` tensors, one confined to tensors not probed. A
re-save in another dtype changes every byte while holding the same weights, so bytes are only
compared between equal dtypes (:func:`compare`). Changing :data:`PROBE_BYTES`,
:data:`MAX_PROBES` or what is hashed must bump :data:`FORMAT` (an older fingerprint is then
not compared).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct

from dllm_rl.models import hf

FORMAT = 1
PROBE_BYTES = 256  # per probed tensor, from its middle (128 bf16 values)
MAX_PROBES = 512  # tensors probed at most (evenly over the sorted names)

SAME, DTYPES, TENSORS, BYTES, UNKNOWN = "same", "dtypes", "tensors", "bytes", "unknown"


def _header(path: str) -> tuple[int, dict]:
  """(where the data section starts, name → header entry) of safetensors file ``path``."""
  with open(path, "rb") as f:
    (size,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(size))
  header.pop("__metadata__", None)
  return 8 + size, header


def _digest(value) -> str:
  return hashlib.sha256(json.dumps(value, separators=(",", ":")).encode()).hexdigest()


def _read_probes(windows: list[tuple[str, str, int, int]]) -> dict[str, bytes]:
  """name → the bytes of its window, ``windows``: (name, file, offset, length); read file by
  file in offset order, without read-ahead where the OS allows it."""
  out: dict[str, bytes] = {}
  by_file: dict[str, list] = {}
  for name, path, offset, length in windows:
    by_file.setdefault(path, []).append((offset, length, name))
  for path, wanted in by_file.items():
    fd = os.open(path, os.O_RDONLY)
    try:
      if hasattr(os, "posix_fadvise"):  # a few scattered pages, not MBs of read-ahead
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
      for offset, length, name in sorted(wanted):
        out[name] = os.pread(fd, length, offset)
    finally:
      os.close(fd)
  return out


def fingerprint(folder: str) -> dict:
  """The fingerprint (module doc) of the safetensors weights of HF folder ``folder`` (a local
  folder). FileNotFoundError / ValueError as :func:`dllm_rl.models.hf.weight_files` for a
  folder without readable weights."""
  files, _ = hf.weight_files(folder)
  entries = {}  # name → (file, dtype, shape, start, end), start and end in the file
  for path in dict.fromkeys(files.values()):
    data_start, header = _header(path)
    for name, e in header.items():
      if files.get(name) == path:
        start, end = e["data_offsets"]
        entries[name] = (path, e["dtype"], list(e["shape"]), data_start + start, data_start + end)
  names = sorted(entries)
  probed = names if len(names) <= MAX_PROBES else \
      [names[i * len(names) // MAX_PROBES] for i in range(MAX_PROBES)]
  windows = []
  for name in probed:
    path, _, _, start, end = entries[name]
    length = min(PROBE_BYTES, end - start)
    windows.append((name, path, start + (end - start - length) // 2, length))
  data = _read_probes(windows)
  probes = hashlib.sha256()
  for name in probed:
    probes.update(name.encode() + b"\0" + data[name])
  return {"format": FORMAT, "n_tensors": len(names),
          "bytes": sum(entries[n][4] - entries[n][3] for n in names),
          "tensors": _digest([[n, entries[n][2]] for n in names]),
          "dtypes": _digest([[n, entries[n][1]] for n in names]),
          "dtype_names": sorted({entries[n][1] for n in names}),
          "probes": probes.hexdigest()}


def compare(saved: dict, now: dict) -> str:
  """How the weights fingerprinted as ``now`` relate to those fingerprinted as ``saved``:
  :data:`SAME` (the same tensors, dtypes and sampled bytes), :data:`TENSORS` (other names or
  shapes), :data:`DTYPES` (the same tensors in other dtypes: their bytes cannot be compared),
  :data:`BYTES` (the same tensors and dtypes with other sampled bytes: other weights), or
  :data:`UNKNOWN` (``saved`` is of another :data:`FORMAT` or not a fingerprint)."""
  if not isinstance(saved, dict) or saved.get("format") != now["format"]:
    return UNKNOWN
  if saved.get("tensors") != now["tensors"]:
    return TENSORS
  if saved.get("dtypes") != now["dtypes"]:
    return DTYPES
  return SAME if saved.get("probes") == now["probes"] else BYTES
