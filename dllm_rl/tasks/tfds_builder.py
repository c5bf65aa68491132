"""A TFDS dataset over a JSONL task's files, stored as ArrayRecord (no TensorFlow).

``build(task_name, data_dir, **task_options)`` parses the files with the
registered JSONL task (same validation, ``on_error`` and prompt template),
writes its train and test splits as ``tfds`` ArrayRecord shards under
``data_dir`` and returns the builder; ``load_examples(builder, split)`` reads a
split back as ``Example``s through ``tfds.data_sources`` (random access,
TensorFlow never imported). The builder config is named after the task and a
hash of the options and the files' bytes, so editing a file or an option builds
a new dataset instead of silently reusing a stale one.

Each stored example has ``prompt``, ``answer`` (text) and ``meta`` (its JSON).
Rows are stored in TFDS's own order (shuffled by key); ``load_examples``
returns them in file order (by ``index``), so ``Task.generate``'s seeded
shuffle applies unchanged to the result.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np

from dllm_rl.tasks.base import SPLITS, Example, make_task
from dllm_rl.tasks.jsonl import JsonlTask

try:
  import array_record  # noqa: F401

  # tensorflow-datasets 4.9.10 uses it on every Python but declares it for < 3.9 only.
  import importlib_resources  # noqa: F401
  import tensorflow_datasets as tfds
except ImportError as err:  # pragma: no cover - exercised only without the extras
  raise ImportError("dllm_rl.tasks.tfds_builder needs `tensorflow-datasets`, "
                    "`array-record` and `importlib_resources` (TensorFlow itself is not "
                    f"needed): {err}") from err

VERSION = "1.0.0"


def _fingerprint(task_name: str, options: dict[str, Any]) -> str:
  h = hashlib.sha256(json.dumps([task_name, options], sort_keys=True).encode())
  for key in ("train_file", "test_file"):
    path = options.get(key)
    if path and os.path.isfile(path):
      with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
          h.update(chunk)
  return h.hexdigest()[:12]


class DllmRlJsonl(tfds.core.GeneratorBasedBuilder):
  """Examples of one JSONL task; construct through ``build``."""

  VERSION = tfds.core.Version(VERSION)

  def __init__(self, *, task: JsonlTask, **kwargs):
    self._task = task
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=f"dllm_rl task {self._task.name!r} from local JSONL files.",
        features=tfds.features.FeaturesDict({
            "index": tfds.features.Scalar(dtype=np.int64),
            "prompt": tfds.features.Text(),
            "answer": tfds.features.Text(),
            "meta": tfds.features.Text(),
        }))

  def _split_generators(self, dl_manager):
    del dl_manager  # local files only
    # TFDS cannot write an empty split; load_examples reads a missing one as [].
    return {split: self._generate_examples(split) for split in SPLITS if self._pool(split)}

  def _pool(self, split: str):
    if split == "train" and not self._task.train_file:
      return []  # a test-only task
    return self._task._pool(split)[0]

  def _generate_examples(self, split: str):
    for i, ex in enumerate(self._pool(split)):
      yield i, {"index": i, "prompt": ex.prompt, "answer": ex.answer,
                "meta": json.dumps(dict(ex.meta), sort_keys=True)}


def build(task_name: str, data_dir: str, **task_options: Any) -> DllmRlJsonl:
  """Parses the task's files and writes (or reuses) its ArrayRecord dataset."""
  task = make_task(task_name, **task_options)
  if not isinstance(task, JsonlTask):
    raise ValueError(f"task {task_name!r} is not file-backed (JSONL); TFDS datasets "
                     "are built only for those")
  name = f"{task_name}_{_fingerprint(task_name, task_options)}"
  config = tfds.core.BuilderConfig(name=name, version=VERSION,
                                   description=f"{task_name} with {task_options}")
  builder = DllmRlJsonl(task=task, data_dir=data_dir, config=config,
                        file_format="array_record")
  builder.download_and_prepare()
  return builder


def load_examples(builder: DllmRlJsonl, split: str) -> list[Example]:
  """The stored ``split`` as Examples, in file order, via ArrayRecord random access."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  if split not in builder.info.splits:
    return []  # the task had no examples of this split
  source = builder.as_data_source(split=split)
  rows = sorted((source[i] for i in range(len(source))), key=lambda r: int(r["index"]))

  def text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)

  return [Example(prompt=text(r["prompt"]), answer=text(r["answer"]),
                  meta=json.loads(text(r["meta"]))) for r in rows]
