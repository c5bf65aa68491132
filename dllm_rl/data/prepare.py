"""``prepare(name, out)``: a named data set → ``out/train.jsonl``, ``out/test.jsonl`` (the
splits its recipe has) and ``out/dataset.json`` (sources, row counts, dropped rows and why,
the config keys to pass), written through :mod:`dllm_rl.paths` (``out`` may be gs://).

Rows are read with the Hugging Face ``datasets`` library: a hub data set, a builder over
files (JSON, CSV), or a local override (``--source SPLIT=PATH``: a ``.jsonl`` / ``.json`` /
``.csv`` / ``.parquet`` file or a ``save_to_disk`` folder; or another hub id, e.g.
``--source train=qwedsacf/competition_math``; an evaluation-only set takes no train split:
:func:`check_splits`). Each row is converted by the recipe, checked by
the task's own line checks, and the written files are read back by the task before the
command reports success, so what it writes is what the trainer reads.
"""

from __future__ import annotations

import codecs
import collections
import itertools
import json
import os
import re
from typing import Any, Iterable, Iterator, Mapping

from dllm_rl import paths
from dllm_rl.errors import short_reason
from dllm_rl.data.recipes import RECIPES, Recipe, Skip, Source
from dllm_rl.tasks import make_task
from dllm_rl.tasks.jsonl_base import record_problem
from dllm_rl.tasks.jsonl_lines import (STRICT_JSON, BadRecord, invalid_json, load_json, not_jsonl,
                                       not_utf8, surrogate_problem)

MANIFEST = "dataset.json"
_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
_HUB_SOURCE = re.compile(r"^(?P<id>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<config>[\w.-]+))?"
                         r"(?:@(?P<split>[\w.-]+))?$")


class DataError(ValueError):
  """A data set that cannot be prepared (unknown name, unreachable source, bad override);
  the message says what to do."""


def recipe(name: str) -> Recipe:
  if name not in RECIPES:
    raise DataError(f"unknown data set {name!r}; available: {', '.join(sorted(RECIPES))}")
  return RECIPES[name]


def check_splits(name: str, sources: Mapping[str, Source]) -> None:
  """DataError when ``sources`` gives a split the recipe ``name`` does not have: an
  evaluation-only set (``math500``, ``humaneval``, ``mbpp``) takes no train file, which it
  would have written unfiltered beside the test set; the message names the recipe of the same
  task that has a train split (its converter and training filter apply there)."""
  rec = recipe(name)
  extra = sorted(set(sources) - set(rec.splits))
  if not extra:
    return
  split = extra[0]
  others = sorted(other for other, r in RECIPES.items() if r.task == rec.task
                  and split in r.splits)
  hint = (f"; for {split} data of task {rec.task}, use `dllm-rl-data prepare {others[0]}"
          f" --source {split}=PATH`" if others else "")
  raise DataError(f"--source {split}=...: {name} is evaluation only (it has only a "
                  f"{' and '.join(sorted(rec.splits))} split, for mode=eval){hint}")


_LOCAL_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".arrow", ".txt", ".gz", ".zip")


def _looks_local(value: str) -> bool:
  """A missing path that no hub id can be: a data file's extension, a leading ``/``, ``./``
  or ``../``, or a parent folder that exists here (``data/train.jsonl`` beside ``data/``)."""
  parent = os.path.dirname(value)
  return (value.lower().endswith(_LOCAL_SUFFIXES) or value.startswith(("/", "./", "../"))
          or (bool(parent) and os.path.isdir(parent)))


def parse_source(text: str) -> tuple[str, Source]:
  """``SPLIT=PATH`` (a local file or folder) or ``SPLIT=ORG/NAME[:CONFIG][@SPLIT]`` (a hub
  data set; its split defaults to SPLIT) → (split, Source)."""
  split, sep, value = text.partition("=")
  if not sep or split not in ("train", "test") or not value:
    raise DataError(f"--source {text!r}: expected train=PATH or test=PATH")
  value = os.path.expanduser(value)
  if os.path.exists(value):
    return split, Source(os.path.abspath(value), local=True)
  if _looks_local(value):  # not a hub id: no network round trip before "no such file"
    raise DataError(f"--source {text!r}: {value} does not exist (a local file: it ends in a"
                    " file extension, or its folder exists)")
  match = _HUB_SOURCE.match(value)
  if match is None:
    raise DataError(f"--source {text!r}: {value!r} is neither a local file / folder nor a hub "
                    "data set id (org/name[:config][@split])")
  return split, Source(match["id"], match["config"], match["split"] or split)


def check_utf8(path: str) -> None:
  """DataError naming ``path`` and the line of its first byte that is not UTF-8 (the text
  files ``datasets`` reads as UTF-8: JSONL, JSON, CSV)."""
  with open(path, "rb") as f:
    for line_no, line in enumerate(f, start=1):
      problem = not_utf8(line)
      if problem:
        raise DataError(f"{path}:{line_no}: {problem}")


_JSON_SPACE = " \t\n\r"
# JSON as it is laid out, whatever its values: any integer (no int() of its digits, which
# fails over 4,300 of them), a key given twice (the last value kept)
_LENIENT = json.JSONDecoder(parse_int=str)


def _array_starts(text: str) -> Iterator[tuple[int, int]]:
  """(line, offset) at which each record of ``text``, a valid JSON array, starts, in order."""
  pos = text.index("[") + 1
  line, counted = 1, 0
  while True:
    while text[pos] in _JSON_SPACE + ",":
      pos += 1
    if text[pos] == "]":
      return
    line, counted = line + text.count("\n", counted, pos), pos
    yield line, pos
    pos = _LENIENT.raw_decode(text, pos)[1]


def _array_line(text: str, index: int) -> int:
  """The line on which record ``index`` of ``text``, a valid JSON array, starts."""
  return next(itertools.islice(_array_starts(text), index, None))[0]


def _name_record(path: str, text: str, err: BadRecord) -> None:
  """DataError naming the record of the ``.json`` source ``path`` (its text ``text``) that
  ``err`` is about (:func:`dllm_rl.tasks.jsonl_lines.load_json`: a key given twice, an
  integer over Python's limit): its index in the array and the line it starts on. A text that
  is not one JSON value is checked line by line (JSON Lines of arrays: the line), else left to
  ``datasets``' own error."""
  try:
    value = _LENIENT.decode(text)
  except json.JSONDecodeError:
    _check_json_lines(path)
    return
  if not isinstance(value, list):
    raise DataError(f"{path}: its JSON object: {err}")
  strict = json.JSONDecoder(**STRICT_JSON)
  for index, (line, pos) in enumerate(_array_starts(text)):
    try:
      strict.raw_decode(text, pos)
    except BadRecord as found:
      raise DataError(f"{path}: record {index} of its JSON array (line {line}): {found}"
                      ) from None


def _check_json_lines(path: str) -> bool:
  """DataError naming ``path`` and the line of the first record of a JSON Lines file that
  holds an unpaired surrogate escape, gives a key twice or an integer of over 4,300 digits
  (Python's limit); read a line at a time (``\\n`` ends a line, as for ``datasets``: a
  U+2028 inside a string does not). False when the first line that is not blank is not JSON
  (not JSON Lines); a later line that is not JSON is left to ``datasets``."""
  first = True
  with open(path, "rb") as f:
    for line_no, line in enumerate(f, start=1):
      line = line.removeprefix(codecs.BOM_UTF8) if line_no == 1 else line
      if not line.strip():
        continue
      try:
        row = load_json(line)
      except BadRecord as err:
        raise DataError(f"{path}:{line_no}: {err}") from None
      except json.JSONDecodeError:
        if first:
          return False
        continue  # not JSON Lines either: datasets names it
      first = False
      problem = surrogate_problem(row)
      if problem:
        raise DataError(f"{path}:{line_no}: {problem}")
  return True


def check_json_file(path: str) -> None:
  """DataError naming the ``.json`` source ``path`` and the record (its index in the array
  and the line it starts on) that holds an unpaired UTF-16 surrogate escape such as
  ``"\\ud800"`` (:func:`dllm_rl.tasks.jsonl_lines.surrogate_problem`), which ``datasets``
  would drop without a word, gives a key twice, of which it would keep the last value, or an
  integer of over 4,300 digits, which it would fail on without the line. A ``.json`` file of
  JSON Lines is checked line by line, never read whole (:func:`_check_json_lines`); a file
  that parses neither way is left to ``datasets``' own error."""
  with open(path, "rb") as f:
    head = next((line for line in f if line.strip()), b"")
  if not head.removeprefix(codecs.BOM_UTF8).lstrip().startswith(b"[") and _check_json_lines(
      path):
    return  # JSON Lines (datasets reads those under a .json name too)
  with open(path, encoding="utf-8") as f:
    text = f.read().removeprefix("\ufeff")
  try:
    value = load_json(text)
  except BadRecord as err:
    _name_record(path, text, err)
    return
  except json.JSONDecodeError:  # JSON Lines of arrays, or neither
    _check_json_lines(path)
    return
  for index, row in enumerate(value if isinstance(value, list) else [value]):
    problem = surrogate_problem(row)
    if problem:
      where = (f"record {index} of its JSON array (line {_array_line(text, index)})"
               if isinstance(value, list) else "its JSON object")
      raise DataError(f"{path}: {where}: {problem}")


def check_local_file(path: str, ext: str) -> None:
  """DataError naming the local source file ``path`` (extension ``ext``) when it is not what
  its extension says, before ``datasets`` reads it (whose own errors name neither the file's
  kind nor the line): a compressed file or archive (what to do), an empty file, a byte that is
  not UTF-8 (its line), for ``.jsonl`` a line that is not JSON (its line and column), and for
  ``.jsonl`` and ``.json`` an unpaired surrogate escape, a key given twice in an object or an
  integer of over 4,300 digits (its line, or its array record), as the trainer's JSONL reader
  refuses them."""
  with open(path, "rb") as f:
    head = f.read(8)
  problem = not_jsonl(head, path, "--source SPLIT={}")
  if problem and not (ext == ".parquet" and head.startswith(b"PAR1")):
    raise DataError(f"{path}: {problem}")
  if ext not in _BUILDERS:
    raise DataError(f"{path}: expected one of {sorted(_BUILDERS)} or a save_to_disk folder")
  if ext == ".parquet":
    return
  check_utf8(path)
  if ext == ".json":
    check_json_file(path)
  rows = 0
  with open(path, "rb") as f:
    for line_no, line in enumerate(f, start=1):
      if not line.strip():
        continue
      rows += 1
      if ext != ".jsonl":
        break  # one row is enough: datasets' CSV / JSON readers name their own problems
      text = line.rstrip(b"\r\n")  # a cut line is an unterminated string, not a control character
      try:
        row = load_json(text.removeprefix(codecs.BOM_UTF8) if line_no == 1 else text)
      except BadRecord as err:
        raise DataError(f"{path}:{line_no}: {err}") from None
      except json.JSONDecodeError as err:
        raise DataError(f"{path}:{line_no}: {invalid_json(err)}") from None
      problem = surrogate_problem(row)
      if problem:
        raise DataError(f"{path}:{line_no}: {problem}")
  if not rows:
    raise DataError(f"{path}: the file is empty (no rows)")


def load_rows(source: Source, cache_dir: str | None = None) -> Iterable[Mapping[str, Any]]:
  """The rows of ``source`` (a ``datasets.Dataset``). DataError, saying how to work offline,
  when a hub source cannot be read; for a local file, what is wrong with it and where
  (:func:`check_local_file`)."""
  import datasets

  try:
    if source.local and os.path.isdir(source.path):
      ds = datasets.load_from_disk(source.path)
      if isinstance(ds, datasets.DatasetDict):
        if source.split not in ds:
          raise DataError(f"{source.path} holds splits {sorted(ds)}, not {source.split!r}")
        ds = ds[source.split]
      return ds
    if source.local:
      ext = os.path.splitext(source.path)[1].lower()
      check_local_file(source.path, ext)
      return datasets.load_dataset(_BUILDERS[ext], data_files=source.path, split="train",
                                   cache_dir=cache_dir)
    return datasets.load_dataset(source.path, source.config, split=source.split,
                                 data_files=source.data_files, cache_dir=cache_dir)
  except DataError:
    raise
  except Exception as err:  # network, hub and parsing errors all mean "cannot read it"
    if source.local:  # a local file or folder: no network involved
      raise DataError(f"cannot read {source.describe()} ({short_reason(err, 300)}); --source"
                      " takes a .jsonl/.json/.csv/.parquet file or a save_to_disk folder"
                      ) from err
    raise DataError(f"cannot read {source.describe()} ({short_reason(err, 300)}); on a "
                    "machine without network pass the split as a local file: --source "
                    "SPLIT=FILE (.jsonl/.json/.csv/.parquet or a save_to_disk folder)") from err


def convert_rows(rows: Iterable[Mapping[str, Any]], rec: Recipe, split: str,
                 limit: int | None = None) -> tuple[list[dict], dict[str, int]]:
  """(records, reason → number of rows dropped): each row through ``rec.convert`` (and
  ``rec.train_filter`` for the train split) and the task's line checks; at most ``limit``
  records kept."""
  records, dropped = [], collections.Counter()
  keep = rec.train_filter if split == "train" and rec.train_filter else lambda record: None
  for row in rows:
    if limit is not None and len(records) >= limit:
      break
    try:
      record = rec.convert(row)
      keep(record)
    except Skip as err:
      dropped[str(err)] += 1
      continue
    problem = record_problem(rec.task, record)
    if problem is not None:
      dropped[problem] += 1
      continue
    records.append(record)
  return records, dict(dropped)


def write_jsonl(path: str, records: Iterable[Mapping[str, Any]]) -> None:
  with paths.resolve(path).open("w", encoding="utf-8") as f:
    for record in records:
      f.write(json.dumps(record, ensure_ascii=False) + "\n")


TASK_CONFIGS = {"gsm8k": "configs/llada_tpu.py", "math500": "configs/llada_math.py",
                "countdown_jsonl": "configs/llada_countdown.py",
                "code": "configs/coupled_grpo.py"}  # a config of each task


def config_overrides(task: str, files: Mapping[str, str]) -> list[str]:
  """The flags that point a run at the written files: ``--config=`` a config of the task where
  the repo has one (the embedded default's arithmetic options, prompt width and model do not
  fit another task; a test-only set has no such config: those name a train file), then
  ``--config.`` overrides."""
  flags = [f"--config={TASK_CONFIGS[task]}"] if task in TASK_CONFIGS and "train" in files else []
  flags += [f"--config.task.name={task}"]
  flags += [f"--config.task.options.{split}_file={path}" for split, path in sorted(files.items())]
  return flags


def prepare(name: str, out: str, *, sources: Mapping[str, Source] | None = None,
            limit: int | None = None, cache_dir: str | None = None) -> dict:
  """Writes the data set ``name`` under ``out`` (module doc) and returns its manifest."""
  rec = recipe(name)
  check_splits(name, sources or {})
  splits = {**rec.splits, **(sources or {})}
  paths.check_backend(out)
  dest = paths.resolve(out)
  if dest.exists() and not dest.is_dir():
    raise DataError(f"--out {out} is a file, not a folder; give a new or existing folder")
  try:
    dest.mkdir(parents=True, exist_ok=True)
  except OSError as err:  # a parent that is a file, no permission
    raise DataError(f"--out {out}: cannot create the folder ({err})") from None
  files, rows, dropped, converted = {}, {}, {}, {}
  # Every split is read and converted before any file is written: a source that fails (a bad
  # row, no network) leaves the folder as it was, not a new train.jsonl beside an old test.jsonl.
  for split, source in sorted(splits.items(), reverse=True):  # train, then test
    records, dropped[split] = convert_rows(load_rows(source, cache_dir), rec, split, limit)
    if not records:
      raise DataError(f"{name} {split}: no usable row in {source.describe()} (dropped: "
                      f"{dropped[split] or 'none'})")
    converted[split] = records
  # the files as the printed flags and dataset.json name them: a local folder's absolute path,
  # since a run starts from a checkout's root (its --config=configs/...), not from here
  root = out if paths.is_url(out) else os.fspath(dest)
  for split, records in converted.items():
    files[split] = paths.join(root, f"{split}.jsonl")
    write_jsonl(files[split], records)
    rows[split] = len(records)
  task = make_task(rec.task, **{f"{split}_file": path for split, path in files.items()})
  for split in files:  # read back by the trainer's own loader
    if len(task.generate(split, -1, seed=0)) != rows[split]:
      raise DataError(f"{files[split]}: the {rec.task} task reads back a different number of "
                      f"rows than the {rows[split]} written")
  manifest = {"dataset": name, "task": rec.task, "files": files, "rows": rows,
              "dropped": dropped, "sources": {s: src.describe() for s, src in splits.items()},
              "config": config_overrides(rec.task, files), "note": rec.note}
  paths.resolve(paths.join(root, MANIFEST)).write_text(json.dumps(manifest, indent=2) + "\n")
  return manifest
