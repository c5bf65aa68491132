"""Tasks read from local JSONL files: GSM8K, MATH-500, Countdown, 4×4 sudoku.

One JSON object per line (blank lines are ignored):

* ``gsm8k``: ``{"question", "answer"}``, the answer a worked solution ending in
  ``#### x``. SFT target: the whole answer; reference: x. Under ``reward="d1"`` an answer
  with ``####`` twice is refused (d1 compares with the first's text, the target gives the
  last's).
* ``math500``: ``{"problem", "answer"}`` or ``{"problem", "solution"}`` (with
  ``\\boxed{}``; a null one is missing). SFT target: ``\\boxed{answer}``, else the solution;
  reference: the answer, else the solution's last boxed body. Checked by math-verify in a
  worker process with a hard timeout (``verify_timeout`` seconds).
* ``countdown_jsonl``: ``{"nums": [...], "target": n}`` and optionally
  ``"solution"`` (an expression, checked at load by the lenient verifier and, under
  ``reward="d1"``, by d1's ``compute_score`` as well). SFT target: the solution or "". Reward
  (``reward``): the lenient verifier, or d1's ``compute_score`` (the d1 preset's default).
* ``sudoku_jsonl``: ``{"puzzle": 16 digits 0-4 (0 = blank), "solution": 16
  digits 1-4}``. SFT target: the solution.

The reading, splits and options: :mod:`dllm_rl.tasks.jsonl_base`.
"""

from __future__ import annotations

from dllm_rl.tasks import prompts, verifiers
from dllm_rl.tasks.base import TASKS, Example, VerifyResult
from dllm_rl.tasks.jsonl_base import MATH_VERIFY_TIMEOUT, JsonlTask
from dllm_rl.tasks.jsonl_lines import BadRecord, record_field
from dllm_rl.tasks.sudoku import is_valid_solution


@TASKS.register("gsm8k")
class GSM8KTask(JsonlTask):
  """Grade-school math; reward 1 iff the final number equals the reference (``reward``
  "verifier"), or d1's reward (``"d1"``, the d1 preset's default)."""

  name = "gsm8k"
  recipe = "gsm8k"
  rewards = ("verifier", "d1")

  @classmethod
  def _fields(cls, record):
    question = record_field(record, "question", str)
    answer = record_field(record, "answer", str)
    if "####" not in answer:
      raise BadRecord("field 'answer' has no '#### x' final answer")
    reference = verifiers.gsm8k_answer(answer)
    if reference is None:
      raise BadRecord("no number after '####' in field 'answer'")
    # d1's extract_hash_answer: the text after the first "####", for its exact comparison
    return ({"question": question.strip()}, answer,
            {"reference": reference, "hash_answer": answer.split("####")[1].strip()})

  def _d1_reward(self, example, completion, correct):
    """d1's five GSM8K functions (:func:`dllm_rl.tasks.verifiers.d1_gsm8k_reward`)."""
    return verifiers.d1_gsm8k_reward(completion, example.meta["hash_answer"])

  def _check_target(self, answer, meta):
    """``reward="d1"``: the SFT target's final answer (after the last ``####``) must be the
    text d1's correctness term compares with (after the first), which differ when the answer
    holds ``####`` twice: its target would earn no correctness from the reward."""
    final = self._reasoning_and_answer(answer)[1]
    if self.reward == "d1" and final != meta["hash_answer"]:
      raise BadRecord(f"field 'answer': the text after its first '####'"
                      f" ({meta['hash_answer']!r}) is not the text after its last ({final!r}):"
                      " reward='d1' compares with the first, the SFT target answers the last,"
                      " which it would score wrong; keep one '#### x', or give the task"
                      " reward='verifier'")

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
    problem = record_field(record, "problem", str)
    # a null answer or solution is none (a data frame's missing cell, as pandas writes it)
    if record.get("answer") is not None:
      reference = record_field(record, "answer", str).strip()
      answer = "\\boxed{" + reference + "}"
    elif record.get("solution") is not None:
      answer = record_field(record, "solution", str)
      reference = verifiers.last_boxed(answer)
      if not reference or not reference.strip():
        raise BadRecord("field 'solution' has no non-empty \\boxed{...} answer")
    else:
      raise BadRecord(f"needs field 'answer' or 'solution' (fields: {sorted(record)}; a"
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
  """Countdown from a file; ``reward`` "verifier": 1 iff each number is used once and the
  value hits (a trailing ``= value`` dropped), or d1's ``compute_score`` (``"d1"``, the d1
  preset's default: :func:`dllm_rl.tasks.verifiers.d1_countdown_result`, where
  ``3*5+7=22`` for 3, 5, 7 scores the format score, 22 being one number too many)."""

  name = "countdown_jsonl"
  recipe = "countdown"
  many_answers = True
  closed_answer = True  # d1's extract_solution
  rewards = ("verifier", "d1")
  default_question = ("Using the numbers {numbers}, create an equation that equals "
                      "{target}. Use + - * / and each number exactly once. Put the "
                      "equation inside <answer></answer>.")

  def __init__(self, train_file: str = "", test_file: str = "", on_error: str = "raise",
               prompt_template: str = "{question}", test_fraction: float | None = None,
               verify_timeout: float | None = None, prompt_preset: str = "",
               answer_tag: bool | None = None, format_score: float | None = None,
               wrong_reward: float = 0.0, reward: str | None = None):
    """``format_score``: the reward of a wrong answer given in a closed ``<answer>`` span (d1's
    and StableDRL's ``compute_score``: 0.1, the d1 preset's default, and ``reward="d1"``'s
    without the preset; else 0.0)."""
    if format_score is not None and not 0.0 <= format_score < 1.0:
      raise ValueError(f"format_score must be in [0, 1), got {format_score!r}")
    super().__init__(train_file, test_file, on_error, prompt_template, test_fraction,
                     verify_timeout, prompt_preset, answer_tag, wrong_reward, reward)
    if format_score is None:
      found = prompts.PROMPT_PRESETS.get(prompt_preset)
      format_score = found.format_scores.get(self.name, 0.0) if found else 0.0
      format_score = 0.1 if self.reward == "d1" and not found else format_score
    self.format_score = float(format_score)

  def verify(self, example: Example, completion: str) -> VerifyResult:
    """``reward="d1"``: d1's ``compute_score`` of the whole completion. Otherwise as the base
    task's; with ``format_score``, a wrong answer in a closed ``<answer>`` span (any text, as
    d1's) scores it instead of 0 (counted as parsed, not malformed)."""
    if self.reward == "d1":
      return verifiers.d1_countdown_result(completion, *self._args(example), self.format_score)
    result = super().verify(example, completion)
    span = verifiers.closed_answer_span(completion) if self.format_score else None
    if result.correct or span is None:
      return result
    return VerifyResult(self.format_score, False, span if result.parsed is None else result.parsed,
                        {**result.info, "format_score": self.format_score})

  def _d1_reward(self, example, completion, correct):
    """d1's ``compute_score`` (:func:`dllm_rl.tasks.verifiers.d1_countdown_result`)."""
    return verifiers.d1_countdown_result(completion, *self._args(example),
                                         self.format_score).reward

  @classmethod
  def _fields(cls, record):
    nums = record_field(record, "nums", list)
    if len(nums) < 2 or any(isinstance(x, bool) or not isinstance(x, int) or not
                            0 <= x < 10**9 for x in nums):
      raise BadRecord(f"field 'nums' must be >= 2 integers in [0, 10**9), got {nums!r}")
    target = record_field(record, "target", int)
    solution = ""
    if record.get("solution") is not None:  # optional: a null one is none
      solution = record_field(record, "solution", str).strip()
      check = verifiers.countdown_reward(solution, nums, target)
      if not check.correct:
        raise BadRecord(f"field 'solution' {solution!r} is wrong: {check.info['reason']}")
    fields = {"numbers": ", ".join(map(str, nums)), "nums": str(list(nums)), "target": target}
    return fields, solution, {"numbers": list(nums), "target": target}

  def _check_target(self, answer, meta):
    """``reward="d1"``: the solution must be correct by d1's ``compute_score`` too, which reads
    a trailing ``= value`` as one number too many (the lenient check of ``_fields`` drops it):
    else SFT would teach what the RL reward scores wrong."""
    if self.reward != "d1":
      return
    # the span d1 reads: answer_tag puts the solution in one (without it, the reward scores the
    # bare target 0 whatever it holds: a matter of the options, not of this line)
    check = verifiers.d1_countdown_result(f"<answer>{answer}</answer>", meta["numbers"],
                                          meta["target"])
    if not check.correct:
      raise BadRecord(f"field 'solution' {answer!r} is scored wrong by reward='d1' (d1's"
                      f" compute_score, the format score only): {check.info['reason']}; write"
                      " it as d1 reads it (binary + - * / and parentheses, no '= value'), or"
                      " give the task reward='verifier'")

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
    puzzle = record_field(record, "puzzle", str).strip()
    solution = record_field(record, "solution", str).strip()
    if len(puzzle) != 16 or any(ch not in "01234" for ch in puzzle):
      raise BadRecord(f"field 'puzzle' must be 16 digits 0-4, got {puzzle!r}")
    if len(solution) != 16 or any(ch not in "1234" for ch in solution):
      raise BadRecord(f"field 'solution' must be 16 digits 1-4, got {solution!r}")
    if not is_valid_solution([int(ch) for ch in solution]) or any(
        p not in ("0", s) for p, s in zip(puzzle, solution)):
      raise BadRecord("field 'solution' is not a valid grid that keeps the puzzle's givens")
    return {"puzzle": puzzle}, solution, {"puzzle": puzzle, "solution": solution}

  def _key(self, fields):
    return fields["puzzle"]

  def _checker(self):
    return verifiers.sudoku_result

  def _args(self, example):
    return (example.meta["puzzle"], example.meta["solution"], self.reward)
