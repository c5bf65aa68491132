"""Property tests (hypothesis) on arbitrary text: the expression parser, the JSONL loaders and
the answer extractors never raise anything but their documented error, never run code, and
stay within a time bound (issue 11, item 8)."""

from __future__ import annotations

import importlib
import json
import sys
import time
import types

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dllm_rl.tasks import verifiers
from dllm_rl.tasks.base import VerifyResult
from dllm_rl.tasks.jsonl import (CountdownJsonlTask, GSM8KTask, Math500Task,
                                 SudokuJsonlTask)
from dllm_rl.tasks.safe_arith import ParseError, parse_expression
from dllm_rl.tasks.timed_verifier import TimedVerifier

# Deterministic in CI (no example database, fixed seed); time is bounded by hand below.
PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=200,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])
# Per call, in CPU time of the calling thread (time.thread_time): the real cost is micro- to
# milliseconds; a super-linear blow-up costs CPU time whatever the load, while wall-clock time
# also counts a loaded box's waits for a CPU (33 times the CPU time with 32 busy processes).
BOUND_S = 1.0

ARITH = st.text(alphabet="0123456789+-*/() ", max_size=240)
CODE = st.sampled_from([
    "__import__('os').system('touch PWNED')", "exec('1')", "eval('2+2')", "1+1;import os",
    "(" * 500 + "1" + ")" * 500, "9" * 5000, "2**10**10", "1/0", "lambda: 0",
    "\\boxed{" * 300, "<answer>" * 200, "#### " + "9" * 200, "1,000,000,0000" * 50,
    "\\frac{1}{0}", "\x00\ud7ff\U0010ffff", "1" + "0" * 70 + "/3"])
ANY_TEXT = st.one_of(st.text(max_size=400), ARITH, CODE,
                     st.lists(st.sampled_from(["\\boxed{", "}", "{", "####", "<answer>",
                                               "</answer>", "12", ",", ".5", "-", "/7", " ",
                                               "\\frac{3}{4}", "$", "\\{", "\u2212", "\u2013",
                                               "\u202f", "\u00a0", "000", "..."]),
                              max_size=80).map("".join))


# The modules whose code the tests below run: each has eval / exec / compile / __import__
# shadowed (test_the_guard_covers_every_task_module_the_tests_run keeps the list whole).
GUARDED = ("base", "countdown", "jsonl", "jsonl_base", "jsonl_lines", "prompts", "safe_arith",
           "sudoku", "timed_verifier", "verifiers")


@pytest.fixture
def no_code_execution(monkeypatch):
  """eval / exec / compile / __import__ raise if the task modules call them (module globals
  shadow the builtins for the code of that module)."""
  def forbidden(*args, **kwargs):
    raise AssertionError("code execution attempted")
  for module in (importlib.import_module(f"dllm_rl.tasks.{name}") for name in GUARDED):
    for name in ("eval", "exec", "compile", "__import__"):
      monkeypatch.setattr(module, name, forbidden, raising=False)


def test_the_guard_covers_every_task_module_the_tests_run():
  """The JSONL tasks' loading and grading moved out of ``jsonl`` (to ``jsonl_base`` and
  ``jsonl_lines``), and the guard, which named ``jsonl``, no longer covered them: every
  ``dllm_rl.tasks`` module that the tested tasks' modules reach (through their globals) is
  guarded."""
  from dllm_rl.tasks import countdown, jsonl
  seen, todo = set(), [jsonl, countdown, verifiers]
  while todo:
    module = todo.pop()
    seen.add(module.__name__)
    for value in vars(module).values():
      found = (value if isinstance(value, types.ModuleType)
               else sys.modules.get(getattr(value, "__module__", None) or ""))
      if (found is not None and found.__name__.startswith("dllm_rl.tasks.")
          and found.__name__ not in seen):
        todo.append(found)
  assert {"dllm_rl.tasks.jsonl_base", "dllm_rl.tasks.jsonl_lines"} <= seen, seen
  assert sorted(name.split(".")[-1] for name in seen) == sorted(GUARDED)


def _timed(fn, *args):
  t0 = time.thread_time()
  out = fn(*args)
  assert time.thread_time() - t0 < BOUND_S, f"{fn.__name__} took too long on {args!r:.80}"
  return out


@PROPERTY
@given(text=st.one_of(ARITH, ANY_TEXT))
def test_parser_returns_or_raises_parse_error_only(text, no_code_execution):
  t0 = time.thread_time()
  try:
    parsed = parse_expression(text)
  except ParseError:
    parsed = None
  assert time.thread_time() - t0 < BOUND_S
  if parsed is not None:
    assert all(0 <= x < 10**9 for x in parsed.literals)
    assert parse_expression(parsed.canonical) == parsed  # same value, literals; a fixed point


@PROPERTY
@given(text=ANY_TEXT, reference=st.sampled_from(["#### 42", "7", "1/2", "#### 1,234"]),
       numbers=st.lists(st.integers(0, 1000), min_size=2, max_size=4),
       target=st.integers(-1000, 1000))
def test_answer_extractors_never_raise(text, reference, numbers, target, no_code_execution):
  answer = _timed(verifiers.gsm8k_answer, text)
  assert answer is None or isinstance(answer, str)
  boxed = _timed(verifiers.last_boxed, text)
  assert boxed is None or boxed in text
  assert _timed(verifiers.answer_span, text) in text
  for result in (_timed(verifiers.gsm8k_result, text, reference),
                 _timed(verifiers.countdown_reward, text, numbers, target),
                 _timed(verifiers.sudoku_result, text, "1200003000040000",
                        "1234341221434321")):
    assert isinstance(result, VerifyResult) and 0.0 <= result.reward <= 1.0


@pytest.fixture(scope="module")
def math_checker():
  with TimedVerifier(verifiers.math_result, 3.0, preload=("math_verify",)) as check:
    yield check


@settings(derandomize=True, database=None, deadline=None, max_examples=25,
          suppress_health_check=[HealthCheck.too_slow])
@given(text=ANY_TEXT)
def test_math_answers_are_bounded_by_the_hard_timeout(text, math_checker):
  math_checker.start()._worker.wait_ready(120.0)  # a restart's start-up is not on the clock
  t0 = time.perf_counter()
  result = math_checker(text, "\\frac{1}{2}")
  assert isinstance(result, VerifyResult) and 0.0 <= result.reward <= 1.0
  assert time.perf_counter() - t0 < 30.0  # the 3 s limit and a kill, on a loaded CI box


JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
              st.text(max_size=40), ANY_TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
FIELDS = ["question", "answer", "problem", "solution", "nums", "target", "puzzle"]
RECORD = st.dictionaries(st.sampled_from(FIELDS), JSON_VALUE, max_size=6)
LINE = st.one_of(RECORD.map(json.dumps), JSON_VALUE.map(json.dumps), st.text(max_size=200)
                 .map(lambda t: t.replace("\n", " ").replace("\r", " ")))
TASKS = [GSM8KTask, Math500Task, CountdownJsonlTask, SudokuJsonlTask]


@settings(PROPERTY, max_examples=80)
@given(lines=st.lists(LINE, max_size=12), task=st.sampled_from(TASKS))
def test_jsonl_loaders_skip_or_name_the_bad_line(lines, task, tmp_path_factory,
                                                 no_code_execution):
  path = tmp_path_factory.mktemp("jsonl") / "data.jsonl"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  t0 = time.thread_time()
  loaded = task(train_file=str(path), on_error="skip", verify_timeout=0)
  assert time.thread_time() - t0 < BOUND_S * (1 + len(lines))
  assert loaded.skipped + len(loaded._records[str(path)]) <= len(lines)
  try:
    task(train_file=str(path), on_error="raise", verify_timeout=0)
  except ValueError as err:
    assert loaded.skipped > 0  # the same line was skipped in "skip" mode
    assert f"{path}:" in str(err)  # names the file and line
  else:
    assert loaded.skipped == 0


def test_code_in_a_countdown_answer_is_never_run(tmp_path, monkeypatch, no_code_execution):
  monkeypatch.chdir(tmp_path)
  result = verifiers.countdown_reward("<answer>__import__('os').system('touch PWNED')</answer>",
                                      [1, 2], 3)
  assert result.reward == 0.0 and not (tmp_path / "PWNED").exists()
