"""Built-in verifiable tasks (host-side, numpy only).

Importing this package registers every built-in task in ``TASKS``.
"""

from dllm_rl.tasks import (  # noqa: F401  (registration)
    arithmetic, chain, code, countdown, jsonl, sudoku, sum_split)
from dllm_rl.tasks.base import (TASKS, Example, Task, VerifyResult, check_options,
                                contract_problem, make_task)
from dllm_rl.tasks.tokenizer import CharTokenizer

__all__ = ["TASKS", "make_task", "check_options", "contract_problem", "Example", "VerifyResult",
           "Task", "CharTokenizer"]
