"""Built-in verifiable tasks (host-side, numpy only).

Importing this package registers every built-in task in ``TASKS``.
"""

from dllm_rl.tasks import arithmetic, chain, countdown, jsonl, sudoku  # noqa: F401  (registration)
from dllm_rl.tasks.base import TASKS, Example, Task, VerifyResult, check_options, make_task
from dllm_rl.tasks.tokenizer import CharTokenizer

__all__ = ["TASKS", "make_task", "check_options", "Example", "VerifyResult", "Task", "CharTokenizer"]
