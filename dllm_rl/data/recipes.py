"""The named data sets of ``dllm-rl-data prepare``: where each split comes from, and how one
source row becomes one line of the trainer's JSONL files (``dllm_rl.tasks.jsonl``).

Sources (the ones d1 trains and evaluates on: dllm-reasoning/d1 @837888f,
``diffu-grpo/data_utils.py`` for training, ``eval/*.py`` for testing; SPG uses the same; the
code sets: DiffuCoder's AceCode, and HumanEval / MBPP to evaluate on):

| name | task | train | test |
| --- | --- | --- | --- |
| gsm8k | gsm8k | openai/gsm8k (main) train, 7,473 | openai/gsm8k (main) test, 1,319 |
| math | math500 | ankner/math-500 train, 12,000 (MATH without the MATH-500 problems), those under 1,500 characters (StableDRL's filter) | HuggingFaceH4/MATH-500 test, 500 |
| math500 | math500 | none (evaluation only) | HuggingFaceH4/MATH-500 test, 500 |
| countdown | countdown_jsonl | Jiayi-Pan/Countdown-Tasks-3to4 train, 3-number instances | d1 ``dataset/countdown_cd3_test.jsonl``, 256 |
| sudoku | sudoku_jsonl | d1 ``dataset/4x4_sudoku_unique_puzzles.csv`` | d1 ``dataset/4x4_test_sudoku.csv``, 500 |
| acecode | code | TIGER-Lab/AceCode-89K train (DiffuCoder's source; its hard subset: ``--source``) | openai/openai_humaneval test, 164 |
| humaneval | code | none (evaluation only) | openai/openai_humaneval test, 164 |
| mbpp | code | none (evaluation only) | google-research-datasets/mbpp (sanitized) test, 257 |

The evaluation-only sets take no ``--source train=``: training data of their task goes
through ``math`` or ``acecode`` (:func:`dllm_rl.data.prepare.check_splits`).

StableDRL (configs/math_spg_snis.yaml) trains MATH on qwedsacf/competition_math (all 12,500
problems, MATH-500's included): ``--source train=qwedsacf/competition_math``.

A converter maps one source row (a dict) to one JSONL record, or raises :class:`Skip` with the
reason (counted in the manifest); every kept record then passes the task's own line checks.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any, Callable, Mapping

from dllm_rl.tasks import verifiers

D1 = ("https://raw.githubusercontent.com/dllm-reasoning/d1/"
      "837888f22c21a5da91a0af2b0d7b19e81d9b47ec/dataset/")


class Skip(ValueError):
  """A source row that is left out (the message is the reason, counted in the manifest)."""


@dataclasses.dataclass(frozen=True)
class Source:
  """One split's origin: a hub data set (``path`` = its id, ``config``, ``split``), a
  ``datasets`` builder over files (``path`` = "json" / "csv", ``data_files``), or a local file
  or ``save_to_disk`` folder (``path`` with ``local=True``)."""

  path: str
  config: str | None = None
  split: str = "train"
  data_files: str | None = None
  local: bool = False

  def describe(self) -> str:
    if self.local:
      return self.path
    if self.data_files:
      return self.data_files
    return self.path + (f" ({self.config})" if self.config else "") + f" split {self.split}"


@dataclasses.dataclass(frozen=True)
class Recipe:
  """``task``: the trainer's task that reads the files; ``splits``: "train" / "test" → source;
  ``convert``: source row → JSONL record (raises :class:`Skip`); ``train_filter``: a record
  → None, or raises :class:`Skip` (training data only; the test split stays whole)."""

  task: str
  splits: Mapping[str, Source]
  convert: Callable[[Mapping[str, Any]], dict]
  note: str = ""
  train_filter: Callable[[dict], None] | None = None


def _text(row: Mapping[str, Any], *keys: str) -> str | None:
  for key in keys:
    value = row.get(key)
    if isinstance(value, str) and value.strip():
      return value
  return None


def _required_text(row: Mapping[str, Any], key: str, hint: str = "") -> str:
  """``row[key]``, non-blank text; else Skip saying which: missing (or null), empty, or of
  another type (named, then ``hint``: what the field should hold)."""
  value = row.get(key)
  if value is None:
    raise Skip(f"no '{key}'")
  if not isinstance(value, str):
    raise Skip(f"'{key}' is {type(value).__name__}, not text{hint}")
  if not value.strip():
    raise Skip(f"'{key}' is empty")
  return value


_GSM8K_ANSWER = (" (a GSM8K answer is the worked solution ending in '#### x', the SFT target;"
                 " a bare final answer x can be given as the text '#### x')")


def gsm8k_record(row: Mapping[str, Any]) -> dict:
  """``{"question", "answer"}``, the answer ending in ``#### x``. An answer that is not text
  (a bare number) is dropped with its type named, not rewritten: the whole answer is the
  task's SFT target, which a number alone is not."""
  return {"question": _required_text(row, "question"),
          "answer": _required_text(row, "answer", _GSM8K_ANSWER)}


def math_record(row: Mapping[str, Any]) -> dict:
  """``{"problem", "solution"?, "answer"?}``: the answer, or a solution with ``\\boxed{}``."""
  problem = _text(row, "problem")
  if problem is None:
    raise Skip("no 'problem'")
  record = {"problem": problem}
  for key in ("solution", "answer"):
    value = row.get(key)
    if value is not None and str(value).strip():
      record[key] = str(value)
  if "answer" not in record and not verifiers.last_boxed(record.get("solution", "")):
    raise Skip("no 'answer' and no \\boxed{} in the solution")
  return record


MAX_MATH_TRAIN_CHARS = 1500  # StableDRL dataloaders/math.py: len(problem) < 1500


def short_math_problem(record: dict) -> None:
  """StableDRL's filter of its MATH training problems: under 1,500 characters."""
  if len(record["problem"]) >= MAX_MATH_TRAIN_CHARS:
    raise Skip(f"problem of {MAX_MATH_TRAIN_CHARS}+ characters (StableDRL's training filter)")


def countdown_record(row: Mapping[str, Any]) -> dict:
  """``{"nums", "target"}`` from ``nums`` / ``target`` (Countdown-Tasks) or d1's test file
  (``input`` "a,b,c", ``output`` "t"); 3-number instances only, as d1 trains."""
  try:
    if "nums" in row:
      nums, target = [int(n) for n in row["nums"]], int(row["target"])
    else:
      nums = [int(n) for n in str(row["input"]).split(",")]
      target = int(str(row["output"]).strip())
  except (KeyError, TypeError, ValueError) as err:
    raise Skip(f"no integer 'nums' / 'target' ({type(err).__name__})") from None
  if len(nums) != 3:
    raise Skip(f"{len(nums)} numbers (d1 keeps the 3-number instances)")
  return {"nums": nums, "target": target}


def _grid(value: Any) -> str:
  # a CSV reader may read "0140..." as the integer 140...: restore the leading zeros
  return str(value).strip().zfill(16) if isinstance(value, int) else str(value).strip()


def sudoku_record(row: Mapping[str, Any]) -> dict:
  """``{"puzzle", "solution"}`` (16 digits each) from d1's ``Puzzle`` / ``Solution`` columns."""
  puzzle = row.get("Puzzle", row.get("puzzle"))
  solution = row.get("Solution", row.get("solution"))
  if puzzle is None or solution is None:
    raise Skip("no 'Puzzle' / 'Solution'")
  return {"puzzle": _grid(puzzle), "solution": _grid(solution)}


def _required_strings(row: Mapping[str, Any], key: str) -> list[str]:
  """``row[key]``, a non-empty list of non-blank texts; else Skip saying which: missing (or
  null), not a list (its type named), empty, or holding an item that is blank or not text (its
  type named). The reasons name no item's index: each is one count of the manifest's."""
  value = row.get(key)
  if value is None:
    raise Skip(f"no '{key}'")
  if not isinstance(value, (list, tuple)):
    raise Skip(f"'{key}' is {type(value).__name__}, not a list of text")
  if not value:
    raise Skip(f"'{key}' is empty")
  for item in value:
    if not isinstance(item, str):
      raise Skip(f"'{key}' holds an item that is {type(item).__name__}, not text")
    if not item.strip():
      raise Skip(f"'{key}' holds an empty item")
  return list(value)


# MBPP's prompt (Austin et al. 2021, "Program Synthesis with Large Language Models", 2.1).
_MBPP_QUESTION = ("You are an expert Python programmer, and here is your task: {text} Your code"
                  " should pass these tests:\n\n{tests}")
_HUMANEVAL_QUESTION = ("Complete the following Python function; write the whole function in"
                       " one ```python block.\n```python\n{prompt}```")


def prompt_context(prompt: str, entry: str) -> str:
  """What a HumanEval prompt defines beside the function to write (its imports and helper
  functions, such as HumanEval/38's ``encode_cyclic``), as source: the official harness runs
  prompt + completion, so the test may call them; an instruct completion holds the function
  alone. "" when the prompt does not parse."""
  try:
    tree = ast.parse(prompt)
  except SyntaxError:
    return ""
  keep = [node for node in tree.body
          if not (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry)]
  return "\n".join(ast.get_source_segment(prompt, node) for node in keep)


def _layout(row: Mapping[str, Any], kind: str, field: str) -> None:
  """Skip ``row`` unless it has ``field``, the mark of ``kind``'s layout (a HumanEval file
  given to ``prepare mbpp`` is skipped, named, not converted)."""
  if field not in row:
    raise Skip(f"not a {kind} row: no '{field}' (fields: {sorted(row)})")


def acecode_record(row: Mapping[str, Any]) -> dict:
  """AceCode-89K (``question``, ``test_cases``): the ``code`` task's record as it is; a row
  without a usable question, or test cases, is dropped naming which (the question first)."""
  _layout(row, "AceCode", "test_cases")
  return {"question": _required_text(row, "question"),
          "test_cases": _required_strings(row, "test_cases")}


def humaneval_record(row: Mapping[str, Any]) -> dict:
  """HumanEval (``prompt``, ``test``, ``entry_point``, ``canonical_solution``): one case, the
  prompt's imports and helpers (:func:`prompt_context`), the test body, then
  ``check(entry_point)``."""
  _layout(row, "HumanEval", "entry_point")
  prompt, test, entry = (_required_text(row, key) for key in ("prompt", "test", "entry_point"))
  context = prompt_context(prompt, entry.strip())
  record = {"question": _HUMANEVAL_QUESTION.format(prompt=prompt),
            "test_cases": [f"{context}\n\n{test}\ncheck({entry.strip()})".lstrip()]}
  if _text(row, "canonical_solution"):
    record["solution"] = prompt + row["canonical_solution"]
  return record


def mbpp_record(row: Mapping[str, Any]) -> dict:
  """MBPP, full or sanitized (``text`` / ``prompt``, ``test_list``, ``test_setup_code`` /
  ``test_imports``, ``code``): one case per assert, the set-up before each; the question is
  the MBPP paper's prompt."""
  _layout(row, "MBPP", "test_list")
  text = _text(row, "text", "prompt")
  if text is None:
    raise Skip("no 'text' / 'prompt' (or an empty one)")
  asserts = _required_strings(row, "test_list")
  imports = row.get("test_imports") or []
  setup = "\n".join([*(imports if isinstance(imports, list) else [str(imports)]),
                     str(row.get("test_setup_code") or "")]).strip()
  record = {"question": _MBPP_QUESTION.format(text=text.strip(), tests="\n".join(asserts)),
            "test_cases": [f"{setup}\n{a}" if setup else a for a in asserts]}
  if _text(row, "code"):
    record["solution"] = row["code"]
  return record


# Each code layout by the field that marks it, in the order they are tried.
_CODE_LAYOUTS = (("test_cases", acecode_record), ("entry_point", humaneval_record),
                 ("test_list", mbpp_record))


def code_record(row: Mapping[str, Any]) -> dict:
  """``{"question", "test_cases", "solution"?}`` (the ``code`` task) from a row of any of
  the code layouts (:func:`acecode_record`, :func:`humaneval_record`, :func:`mbpp_record`),
  told apart by their fields."""
  for field, convert in _CODE_LAYOUTS:
    if field in row:
      return convert(row)
  raise Skip(f"not an AceCode, HumanEval or MBPP row (fields: {sorted(row)})")


_MATH500 = Source("HuggingFaceH4/MATH-500", split="test")
_HUMANEVAL = Source("openai/openai_humaneval", split="test")
_MBPP = Source("google-research-datasets/mbpp", "sanitized", "test")

RECIPES: dict[str, Recipe] = {
    "gsm8k": Recipe("gsm8k", {"train": Source("openai/gsm8k", "main", "train"),
                              "test": Source("openai/gsm8k", "main", "test")}, gsm8k_record),
    "math": Recipe("math500", {"train": Source("ankner/math-500", split="train"),
                               "test": _MATH500}, math_record,
                   note="StableDRL trains on qwedsacf/competition_math: "
                        "--source train=qwedsacf/competition_math",
                   train_filter=short_math_problem),
    "math500": Recipe("math500", {"test": _MATH500}, math_record,
                      note="test split only: mode=eval"),
    "countdown": Recipe("countdown_jsonl", {
        "train": Source("Jiayi-Pan/Countdown-Tasks-3to4", split="train"),
        "test": Source("json", data_files=D1 + "countdown_cd3_test.jsonl")}, countdown_record),
    "sudoku": Recipe("sudoku_jsonl", {
        "train": Source("csv", data_files=D1 + "4x4_sudoku_unique_puzzles.csv"),
        "test": Source("csv", data_files=D1 + "4x4_test_sudoku.csv")}, sudoku_record),
    "acecode": Recipe("code", {"train": Source("TIGER-Lab/AceCode-89K", split="train"),
                               "test": _HUMANEVAL}, code_record,
                      note="DiffuCoder trains on its hard subset (recipes/process_data.py):"
                           " --source train=acecode_hard.jsonl"),
    "humaneval": Recipe("code", {"test": _HUMANEVAL}, humaneval_record,
                        note="test split only: mode=eval"),
    "mbpp": Recipe("code", {"test": _MBPP}, mbpp_record, note="test split only: mode=eval"),
}
