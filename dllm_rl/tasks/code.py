"""``code``: Python problems with test cases, rewarded as DiffuCoder rewards them.

One JSON object per line: ``{"question": str, "test_cases": [str, ...]}`` (AceCode-89K's
fields; each case an ``assert`` line or a test body that exits non-zero on failure) and
optionally ``"solution"`` (reference code: the SFT target, written as the fenced block the
format reward asks for). ``dllm-rl-data prepare acecode | humaneval | mbpp`` writes such files.

Reward (apple/ml-diffucoder ``recipes/config_coupled_code.yaml``: ``reward_funcs`` code and
code_format, ``reward_weights`` 2.0 and 0.5):

    reward = exec_weight · pass_rate + format_weight · format_score

with :func:`dllm_rl.tasks.code_exec.format_score` (1 / 0.5 / 0) and the test cases' pass rate,
run only when the format score is 1 (0 otherwise, as ``code_reward`` skips the rest; 0 too
when a case runs out of time, as the official script dies then). A
completion is ``correct`` when it passes every case (DiffuCoder's ``binary_code_reward``:
pass rate > 0.99); ``parsed`` is its code in :func:`normal_form` (comments and formatting
dropped, so they alone never make two answers distinct), None (malformed) without a
```` ```python ```` block. Special-token markers the decoded completion ends with
(``<|im_end|>``) are removed first: the official decode skips special tokens.

Running the completion's code is what this task does: see :mod:`dllm_rl.tasks.code_exec` for
the limits it runs under, and run it in a container when the data or the model is untrusted.
"""

from __future__ import annotations

import ast
from typing import Any, Mapping

from dllm_rl.tasks import code_exec
from dllm_rl.tasks.base import TASKS, VerifyResult, malformed
from dllm_rl.tasks.jsonl_base import JsonlTask
from dllm_rl.tasks.jsonl_lines import BadRecord, record_field

MAX_CASES = 1000


def fenced(code: str) -> str:
  """``code`` as the one fenced block the format reward asks for (the SFT target)."""
  return f"```python\n{code.strip()}\n```\n"


def normal_form(code: str) -> str:
  """``ast.unparse(ast.parse(code))`` where ``code`` parses as Python (never run): comments,
  blank lines, spacing and quote styles gone. A normal form of notation, not of meaning: two
  programs that compute the same thing differently stay distinct. ``code`` itself where it
  does not parse, is over ``code_exec.MAX_CODE_CHARS`` characters, or is too deeply nested
  for the parser or unparser (RecursionError, MemoryError)."""
  if len(code) > code_exec.MAX_CODE_CHARS:
    return code
  try:
    return ast.unparse(ast.parse(code))
  except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: a null byte
    return code


def code_result(completion: str, cases: list[str], exec_weight: float, format_weight: float,
                timeout_s: float) -> VerifyResult:
  """The task's score of one completion (module docstring)."""
  text = code_exec.strip_end_markers(completion)
  code = code_exec.extract_code(text)
  if code is None:
    return malformed("no ```python block")
  form = code_exec.format_score(text)
  # One case at a time: the trainer verifies the completions in parallel (parallel_verify).
  rate = (code_exec.pass_rate(code, cases, timeout_s=timeout_s, workers=1) if form == 1.0
          else 0.0)
  info: dict[str, Any] = {"format": form, "pass_rate": rate, "cases": len(cases)}
  if form < 1.0:
    info["reason"] = ("the block does not parse" if form else
                      "not the format: prose, one ```python block, nothing after it")
  return VerifyResult(reward=exec_weight * rate + format_weight * form,
                      correct=form == 1.0 and rate > 0.99, parsed=normal_form(code),
                      info=info)


@TASKS.register("code")
class CodeTask(JsonlTask):
  """Python problems with test cases (module docstring). Options beyond
  :class:`~dllm_rl.tasks.jsonl_base.JsonlTask`'s: ``exec_weight`` (2.0), ``format_weight`` (0.5),
  ``case_timeout`` (seconds per test case, 5.0 as DiffuCoder's)."""

  name = "code"
  recipe = "acecode"
  parallel_verify = True  # its verifier waits on child processes: completions run at once

  def __init__(self, train_file: str = "", test_file: str = "", on_error: str = "raise",
               prompt_template: str = "{question}", test_fraction: float | None = None,
               verify_timeout: float | None = None, prompt_preset: str = "",
               answer_tag: bool | None = None, exec_weight: float = 2.0,
               format_weight: float = 0.5, case_timeout: float = code_exec.CASE_TIMEOUT_S,
               wrong_reward: float = 0.0):
    for key, value in (("exec_weight", exec_weight), ("format_weight", format_weight)):
      if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"task 'code': {key} must be a number >= 0, got {value!r}")
    if isinstance(case_timeout, bool) or not isinstance(case_timeout, (int, float)) or not (
        0 < case_timeout < 3600):
      raise ValueError(f"task 'code': case_timeout must be seconds in (0, 3600), got"
                       f" {case_timeout!r}")
    self.exec_weight, self.format_weight = float(exec_weight), float(format_weight)
    self.case_timeout = float(case_timeout)
    super().__init__(train_file, test_file, on_error, prompt_template, test_fraction,
                     verify_timeout, prompt_preset, answer_tag, wrong_reward)
    if self.verify_timeout > 0:  # a deadline on the whole verification: it must let every
      # case run its own limit, or a completion that passes scores 0 ("timeout")
      ex = max((ex for exs in self._records.values() for ex in exs),
               key=lambda ex: len(ex.meta["test_cases"]), default=None)
      need = 0 if ex is None else len(ex.meta["test_cases"]) * self.case_timeout + 1
      if self.verify_timeout < need:
        raise ValueError(
            f"task 'code': verify_timeout={self.verify_timeout:g} s is shorter than the cases"
            f" of {ex.source} may run ({len(ex.meta['test_cases'])} × case_timeout"
            f" {self.case_timeout:g} s, one at a time): a completion that passes them would"
            f" score 0; each case has its own limit (case_timeout), so leave verify_timeout"
            f" at 0, or set it >= {need:g}")

  @classmethod
  def _fields(cls, record: Mapping[str, Any]):
    question = record_field(record, "question", str)
    cases = record_field(record, "test_cases", list)
    if not cases or len(cases) > MAX_CASES:
      raise BadRecord(f"field 'test_cases' must hold 1 to {MAX_CASES} cases, got {len(cases)}")
    if not all(isinstance(c, str) and c.strip() for c in cases):
      raise BadRecord("field 'test_cases' must hold non-empty strings (assert lines or test"
                      " bodies)")
    # optional: a null one is none (a data frame's missing cell)
    solution = record_field(record, "solution", str) if record.get("solution") is not None else ""
    return {"question": question.strip()}, fenced(solution) if solution else "", {
        "test_cases": list(cases)}

  def _checker(self):
    return code_result

  def _args(self, example):
    return (example.meta["test_cases"], self.exec_weight, self.format_weight,
            self.case_timeout)
