"""One line of a task's JSON Lines data file, and what can be wrong with it or the file.

A file whose first bytes say it is not JSON Lines text at all (:func:`not_jsonl`), a line that
is not UTF-8 (:func:`not_utf8`) or not JSON (:func:`invalid_json`), a JSON object with a key
given twice (:func:`unique_keys`), an integer over Python's limit (:func:`json_int`) or an
unpaired surrogate (:func:`surrogate_problem`), and a record's field of the wrong type
(:func:`record_field`): each as a message that says what is wrong and what to do.
:func:`parse_line` reads one line by these checks; the tasks (:mod:`dllm_rl.tasks.jsonl_base`)
name the file and line and raise or skip it, and ``dllm-rl-data prepare`` checks the files it
writes by the same functions.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

_DECOMPRESS = "decompress it ({}) and give the decompressed file"
_CONVERT = "convert it to JSON Lines with {convert}"
_UTF16 = "UTF-16 text (it starts with a UTF-16 byte-order mark)"
_ARROW = ("convert its data set with {convert_folder} (FOLDER: the save_to_disk folder that"
          " holds it)")
# The first bytes of files that are not JSON Lines text, what each is and what to do about
# it (see not_jsonl). No JSON Lines file starts with them: a JSON line starts with "{" or
# whitespace (after the UTF-8 byte-order mark that is read past).
_NOT_TEXT = (
    (b"\x1f\x8b", "gzip-compressed", _DECOMPRESS.format("gunzip -k {file}")),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", _DECOMPRESS.format("zstd -d {file}")),
    (b"\xfd7zXZ\x00", "xz-compressed", _DECOMPRESS.format("xz -dk {file}")),
    (b"PK\x03\x04", "a zip archive", "extract the .jsonl file from it (unzip {file}) and give it"),
    (b"PAR1", "a Parquet file", _CONVERT),
    (b"ARROW1", "an Arrow file", _ARROW),
    (b"\xff\xff\xff\xff", "an Arrow stream (a datasets cache or save_to_disk file)", _ARROW),
    (b"\xff\xfe", _UTF16, "save it as UTF-8"),
    (b"\xfe\xff", _UTF16, "save it as UTF-8"),
)


class BadRecord(ValueError):
  """A line that does not hold a valid record (message says what is wrong)."""


def record_field(record: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
  """``record[key]`` when it is there, of type ``kind`` (a bool is no int), not a blank string and
  free of unpaired surrogates; BadRecord saying which it is not otherwise."""
  if key not in record:
    raise BadRecord(f"missing field {key!r} (fields: {sorted(record)})")
  value = record[key]
  if isinstance(value, bool) or not isinstance(value, kind):
    raise BadRecord(f"field {key!r} must be {getattr(kind, '__name__', kind)}, "
                    f"got {type(value).__name__}")
  if isinstance(value, str) and not value.strip():
    raise BadRecord(f"field {key!r} is empty")
  problem = surrogate_problem(value, f"field {key!r}")
  if problem:
    raise BadRecord(problem)
  return value


class DuplicateKey(BadRecord):
  """A JSON object that gives a key twice (:func:`unique_keys`)."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
  """A JSON object's (key, value) pairs as a dict, json's ``object_pairs_hook``: DuplicateKey
  naming a key given twice, of which json would keep the last value without a word."""
  out: dict[str, Any] = {}
  for key, value in pairs:
    if key in out:
      raise DuplicateKey(f"duplicate key {key!r} in a JSON object (json would keep only its"
                         " last value): keep one")
    out[key] = value
  return out


def json_int(digits: str) -> int:
  """A JSON integer literal's value, json's ``parse_int``: BadRecord "invalid JSON value (...)"
  for one of over 4,300 digits (Python's int conversion limit), where json raises a bare
  ValueError that is no JSONDecodeError and carries no position."""
  try:
    return int(digits)
  except ValueError as err:
    raise BadRecord(f"invalid JSON value ({err})") from None


# How the data files' JSON is read: a key given twice and an integer over Python's limit are
# BadRecords (:func:`load_json`; ``json.JSONDecoder(**STRICT_JSON)`` to decode from a position).
STRICT_JSON = {"object_pairs_hook": unique_keys, "parse_int": json_int}


def load_json(text: str | bytes) -> Any:
  """``text`` parsed as JSON, by :func:`unique_keys` and :func:`json_int` (BadRecord for a key
  given twice or an integer over Python's limit; JSONDecodeError for text that is not JSON)."""
  return json.loads(text, **STRICT_JSON)


def surrogate_problem(value: Any, where: str = "the line") -> str | None:
  """Where ``value`` (a parsed JSON value) holds an unpaired UTF-16 surrogate: a ``\\ud800``
  escape without its pair, which JSON parses but which is no Unicode text (a tokenizer and a
  UTF-8 writer fail on it, far from the file and line); None when it holds none."""
  if isinstance(value, str):
    try:
      value.encode("utf-8")
    except UnicodeEncodeError as err:
      return (f"{where} holds an unpaired UTF-16 surrogate \\u{ord(value[err.start]):04x} at"
              f" character {err.start + 1} (half of a \\u escape pair): not Unicode text;"
              " fix or remove it")
  elif isinstance(value, (dict, list)):
    items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
    for key, item in items:
      problem = surrogate_problem(item, where if key is None else f"field {key!r}")
      if problem:
        return problem
  return None


def not_jsonl(raw: bytes, path: str, convert: str) -> str | None:
  """What the file ``path`` (its bytes ``raw``) is when its first bytes say it is not JSON
  Lines text at all (gzip, zstd or xz compressed, a zip archive, Parquet, Arrow, UTF-16), and
  what to do about it; None otherwise. ``convert``: the ``dllm-rl-data prepare`` command that
  converts a data set file into this task's JSONL, ``{}`` where the file goes. Read line by
  line, such a file is only "not UTF-8 text" at some column, which says neither what it is
  nor what to do.

  A UTF-8 byte-order mark is not among them: it is read past. It carries no content,
  RFC 8259 (8.1) lets a JSON parser ignore it, and Windows tools write it (Notepad before
  2019, PowerShell 5's ``Out-File -Encoding utf8``); refusing it would make the user save
  again a file that holds the right records."""
  for magic, what, todo in _NOT_TEXT:
    if raw.startswith(magic):
      folder = convert.format("FOLDER")
      if magic == b"PAR1" and not path.endswith(".parquet"):  # prepare reads by extension
        path += " (renamed to end in .parquet)"
      return (f"{what}, not JSON Lines text: "
              + todo.format(file=path, convert=convert.format(path), convert_folder=folder))
  return None


def invalid_json(err: json.JSONDecodeError) -> str:
  """``err`` (one line's parse error) as "invalid JSON (WHAT at column N)". Some of json's
  messages already end in "at" ("Unterminated string starting at", "Invalid control
  character at"): the column follows them directly, not as "at at column N"."""
  where = "column" if err.msg.endswith(" at") else "at column"
  return f"invalid JSON ({err.msg} {where} {err.colno})"


def not_utf8(line: bytes) -> str | None:
  """Why ``line`` (one line of a text file, as bytes) is not UTF-8 text: its first bad byte
  and column, and what to do; None when it is."""
  try:
    line.decode("utf-8")
  except UnicodeDecodeError as err:
    column = len(line[:err.start].decode("utf-8")) + 1
    return (f"not UTF-8 text (byte 0x{line[err.start]:02x} at column {column}); save the file"
            " as UTF-8")
  return None


def parse_line(data: bytes, path: str, convert: str, *, first: bool) -> dict:
  """The JSON object on ``data``, a non-blank line (as bytes) of the data file ``path``;
  BadRecord saying what is wrong with it: not UTF-8, a UTF-8 byte-order mark, not JSON, a key
  given twice, not an object; on the ``first`` non-blank line also a JSON array or a CSV file.
  ``convert``: as :func:`not_jsonl`'s."""
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError:
    raise BadRecord(not_utf8(data)) from None
  if first and text.lstrip().startswith("["):
    raise BadRecord("the file starts a JSON array ('['), not JSON Lines (one JSON object"
                    f" per line): write each object on its own line (jq -c '.[]' {path})"
                    f" or convert it with {convert.format(path)}")
  if (first and path.lower().endswith(".csv")
          and not text.lstrip().startswith("{")):  # d1's Sudoku files are CSV
    raise BadRecord("a CSV file, not JSON Lines (one JSON object per line): convert it"
                    f" with {convert.format(path)}")
  if text.startswith("\ufeff"):
    raise BadRecord("starts with a UTF-8 byte-order mark (files joined together?):"
                    " remove it")
  try:
    record = load_json(text)
  except json.JSONDecodeError as err:
    raise BadRecord(invalid_json(err)) from err
  if not isinstance(record, dict):
    raise BadRecord(f"expected a JSON object, got {type(record).__name__}")
  return record
