"""Tasks read from local JSONL files: GSM8K, MATH-500, Countdown, 4×4 sudoku.

One JSON object per line (blank lines are ignored):

* ``gsm8k``: ``{"question", "answer"}``, the answer a worked solution ending in
  ``#### x``. SFT target: the whole answer; reference: x.
* ``math500``: ``{"problem", "answer"}`` or ``{"problem", "solution"}`` (with
  ``\\boxed{}``; a null one is missing). SFT target: ``\\boxed{answer}``, else the solution;
  reference: the answer, else the solution's last boxed body. Checked by math-verify in a
  worker process with a hard timeout (``verify_timeout`` seconds).
* ``countdown_jsonl``: ``{"nums": [...], "target": n}`` and optionally
  ``"solution"`` (an expression, checked at load). SFT target: the solution or "".
* ``sudoku_jsonl``: ``{"puzzle": 16 digits 0-4 (0 = blank), "solution": 16
  digits 1-4}``. SFT target: the solution.

Files are read through :mod:`dllm_rl.paths`, so a ``gs://`` file works like a
local one (``python -m dllm_rl.data prepare`` writes them). Splits come from
``train_file`` and ``test_file``; without ``test_file`` the test split is carved
out of ``train_file`` by ``split_of`` on the question, like the generated tasks;
without ``train_file`` the task has a test split only (MATH-500: evaluation).
``generate(split, n, seed)`` returns the first n records of the split after a shuffle
seeded by (seed, split), so it is a pure function of the files and its arguments; n = -1
means every record.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import json
import logging
import threading
from typing import Any, Callable, Mapping

import numpy as np

from dllm_rl import paths
from dllm_rl.tasks import prompts, verifiers
from dllm_rl.tasks.timed_verifier import TimedVerifier
from dllm_rl.tasks.base import (TASKS, Example, Task, VerifyResult, check_split, malformed,
                                split_of)
from dllm_rl.tasks.sudoku import is_valid_solution

ON_ERROR = ("raise", "skip")
MATH_VERIFY_TIMEOUT = 5.0  # seconds per math-verify grading, in a worker (MATH, GSM8K by it)
_MAX_SKIP_REASONS = 20
_PARSED: dict[tuple, tuple] = {}  # what JsonlTask._parse found, by the file's bytes (_load)
_PARSED_MAX = 2  # a run's train and test file
# A file of more bytes than this (its records take ~4x in memory) has its records kept for one
# later build only (validation, then the run); kept after it, they would outlive every task
# that uses them for the process's lifetime. What its warning said is kept like a small file's.
_PARSED_KEEP_BYTES = 64 << 20
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


class NoRecords(ValueError):
  """A data file that holds no record (empty, or every line skipped): a smaller split size
  does not help, so callers name the file's option (``option``: "train_file" / "test_file")
  rather than the size."""

  def __init__(self, message: str, option: str):
    super().__init__(message)
    self.option = option


class _BadRecord(ValueError):
  """A line that does not hold a valid record (message says what is wrong)."""


def _field(record: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
  if key not in record:
    raise _BadRecord(f"missing field {key!r} (fields: {sorted(record)})")
  value = record[key]
  if isinstance(value, bool) or not isinstance(value, kind):
    raise _BadRecord(f"field {key!r} must be {getattr(kind, '__name__', kind)}, "
                     f"got {type(value).__name__}")
  if isinstance(value, str) and not value.strip():
    raise _BadRecord(f"field {key!r} is empty")
  problem = surrogate_problem(value, f"field {key!r}")
  if problem:
    raise _BadRecord(problem)
  return value


class DuplicateKey(_BadRecord):
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


class JsonlTask(Task):
  """Base of the file-backed tasks.

  Options: ``train_file`` / ``test_file`` (paths; FileNotFoundError naming a
  missing one, IsADirectoryError a folder); ``on_error``: "raise" (ValueError
  "file:line: what is wrong", a line that is not UTF-8 included, and a first line
  that opens a JSON array) or "skip" (malformed lines are dropped and counted in
  ``skipped``, the first few described in ``skip_reasons``); a file that is not
  JSON Lines text at all (compressed, an archive, Parquet, Arrow, UTF-16:
  :func:`not_jsonl`) is a ValueError saying what it is and what to do, with
  either; ``prompt_template``: a format string
  over ``{question}`` and the task's own fields; ``prompt_preset``: a named
  template set instead (:data:`dllm_rl.tasks.prompts.PROMPT_PRESETS`, e.g.
  "d1"); ``answer_tag``: the reward reads only the last ``<answer>`` span (to the end when
  unclosed; Countdown and Sudoku: the last closed ``<answer>...</answer>``, as d1; a
  completion without one scores 0); None = the preset's choice for the task (False without
  one; d1: MATH reads no span, it needs a ``\\boxed{}`` answer anywhere instead);
  ``verify_timeout``: seconds per verification in a worker process
  (``timed_verifier.TimedVerifier``), 0 = in process, None = the task's default;
  ``test_fraction``: without ``test_file``, the share of ``train_file`` held out
  as the test split (default 0.1; with a ``test_file`` it is an error to give it);
  ``wrong_reward`` (in [-1, 0]): the reward of a parsed wrong answer that earns nothing
  (StableDRL: -1, with ``rl.malformed_reward`` -1 for one that does not parse). The
  ``stabledrl`` preset grades GSM8K by math-verify on the whole completion, as StableDRL does.

  Subclasses implement ``_fields(record)`` → (template fields, SFT answer,
  verifier meta), raising ``_BadRecord``; ``_checker()`` and ``_args(example)``
  name the module-level verifier and its arguments after the completion.
  """

  char_text = False  # text written elsewhere: a real tokenizer (model.hf_checkpoint's)
  recipe = ""  # the dllm-rl-data prepare data set that writes this task's files
  default_question = "{question}"
  default_verify_timeout = 0.0  # seconds; 0 = verify in-process
  preload: tuple[str, ...] = ()  # modules the verifier worker imports up front
  # With answer_tag: read the last closed <answer>...</answer> (no closed pair: 0), as d1's
  # Countdown and Sudoku rewards do; False reads the last <answer> to the end when unclosed,
  # as d1's extract_xml_answer (GSM8K).
  closed_answer = False
  # The choices of the task option ``reward`` (the first is the default; a preset may name
  # another, :attr:`dllm_rl.tasks.prompts.Preset.rewards`); none: the task has no such option.
  # "d1": d1's reward functions, as run (:meth:`_d1_reward`).
  rewards: tuple[str, ...] = ()

  def __init__(self, train_file: str = "", test_file: str = "", on_error: str = "raise",
               prompt_template: str = "{question}", test_fraction: float | None = None,
               verify_timeout: float | None = None, prompt_preset: str = "",
               answer_tag: bool | None = None, wrong_reward: float = 0.0,
               reward: str | None = None):
    if test_fraction is not None and test_file:
      raise ValueError(f"task {self.name!r}: test_fraction splits the test set off train_file"
                       f" when there is no test_file; with test_file={str(test_file)!r} it is"
                       " not read: leave it out")
    super().__init__(0.1 if test_fraction is None else test_fraction)  # default: 10 %
    if not train_file and not test_file:
      raise ValueError(f"task {self.name!r} needs option train_file and/or test_file")
    if on_error not in ON_ERROR:
      raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    self.train_file, self.test_file = str(train_file), str(test_file)
    self.on_error, self.prompt_template = on_error, str(prompt_template)
    self.answer_tag = bool(answer_tag)
    self.needs_boxed = False  # the reward needs a \boxed{} answer (0 without one)
    self.math_verify = False  # graded by math-verify (the preset's choice for GSM8K)
    if not -1.0 <= wrong_reward <= 0.0:  # nan too
      raise ValueError(f"task {self.name!r}: wrong_reward must be in [-1, 0], got {wrong_reward!r}")
    self.wrong_reward = float(wrong_reward)
    if prompt_preset:
      if self.prompt_template != "{question}":
        raise ValueError(f"task {self.name!r}: give prompt_preset or prompt_template, not both "
                         f"(got {prompt_preset!r} and {prompt_template!r})")
      found = prompts.preset(prompt_preset, self.name)
      self.prompt_template = found.templates[self.name]
      tagged = self.name in found.answer_tag
      self.answer_tag = tagged if answer_tag is None else bool(answer_tag)
      self.needs_boxed = self.name in found.boxed
      self.math_verify = self.name in found.math_verify
      if self.math_verify:  # its worker imports math-verify before the first deadline
        self.preload = ("math_verify",)
      reward = found.rewards.get(self.name) if reward is None else reward
    if reward is not None and reward not in self.rewards:
      raise ValueError(f"task {self.name!r}: reward must be one of {self.rewards}, got"
                       f" {reward!r}")
    self.reward = reward if reward is not None else (self.rewards or (None,))[0]
    default_timeout = MATH_VERIFY_TIMEOUT if self.math_verify else self.default_verify_timeout
    self.verify_timeout = float(default_timeout if verify_timeout is None else verify_timeout)
    if not 0 <= self.verify_timeout < float("inf"):  # nan too
      raise ValueError(f"task {self.name!r}: verify_timeout must be a finite number of seconds"
                       f" >= 0 (0 = verify in-process), got {verify_timeout!r}")
    self.skipped = 0
    self.skip_reasons: list[str] = []
    self._file_skips: dict[str, tuple[int, str]] = {}  # path → (lines skipped, the first)
    paths = dict.fromkeys(p for p in (self.train_file, self.test_file) if p)
    self._records = {path: self._load(path) for path in paths}  # each file read once
    self._timed: TimedVerifier | None = None
    self._timed_lock = threading.Lock()

  # --- loading --------------------------------------------------------------

  def _prompt(self, fields: Mapping[str, Any]) -> str:
    try:
      return self.prompt_template.format(**fields)
    except (KeyError, IndexError, ValueError) as err:
      raise ValueError(f"task {self.name!r}: prompt_template {self.prompt_template!r} "
                       f"cannot be filled ({type(err).__name__}: {err}); available "
                       f"fields: {sorted(fields)}") from err

  def _load(self, path: str) -> list[Example]:
    paths.check_backend(path)  # gs:// without gcsfs: BackendMissing naming the package
    file = paths.resolve(path)
    if file.is_dir():
      raise IsADirectoryError(f"task {self.name!r}: data file {path!r} is a directory, not a "
                              "file (give the .jsonl file in it)")
    if not file.is_file():
      raise FileNotFoundError(f"task {self.name!r}: data file {path!r} does not exist")
    with file.open("rb") as f:  # bytes: a line that is not UTF-8 is named (or skipped) like
      raw = f.read()  # any other; splitlines splits at \n, \r\n and \r, as text mode does
    split = "train" if path == self.train_file else "test"
    convert = (f"dllm-rl-data prepare {self.recipe} --out DIR --source {split}={{}} (docs/data.md),"
               f" then give DIR/{split}.jsonl")
    problem = not_jsonl(raw, path, convert)
    if problem:  # the whole file, whatever on_error says: no line of it is a record
      raise ValueError(f"task {self.name!r}: {path}: {problem}")
    # what the lines give depends on the bytes and on these alone: a task built again on the
    # same file (validation, then the run) takes the records parsed, and the warning given,
    # by the first (the records shared, not copied: the cache holds no second copy)
    key = (type(self), self.on_error, self.prompt_template, split, path,
           hashlib.blake2b(raw, digest_size=16).digest())
    parsed = _PARSED.pop(key, None)  # put back as the newest
    hit = parsed is not None and parsed[0] is not None
    if not hit:  # not parsed yet, or a large file whose records a build took: warned already
      parsed = self._parse(path, raw, convert, parsed is None)  # warn: not yet
    out, skipped, first_skip, reasons = parsed
    large = len(raw) > _PARSED_KEEP_BYTES  # taken once: the records are left to the tasks
    _PARSED[key] = (None, skipped, first_skip, reasons) if hit and large else parsed
    while len(_PARSED) > _PARSED_MAX:
      del _PARSED[next(iter(_PARSED))]  # the least recently built
    self.skip_reasons += reasons[:_MAX_SKIP_REASONS - len(self.skip_reasons)]
    self.skipped += skipped
    self._file_skips[path] = (skipped, first_skip)
    return list(out)  # the cached list stays as parsed whatever a caller does with this one

  def _parse(self, path: str, raw: bytes, convert: str,
             warn: bool = True) -> tuple[list[Example], int, str, list]:
    """The records of the file ``path`` (its bytes ``raw``), the number of lines skipped, the
    first skipped line and the first few (``where: what``); warns when lines were skipped
    (``warn``: not already)."""
    lines = raw.removeprefix(codecs.BOM_UTF8).splitlines()  # a leading BOM: see not_jsonl
    first = next((i for i, data in enumerate(lines, start=1) if data.strip()), 0)
    out, skipped, first_skip, reasons = [], 0, "", []
    for line_no, data in enumerate(lines, start=1):
      if not data.strip():
        continue
      try:
        try:
          text = data.decode("utf-8")
        except UnicodeDecodeError:
          raise _BadRecord(not_utf8(data)) from None
        if line_no == first and text.lstrip().startswith("["):
          raise _BadRecord("the file starts a JSON array ('['), not JSON Lines (one JSON object"
                           f" per line): write each object on its own line (jq -c '.[]' {path})"
                           f" or convert it with {convert.format(path)}")
        if (line_no == first and path.lower().endswith(".csv")
                and not text.lstrip().startswith("{")):  # d1's Sudoku files are CSV
          raise _BadRecord("a CSV file, not JSON Lines (one JSON object per line): convert it"
                           f" with {convert.format(path)}")
        if text.startswith("\ufeff"):
          raise _BadRecord("starts with a UTF-8 byte-order mark (files joined together?):"
                           " remove it")
        try:
          record = json.loads(text, object_pairs_hook=unique_keys)
        except _BadRecord:
          raise
        except json.JSONDecodeError as err:
          raise _BadRecord(invalid_json(err)) from err
        except ValueError as err:  # an integer of over 4,300 digits (Python's int limit)
          raise _BadRecord(f"invalid JSON value ({err})") from err
        if not isinstance(record, dict):
          raise _BadRecord(f"expected a JSON object, got {type(record).__name__}")
        fields, answer, meta = self._fields(record)
        if self.answer_tag and answer:  # an SFT target the reward reads
          answer = "<reasoning>{}</reasoning>\n<answer>{}</answer>".format(
              *self._reasoning_and_answer(answer))
        fields["question"] = self.default_question.format(**fields)
      except _BadRecord as err:
        where = f"{path}:{line_no}: {err}"
        if self.on_error == "raise":
          raise ValueError(f"task {self.name!r}: {where}") from None
        skipped += 1
        first_skip = first_skip or where
        if len(reasons) < _MAX_SKIP_REASONS:
          reasons.append(where)
        continue
      out.append(Example(prompt=self._prompt(fields), answer=answer,
                         meta={**meta, "key": self._key(fields)}, source=f"{path}:{line_no}"))
    if skipped and warn:  # the first one's line and problem: which lines, not only how many
      logging.warning("task %r: skipped %d malformed line(s) of %s (on_error='skip'; the first:"
                      " %s)", self.name, skipped, path, first_skip)
    return out, skipped, first_skip, reasons

  @classmethod
  def _fields(cls, record: Mapping[str, Any]) -> tuple[dict, str, dict]:
    raise NotImplementedError

  @classmethod
  def _reasoning_and_answer(cls, answer: str) -> tuple[str, str]:
    """An SFT target as (reasoning, final answer), for the tagged target the reward reads under
    ``answer_tag``: ``<reasoning>R</reasoning>\\n<answer>A</answer>``, d1's SFT format
    (SFT/sft_trainer.py @837888f, preprocess_dataset). The whole target is the answer here."""
    return "", answer.strip()

  def _key(self, fields: Mapping[str, Any]) -> str:
    """The instance's canonical string (decides the split without test_file)."""
    return fields["question"]

  def _pool(self, split: str) -> tuple[list[Example], str]:
    """Records of ``split`` and a description of where they come from."""
    if split == "test" and self.test_file:
      return self._records[self.test_file], self.test_file
    if not self.train_file:
      raise ValueError(f"task {self.name!r} has no train_file, so no {split!r} split")
    if self.test_file:
      return self._records[self.train_file], self.train_file
    pool = [ex for ex in self._records[self.train_file]
            if split_of(self.canonical(ex), self.test_fraction) == split]
    return pool, f"the {split!r} part of {self.train_file} (test_fraction={self.test_fraction})"

  # --- Task interface -------------------------------------------------------

  def has_split(self, split: str) -> bool:
    """train: needs ``train_file``; test: ``test_file`` or a share of ``train_file``."""
    check_split(split)
    return bool(self.train_file) if split == "train" else bool(self.test_file or self.train_file)

  def sample(self, rng: np.random.Generator) -> Example | None:
    raise NotImplementedError(f"task {self.name!r} reads its examples from files; "
                              "use generate()")

  def canonical(self, example: Example) -> str:
    return example.meta["key"]

  def enlarge_hint(self) -> str:
    return "give a larger file"

  def generate(self, split: str, n: int, seed: int) -> list[Example]:
    """The first n examples of ``split`` after a shuffle seeded by (seed, split);
    n = -1 for all of them. ValueError if the split has fewer than n."""
    split_idx = check_split(split)
    if n < -1 or seed < 0:
      raise ValueError(f"n must be >= -1 and seed >= 0, got n={n}, seed={seed}")
    pool, source = self._pool(split)
    file = self.test_file if split == "test" and self.test_file else self.train_file
    if n > 0 and not self._records[file]:  # not "has only 0": why the file gave none
      skipped, first = self._file_skips[file]
      why = (f"each of its {skipped} line(s) was skipped as malformed (on_error='skip'; the"
             f" first: {first})" if skipped else "the file is empty (blank lines at most)")
      raise NoRecords(f"task {self.name!r}: asked for {n} {split!r} examples but {file} holds"
                      f" no record: {why}",
                      "test_file" if file == self.test_file else "train_file")
    if n > len(pool):
      raise ValueError(f"task {self.name!r}: asked for {n} {split!r} examples but "
                       f"{source} has only {len(pool)}")
    perm = np.random.default_rng([seed, split_idx]).permutation(len(pool))
    return [pool[i] for i in perm[:len(pool) if n == -1 else n]]

  def _checker(self) -> Callable[..., VerifyResult]:
    """The module-level function that scores (completion, **meta-derived args)."""
    raise NotImplementedError

  def _args(self, example: Example) -> tuple:
    raise NotImplementedError

  def verify(self, example: Example, completion: str) -> VerifyResult:
    result = self._verified(example, completion)
    if self.reward == "d1":  # d1's sum, format terms included: never malformed, as in d1
      score = self._d1_reward(example, completion, result.correct)
      return VerifyResult(score, result.correct, "" if result.parsed is None else result.parsed,
                          {**result.info, "d1_reward": score})
    if self.wrong_reward and not result.correct and result.parsed is not None \
        and result.reward == 0.0:  # a wrong answer (not one with partial or format credit)
      return dataclasses.replace(result, reward=self.wrong_reward)
    return result

  def _d1_reward(self, example: Example, completion: str, correct: bool) -> float:
    """d1's reward of ``completion`` (``reward="d1"``), ``correct`` as this task grades it."""
    raise NotImplementedError

  def _verified(self, example: Example, completion: str) -> VerifyResult:
    """The task's verifier on the part of ``completion`` the preset reads."""
    if self.answer_tag:
      if "<answer>" not in completion:
        return malformed("no <answer> tag")
      if self.closed_answer:
        completion = verifiers.closed_answer_span(completion)
        if completion is None:
          return malformed("no closed <answer>...</answer>")
        # d1 grades the whole body, where an "<answer>" is text; the checkers' answer_span
        # would cut at it ("<answer>x<answer>3*5+7</answer>": d1 reads "x<answer>3*5+7")
        completion = completion.replace("<answer>", "<answer >")
      else:
        completion = verifiers.answer_span(completion)
    if self.needs_boxed and verifiers.last_boxed(completion) is None:
      return malformed("no \\boxed{} answer")
    return self._graded(completion, example)

  def _graded(self, completion: str, example: Example) -> VerifyResult:
    """The verifier's result, in a worker process under ``verify_timeout``."""
    fn, args = self._checker(), self._args(example)
    if self.verify_timeout <= 0:
      return fn(completion, *args)
    with self._timed_lock:  # one worker, also when verify runs on threads (parallel_verify)
      if self._timed is None:
        self._timed = TimedVerifier(fn, self.verify_timeout, preload=self.preload)
    return self._timed(completion, *args)

  def close(self) -> None:
    """Stops the verifier worker process, if any."""
    if self._timed is not None:
      self._timed.close()


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


def record_problem(task_name: str, record: Mapping[str, Any]) -> str | None:
  """What is wrong with ``record`` as one line of the files of JSONL task ``task_name``
  (None: nothing), by the same checks as loading."""
  cls = TASKS.get(task_name)
  if not issubclass(cls, JsonlTask):
    raise ValueError(f"task {task_name!r} does not read JSONL files")
  if not isinstance(record, dict):
    return f"expected a JSON object, got {type(record).__name__}"
  try:
    cls._fields(record)
  except _BadRecord as err:
    return str(err)
  return None


@TASKS.register("gsm8k")
class GSM8KTask(JsonlTask):
  """Grade-school math; reward 1 iff the final number equals the reference (``reward``
  "verifier"), or d1's reward (``"d1"``, the d1 preset's default)."""

  name = "gsm8k"
  recipe = "gsm8k"
  rewards = ("verifier", "d1")

  @classmethod
  def _fields(cls, record):
    question = _field(record, "question", str)
    answer = _field(record, "answer", str)
    if "####" not in answer:
      raise _BadRecord("field 'answer' has no '#### x' final answer")
    reference = verifiers.gsm8k_answer(answer)
    if reference is None:
      raise _BadRecord("no number after '####' in field 'answer'")
    # d1's extract_hash_answer: the text after the first "####", for its exact comparison
    return ({"question": question.strip()}, answer,
            {"reference": reference, "hash_answer": answer.split("####")[1].strip()})

  def _d1_reward(self, example, completion, correct):
    """d1's five GSM8K functions (:func:`dllm_rl.tasks.verifiers.d1_gsm8k_reward`)."""
    return verifiers.d1_gsm8k_reward(completion, example.meta["hash_answer"])

  @classmethod
  def _reasoning_and_answer(cls, answer):
    """The worked solution, then the text after its last ``####``."""
    reasoning, _, final = answer.rpartition("####")
    return reasoning.strip(), final.strip()

  def _checker(self):
    return verifiers.math_result if self.math_verify else verifiers.gsm8k_result

  def _args(self, example):
    return (example.meta["reference"],)


@TASKS.register("math500")
class Math500Task(JsonlTask):
  """Competition math; reward 1 iff math-verify finds the answers equivalent (``reward``
  "verifier"), or d1's reward (``"d1"``, the d1 preset's default)."""

  name = "math500"
  recipe = "math"
  rewards = ("verifier", "d1")
  default_verify_timeout = MATH_VERIFY_TIMEOUT
  preload = ("math_verify",)

  @classmethod
  def _fields(cls, record):
    problem = _field(record, "problem", str)
    # a null answer or solution is none (a data frame's missing cell, as pandas writes it)
    if record.get("answer") is not None:
      reference = _field(record, "answer", str).strip()
      answer = "\\boxed{" + reference + "}"
    elif record.get("solution") is not None:
      answer = _field(record, "solution", str)
      reference = verifiers.last_boxed(answer)
      if not reference or not reference.strip():
        raise _BadRecord("field 'solution' has no non-empty \\boxed{...} answer")
    else:
      raise _BadRecord(f"needs field 'answer' or 'solution' (fields: {sorted(record)}; a"
                       " null one counts as missing)")
    return {"question": problem.strip()}, answer, {"reference": reference}

  def _d1_reward(self, example, completion, correct):
    """d1's MATH reward: ``correctness_reward_func_math`` 2.0 (graded here by math-verify,
    d1: its ``is_equiv``) + its format reward
    (:func:`dllm_rl.tasks.verifiers.d1_math_format_reward`)."""
    return 2.0 * correct + verifiers.d1_math_format_reward(completion)

  def _checker(self):
    return verifiers.math_result

  def _args(self, example):
    return (example.meta["reference"],)


@TASKS.register("countdown_jsonl")
class CountdownJsonlTask(JsonlTask):
  """Countdown from a file; reward 1 iff each number is used once and the value hits."""

  name = "countdown_jsonl"
  recipe = "countdown"
  many_answers = True
  closed_answer = True  # d1's extract_solution
  default_question = ("Using the numbers {numbers}, create an equation that equals "
                      "{target}. Use + - * / and each number exactly once. Put the "
                      "equation inside <answer></answer>.")

  def __init__(self, train_file: str = "", test_file: str = "", on_error: str = "raise",
               prompt_template: str = "{question}", test_fraction: float | None = None,
               verify_timeout: float | None = None, prompt_preset: str = "",
               answer_tag: bool | None = None, format_score: float | None = None,
               wrong_reward: float = 0.0):
    """``format_score``: the reward of a wrong answer given in a closed ``<answer>`` span (d1's
    and StableDRL's ``compute_score``: 0.1, the d1 preset's default; else 0.0)."""
    if format_score is None:
      found = prompts.PROMPT_PRESETS.get(prompt_preset)
      format_score = found.format_scores.get(self.name, 0.0) if found else 0.0
    if not 0.0 <= format_score < 1.0:
      raise ValueError(f"format_score must be in [0, 1), got {format_score!r}")
    self.format_score = float(format_score)
    super().__init__(train_file, test_file, on_error, prompt_template, test_fraction,
                     verify_timeout, prompt_preset, answer_tag, wrong_reward)

  def verify(self, example: Example, completion: str) -> VerifyResult:
    """As the base task's; with ``format_score``, a wrong answer in a closed ``<answer>``
    span (any text, as d1's) scores it instead of 0 (counted as parsed, not malformed)."""
    result = super().verify(example, completion)
    span = verifiers.closed_answer_span(completion) if self.format_score else None
    if result.correct or span is None:
      return result
    return VerifyResult(self.format_score, False, span if result.parsed is None else result.parsed,
                        {**result.info, "format_score": self.format_score})

  @classmethod
  def _fields(cls, record):
    nums = _field(record, "nums", list)
    if len(nums) < 2 or any(isinstance(x, bool) or not isinstance(x, int) or not
                            0 <= x < 10**9 for x in nums):
      raise _BadRecord(f"field 'nums' must be >= 2 integers in [0, 10**9), got {nums!r}")
    target = _field(record, "target", int)
    solution = ""
    if record.get("solution") is not None:  # optional: a null one is none
      solution = _field(record, "solution", str).strip()
      check = verifiers.countdown_reward(solution, nums, target)
      if not check.correct:
        raise _BadRecord(f"field 'solution' {solution!r} is wrong: {check.info['reason']}")
    fields = {"numbers": ", ".join(map(str, nums)), "nums": str(list(nums)), "target": target}
    return fields, solution, {"numbers": list(nums), "target": target}

  def _key(self, fields):
    nums = sorted(int(x) for x in fields["numbers"].split(", "))
    return ",".join(map(str, nums)) + f">{fields['target']}"

  def _checker(self):
    return verifiers.countdown_reward

  def _args(self, example):
    return (example.meta["numbers"], example.meta["target"])


@TASKS.register("sudoku_jsonl")
class SudokuJsonlTask(JsonlTask):
  """4×4 sudoku from a file; reward ``solved`` (0/1) or ``cell_accuracy`` (the default under
  the d1 preset, d1's ``sudoku_reward_func``; else ``solved``)."""

  name = "sudoku_jsonl"
  recipe = "sudoku"
  closed_answer = True  # d1's extract_answer_sudoku
  default_question = ("Solve this 4x4 sudoku. The cells are given row by row and 0 "
                      "marks a blank: {puzzle}. Put the 16 digits of the solution "
                      "inside <answer></answer>.")

  rewards = ("solved", "cell_accuracy")  # the d1 preset's: cell_accuracy, as d1 trains

  @classmethod
  def _fields(cls, record):
    puzzle = _field(record, "puzzle", str).strip()
    solution = _field(record, "solution", str).strip()
    if len(puzzle) != 16 or any(ch not in "01234" for ch in puzzle):
      raise _BadRecord(f"field 'puzzle' must be 16 digits 0-4, got {puzzle!r}")
    if len(solution) != 16 or any(ch not in "1234" for ch in solution):
      raise _BadRecord(f"field 'solution' must be 16 digits 1-4, got {solution!r}")
    if not is_valid_solution([int(ch) for ch in solution]) or any(
        p not in ("0", s) for p, s in zip(puzzle, solution)):
      raise _BadRecord("field 'solution' is not a valid grid that keeps the puzzle's givens")
    return {"puzzle": puzzle}, solution, {"puzzle": puzzle, "solution": solution}

  def _key(self, fields):
    return fields["puzzle"]

  def _checker(self):
    return verifiers.sudoku_result

  def _args(self, example):
    return (example.meta["puzzle"], example.meta["solution"], self.reward)
