"""The files of a study report: its study JSON (gzip-compressed) and header fields beside the
markdown, in a folder named after it, and the markdown itself (:func:`write`; the text is
:func:`dllm_rl.study.report.render`'s)."""

from __future__ import annotations

import gzip
import json
import os
import shutil

from dllm_rl.study import report

META_FILE = "meta.json"  # beside the study JSON: the invocation's header fields


def save_study_json(src: str, folder: str) -> str:
  """Copy the study JSON ``src`` (``DIR/<study>.json``) into ``folder`` gzip-compressed, as
  ``<study>.json.gz`` (a study's per-step records reach 10 MB; gzip keeps ~1/4), with a fixed
  header time so that the same JSON gives the same bytes; an uncompressed copy left there by
  older code is removed. Returns the path written."""
  name = os.path.basename(src)
  dst = os.path.join(folder, name + ".gz")
  with open(src, "rb") as fh_in, open(dst, "wb") as raw:
    with gzip.GzipFile(filename=name, mode="wb", fileobj=raw, mtime=0) as fh_out:
      shutil.copyfileobj(fh_in, fh_out)
  old = os.path.join(folder, name)
  if os.path.exists(old):
    os.remove(old)
  return dst


def load_study_json(folder: str, study: str) -> tuple[str, dict] | None:
  """(path, study dict) of ``folder``'s ``<study>.json.gz`` (or a ``<study>.json`` written by
  older code), None when there is neither; a ValueError naming the file when it is not
  JSON."""
  for path in (os.path.join(folder, f"{study}.json.gz"), os.path.join(folder, f"{study}.json")):
    if os.path.isfile(path):
      return path, read_study_file(path)
  return None


def read_study_file(path: str) -> dict:
  """The study JSON at ``path`` (gzip-compressed when it ends in ``.gz``); a ValueError naming
  the file when it cannot be read as JSON."""
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rt") as fh:
      return json.load(fh)
  except (json.JSONDecodeError, OSError, EOFError) as e:
    raise ValueError(f"{path}: not a study JSON ({e})") from None


def save_meta(meta: dict, folder: str) -> str:
  """Write the invocation's header fields (``render``'s ``meta``) as ``folder/meta.json``, so
  the report can be re-rendered from its folder alone (``dllm_rl.study.rerender``)."""
  path = os.path.join(folder, META_FILE)
  with open(path, "w") as fh:
    json.dump(meta, fh, indent=2, sort_keys=True)
    fh.write("\n")
  return path


def write(studies: list[dict], meta: dict, workdir: str, results_md: str) -> str:
  """Write ``results_md`` and copy the plots and the study JSON (gzip-compressed,
  :func:`save_study_json`) beside it, into a folder named after it (``docs/results.md`` →
  ``docs/results/``, ``docs/results_chain.md`` → ``docs/results_chain/``), so reports of
  different testbeds keep their own plots, with the header fields (:func:`save_meta`) that
  let ``python -m dllm_rl.study.rerender`` rewrite the report from the folder alone."""
  base = os.path.dirname(os.path.abspath(results_md))
  folder = os.path.splitext(os.path.basename(results_md))[0]
  image_dir = os.path.join(base, folder)
  os.makedirs(image_dir, exist_ok=True)
  for study in studies:
    for suffix in ("_curves.png", "_spikes.png"):
      src = os.path.join(workdir, study["study"] + suffix)
      if os.path.exists(src):
        shutil.copyfile(src, os.path.join(image_dir, os.path.basename(src)))
    src = os.path.join(workdir, study["study"] + ".json")
    if os.path.exists(src):
      save_study_json(src, image_dir)
  save_meta(meta, image_dir)
  with open(results_md, "w") as fh:
    fh.write(report.render(studies, meta, folder))
  return results_md
