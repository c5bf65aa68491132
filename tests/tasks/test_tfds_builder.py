"""TFDS ArrayRecord dataset over JSONL task files, built and read without TensorFlow
(TensorFlow is not installed in the test environment)."""

import json

import pytest

pytest.importorskip("tensorflow_datasets")
pytest.importorskip("array_record")
pytest.importorskip("importlib_resources")

from dllm_rl.tasks import make_task  # noqa: E402
from dllm_rl.tasks import tfds_builder  # noqa: E402


def _write(path, records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return str(path)


def test_build_and_read_back(tmp_path):
  records = [{"question": f"What is {i} + {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"}
             for i in range(60)]
  train = _write(tmp_path / "train.jsonl", records)
  options = {"train_file": train, "prompt_template": "Q: {question}"}
  builder = tfds_builder.build("gsm8k", str(tmp_path / "tfds"), **options)
  assert any(p.name.endswith("array_record-00000-of-00001")
             for p in (tmp_path / "tfds").rglob("*train*"))
  task = make_task("gsm8k", **options)
  for split in ("train", "test"):
    stored = tfds_builder.load_examples(builder, split)
    assert stored == task._pool(split)[0] and stored  # same examples, file order
  assert builder.info.splits["train"].num_examples + builder.info.splits["test"].num_examples == 60

  # Same files and options: reused; an edited file: a new dataset, never a stale one.
  again = tfds_builder.build("gsm8k", str(tmp_path / "tfds"), **options)
  assert again.builder_config.name == builder.builder_config.name
  _write(tmp_path / "train.jsonl", records[:10])
  edited = tfds_builder.build("gsm8k", str(tmp_path / "tfds"), **options)
  assert edited.builder_config.name != builder.builder_config.name
  assert len(tfds_builder.load_examples(edited, "train")) + len(
      tfds_builder.load_examples(edited, "test")) == 10


def test_empty_split_and_errors(tmp_path):
  train = _write(tmp_path / "c.jsonl", [{"nums": [1, 2, 3], "target": 6}])
  empty = _write(tmp_path / "empty.jsonl", [])
  builder = tfds_builder.build("countdown_jsonl", str(tmp_path / "tfds"), train_file=train,
                               test_file=empty)
  assert tfds_builder.load_examples(builder, "test") == []
  [ex] = tfds_builder.load_examples(builder, "train")
  assert ex.meta["numbers"] == [1, 2, 3] and ex.meta["target"] == 6
  test_only = tfds_builder.build("countdown_jsonl", str(tmp_path / "tfds"), test_file=train)
  assert tfds_builder.load_examples(test_only, "train") == []
  assert tfds_builder.load_examples(test_only, "test") == [ex]
  with pytest.raises(ValueError, match="not file-backed"):
    tfds_builder.build("arithmetic", str(tmp_path / "tfds"))
  with pytest.raises(FileNotFoundError, match="nope.jsonl"):
    tfds_builder.build("gsm8k", str(tmp_path / "tfds"), train_file=str(tmp_path / "nope.jsonl"))
