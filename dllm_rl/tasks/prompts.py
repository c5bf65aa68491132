"""Prompt presets of the file-backed tasks, and the system prompt of a run.

A preset (``task.options.prompt_preset``) gives each JSONL task its prompt text (a format string
over the task's fields, like ``task.options.prompt_template``) and says whether the reward reads
only the answer span of a completion:

* ``d1``: the training prompts of d1 (dllm-reasoning/d1 @837888f, ``diffu-grpo/data_utils.py``),
  which SPG (facebookresearch/SPG, ``spg/data_utils.py``) uses unchanged: the instruction to
  answer as ``<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>`` put before the
  question in the user turn (no system turn), per task as d1 words it. The reward reads the last
  ``<answer>`` span (to the end when unclosed, as d1's ``extract_xml_answer``; Countdown and
  Sudoku: the last closed ``<answer>...</answer>``, an unclosed one scoring 0, as d1's
  ``extract_solution`` / ``extract_answer_sudoku``); a completion without ``<answer>`` scores
  0. The span is then graded by the task's verifier (GSM8K: the number, where d1 compares the
  stripped text exactly; Countdown / Sudoku: as d1). MATH, as d1's
  ``correctness_reward_func_math``: math-verify on the last ``\\boxed{}`` anywhere in the
  completion (d1: its ``is_equiv``), 0 without one; no ``<answer>`` span is read.

The system prompt (``data.system_prompt``) is a property of how a prompt is shown to the model,
not of the task: with a chat template it is the template's system turn, otherwise it is put
before the prompt with a blank line (:func:`chat_prompt`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class Preset:
  """``templates``: task name → prompt template; ``answer_tag``: the tasks whose reward reads
  only the ``<answer>`` span; ``boxed``: those whose reward needs a ``\\boxed{}`` answer (0
  without one)."""

  templates: Mapping[str, str]
  answer_tag: frozenset[str]
  boxed: frozenset[str] = frozenset()
  rewards: Mapping[str, str] = dataclasses.field(default_factory=dict)  # task → its default
  format_scores: Mapping[str, float] = dataclasses.field(default_factory=dict)  # wrong, tagged
  math_verify: frozenset[str] = frozenset()  # graded by math-verify on the whole completion


# d1's SYSTEM_PROMPT and SUDOKU_SYSTEM_PROMPT (the text, newlines included).
D1_FORMAT = ("\nRespond in the following format:\n<reasoning>\n...\n</reasoning>\n"
             "<answer>\n...\n</answer>\n")
D1_SUDOKU = (
    "\nPlease solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character "
    "string reading left-to-right, top-to-bottom, where '0' represents empty cells.\n\n"
    "Rules:\n- Fill empty cells with digits 1-4\n- Each row must contain digits 1-4 exactly "
    "once\n- Each column must contain digits 1-4 exactly once\n- Each 2x2 box must contain "
    "digits 1-4 exactly once\n\nImportant: Your solution must be a COMPLETE 16-character string "
    "with only the digits 1-4, representing your final solved grid.\n\nRespond in this exact "
    "format:\n<reasoning>\nYour step-by-step solving process\n</reasoning>\n<answer>\n"
    "[16-character solution string with no spaces or separators]\n</answer>\n")

# StableDRL's instruction after each math problem (JianyuanZhong/StableDRL @26ad014,
# dataloaders/math.py collate_fn_mixed, which configs/gsm8k_math_spg_snis.yaml and
# math_spg_snis.yaml load): appended with no separator; its raw string doubles the
# backslashes, so the prompt reads "\\boxed{}" as run (a format string here: {{}} is {}).
STABLEDRL_BOXED = (r"(Please put the final answer in \\boxed{{}} tag,"
                   r" i.e. $\\boxed{{answer here}}$)")

PROMPT_PRESETS: dict[str, Preset] = {
    # d1's MATH reward (correctness_reward_func_math, reward_func.py line 242) reads the last
    # \boxed{} anywhere in the completion, not the <answer> span its other tasks read
    # d1's Sudoku reward (sudoku_reward_func) is the share of blank cells filled right; its
    # GSM8K and MATH rewards add format terms (diffu_grpo_train.py: reward_functions); its
    # Countdown reward is compute_score (1 / format_score / 0), its eval on the span's equation
    "d1": Preset(answer_tag=frozenset({"gsm8k", "countdown_jsonl", "sudoku_jsonl"}),
                 boxed=frozenset({"math500"}),
                 rewards={"sudoku_jsonl": "cell_accuracy", "gsm8k": "d1", "math500": "d1",
                          "countdown_jsonl": "d1"},
                 format_scores={"countdown_jsonl": 0.1},  # compute_score's format_score
                 templates={
        "gsm8k": D1_FORMAT + "\n\n{question}",
        "math500": D1_FORMAT + "\n\nYou are a math expert. You will be given a question to "
                   "solve. Solve it step by step. Wrap the final answer in a \\boxed{{}}. "
                   "\n\n{question}",
        "countdown_jsonl": D1_FORMAT + "\nUsing only the numbers {nums}, create an arithmetic "
                           "expression that evaluates to exactly {target}. You must use all "
                           "numbers from the list, and each number must be used exactly once. "
                           "You may use the operations +, -, *, and / as needed. After "
                           "reasoning, provide only your final expression inside "
                           "<answer></answer> tags without including an equals sign or the "
                           "target number. For example, if the numbers are [2, 3, 4] and the "
                           "target is 5, a valid answer is: <answer>\n2*4-3\n</answer>",
        "sudoku_jsonl": D1_SUDOKU + "\n\nSolve the following Sudoku puzzle: {puzzle}\n",
    }),
    # StableDRL's reward (reward_mixed / _math_verify_equal): math-verify of the GSM8K number or
    # MATH answer against the whole completion; its ±1 values are the task option
    # wrong_reward=-1 with rl.malformed_reward=-1 (configs/llada_tpu.py sets both)
    "stabledrl": Preset(answer_tag=frozenset(), math_verify=frozenset({"gsm8k"}), templates={
        "gsm8k": "{question}" + STABLEDRL_BOXED,
        "math500": "{question}" + STABLEDRL_BOXED,
    }),
}


def preset(name: str, task: str) -> Preset:
  """The preset ``name``; ValueError naming the choices, or when it has no prompt for ``task``."""
  if name not in PROMPT_PRESETS:
    raise ValueError(f"prompt_preset must be one of {sorted(PROMPT_PRESETS)}, got {name!r}")
  found = PROMPT_PRESETS[name]
  if task not in found.templates:
    raise ValueError(f"prompt_preset {name!r} has no prompt for task {task!r} (it has: "
                     f"{sorted(found.templates)})")
  return found


def chat_prompt(text: str, tokenizer: Any, system_prompt: str = "") -> str:
  """``text`` as the model sees it: the tokenizer's chat template (a system turn first when
  ``system_prompt``), or without one ``system_prompt``, a blank line, then ``text``."""
  format_prompt = getattr(tokenizer, "format_prompt", None)
  if format_prompt is not None:
    return format_prompt(text, system=system_prompt)
  return f"{system_prompt}\n\n{text}" if system_prompt else text
