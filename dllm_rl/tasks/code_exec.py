"""Code rewards as DiffuCoder computes them (apple/ml-diffucoder ``src/open_r1/rewards.py``):
a format score and the pass rate of test cases run against the completion's code.

* :func:`format_score` (``code_format_reward``): the completion is prose without a fence, one
  ```` ```python ```` block, and nothing after its closing fence but a newline: 1.0 when the
  block parses as Python, 0.5 when it does not (nested too deeply for the parser included),
  0.0 for any other shape.
* :func:`pass_rate` (``code_reward``'s evaluation script): each test case (an ``assert`` line,
  or a test body) runs as ``python -c "{code}\\n{case}"`` in its own process with a 5 s limit;
  a case passes iff that process exits 0, and a case that runs out of time makes the rate 0
  (the official script does not catch ``TimeoutExpired``: it dies before printing its rate,
  which the provider scores None or 0.0). Only a completion whose format score is 1.0 is run.

The code is the model's: it runs in a child process with a wall-clock limit, CPU-time,
address-space, file-size and core-dump limits, an empty working directory that is removed
afterwards, an environment without the parent's variables, and Python's isolated mode (``-I``:
no user site-packages, no PYTHON* variables, the script's folder not on the path). That bounds
what a runaway program costs; it is not a sandbox: the child can read files and reach the
network as the user can. Train on untrusted data in a container or VM (DiffuCoder runs its
script in an E2B sandbox).
"""

from __future__ import annotations

import ast
import concurrent.futures
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Sequence

CASE_TIMEOUT_S = 5.0  # DiffuCoder's exec_timeout
MAX_MEMORY_MB = 1024
MAX_FILE_MB = 16
MAX_CODE_CHARS = 65_536

# DiffuCoder's pattern, for ``language="python"``: no fence before the block, one block, and the
# string ends right after its closing fence and a newline.
_FORMAT_RE = re.compile(r"^(?:(?!```)[\s\S])*?```python\n(?:(?!```)[\s\S])*?```\n$", re.DOTALL)
_BLOCK_RE = re.compile(r"```python\n(.*?)```", re.DOTALL)
# Chat-template markers a decoded completion may end with (``<|im_end|>``, ``<|eot_id|>``): the
# official decode skips special tokens, so they are not part of the text it checks.
_END_MARKERS_RE = re.compile(r"(?:<\|[A-Za-z_]+\|>)+\Z")


def strip_end_markers(text: str) -> str:
  """``text`` without the special-token markers it ends with."""
  return _END_MARKERS_RE.sub("", text)


def extract_code(text: str) -> str | None:
  """The body of the first ```` ```python ```` block (``extract_code``); None without one."""
  match = _BLOCK_RE.search(text)
  return None if match is None else match.group(1)


def format_score(text: str) -> float:
  """DiffuCoder's ``code_format_reward``: 1.0 (the format, and the block parses), 0.5 (the
  format, a syntax error), 0.0 (not the format)."""
  if len(text) > MAX_CODE_CHARS or _FORMAT_RE.fullmatch(text) is None:
    return 0.0
  try:
    ast.parse(extract_code(text).strip())
  # ValueError: a null byte; RecursionError / MemoryError: nested too deeply for CPython's
  # parser (3,000 unary minuses), which could not run it either
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return 0.5
  return 1.0


# The child's first statements: its limits (set in the child itself, not by a preexec_fn, which
# is unsafe beside the trainer's threads), then the source, run as ``python -c`` runs it. The
# source comes from a file beside the working folder, not from argv: Linux caps one argument at
# 128 KiB (a larger test case was an OSError out of the verifier).
_PRELUDE = """import resource as _r, sys as _s
_cpu, _mem, _fsize = (int(x) for x in _s.argv[1:4])
_r.setrlimit(_r.RLIMIT_CPU, (_cpu, _cpu))
_r.setrlimit(_r.RLIMIT_AS, (_mem, _mem))
_r.setrlimit(_r.RLIMIT_FSIZE, (_fsize, _fsize))
_r.setrlimit(_r.RLIMIT_CORE, (0, 0))
with open(_s.argv[4], encoding="utf-8", errors="surrogatepass") as _f:
    _src = _f.read()
del _f
_s.argv = ["-c"]
exec(compile(_src, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""


PASS, FAIL, TIMEOUT = "pass", "fail", "timeout"  # case_outcome


def run_case(code: str, case: str, *, timeout_s: float = CASE_TIMEOUT_S,
             memory_mb: int = MAX_MEMORY_MB) -> bool:
  """Whether ``python -c "{code}\n{case}"`` exits 0 within ``timeout_s`` (:func:`case_outcome`
  is PASS)."""
  return case_outcome(code, case, timeout_s=timeout_s, memory_mb=memory_mb) == PASS


SPAWN_TRIES = 3


def _spawn(argv, cwd: str, env: dict) -> subprocess.Popen | None:
  """The case's process, or None when the system would not start one after
  :data:`SPAWN_TRIES` tries (no process slots or memory left, as when another completion's
  program fork-bombs): that case fails, with a warning, rather than the whole run."""
  for attempt in range(SPAWN_TRIES):
    try:
      return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    except OSError as err:
      if attempt == SPAWN_TRIES - 1:
        logging.warning("code task: could not start a test case (%s): counted as failed", err)
        return None
      time.sleep(0.2 * (attempt + 1))
  return None


def case_outcome(code: str, case: str, *, timeout_s: float = CASE_TIMEOUT_S,
                 memory_mb: int = MAX_MEMORY_MB) -> str:
  """PASS when ``python -c "{code}\n{case}"`` exits 0 within ``timeout_s`` (wall clock),
  TIMEOUT when it runs out of time, FAIL otherwise; run isolated (``-I``) under the module's
  limits, in its own session: what it started in that session is killed with it when it
  ends or times out (not left running)."""
  with tempfile.TemporaryDirectory(prefix="dllm_rl_code_") as root:
    cwd, source = os.path.join(root, "cwd"), os.path.join(root, "source.py")
    os.mkdir(cwd)
    with open(source, "w", encoding="utf-8", errors="surrogatepass") as f:
      f.write(f"{code}\n{case}")
    env = {"PATH": os.defpath, "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8",
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    limits = (int(timeout_s) + 1, memory_mb << 20, MAX_FILE_MB << 20)
    proc = _spawn([sys.executable, "-I", "-c", _PRELUDE, *map(str, limits), source], cwd, env)
    if proc is None:
      return FAIL
    try:
      return PASS if proc.wait(timeout=timeout_s) == 0 else FAIL
    except subprocess.TimeoutExpired:
      return TIMEOUT
    finally:  # its session's other processes, whether it exited or timed out
      try:
        os.killpg(proc.pid, 9)
      except ProcessLookupError:
        pass
      proc.wait()


def pass_rate(code: str, cases: Sequence[str], *, timeout_s: float = CASE_TIMEOUT_S,
              workers: int | None = None) -> float:
  """The fraction of ``cases`` that pass (:func:`case_outcome`), run ``workers`` at a time
  (default: the CPU count); 0.0 for no cases, and 0.0 when a case times out (module
  docstring; one at a time, the cases after it are not run, as officially)."""
  if not cases:
    return 0.0
  workers = workers or os.cpu_count() or 1
  run = lambda case: case_outcome(code, case, timeout_s=timeout_s)
  if workers == 1:
    outcomes = []
    for case in cases:
      outcomes.append(run(case))
      if outcomes[-1] == TIMEOUT:
        return 0.0
  else:
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(cases))) as pool:
      outcomes = list(pool.map(run, cases))
    if TIMEOUT in outcomes:
      return 0.0
  return outcomes.count(PASS) / len(cases)
