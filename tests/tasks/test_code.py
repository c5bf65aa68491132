"""The ``code`` task: DiffuCoder's format score and execution reward (apple/ml-diffucoder
``src/open_r1/rewards.py``), the limits the completion's code runs under, and the JSONL
records ``dllm-rl-data prepare acecode | humaneval | mbpp`` writes."""

import json
import os
import subprocess
import sys
import time

import pytest

from dllm_rl.tasks import code_exec, make_task
from dllm_rl.tasks.code import code_result, fenced, normal_form

ADD = "def add(a, b):\n    return a + b\n"
CASES = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 5"]


@pytest.mark.parametrize("text, score", [
    (f"Here it is:\n```python\n{ADD}```\n", 1.0),
    (f"```python\n{ADD}```\n", 1.0),  # no prose
    ("```python\ndef add(a, b:\n```\n", 0.5),  # the format, a syntax error
    (f"```python\n{ADD}```", 0.0),  # DiffuCoder's pattern ends with a newline
    (f"```python\n{ADD}```\nThat adds.", 0.0),  # text after the block
    (f"```\nx\n```\n```python\n{ADD}```\n", 0.0),  # a fence before the block
    (f"```python\n{ADD}```\n```python\nx = 1\n```\n", 0.0),  # two blocks
    (f"```py\n{ADD}```\n", 0.0),
    ("no code", 0.0),
])
def test_format_score_is_diffucoders(text, score):
  assert code_exec.format_score(text) == score


def test_trailing_special_token_markers_are_not_part_of_the_text():
  text = f"```python\n{ADD}```\n<|im_end|>"
  assert code_exec.format_score(text) == 0.0
  assert code_exec.format_score(code_exec.strip_end_markers(text)) == 1.0
  assert code_exec.strip_end_markers("a <|im_end|> b") == "a <|im_end|> b"  # only at the end


def test_each_case_runs_in_its_own_process_and_passes_iff_it_exits_0():
  assert code_exec.pass_rate(ADD, CASES) == pytest.approx(2 / 3)
  assert code_exec.pass_rate(ADD, []) == 0.0
  assert code_exec.pass_rate("import sys\nsys.exit(0)", ["assert False"]) == 1.0  # as official
  state = "import builtins\nbuiltins.N = getattr(builtins, 'N', 0) + 1\n"
  assert code_exec.pass_rate(state, ["assert N == 1"] * 3) == 1.0  # nothing carries over


def test_the_code_runs_under_limits_in_an_empty_folder_without_the_parents_environment(
    tmp_path, monkeypatch):
  assert not code_exec.run_case("while True:\n    pass", "", timeout_s=0.5)  # wall clock
  assert not code_exec.run_case("x = bytearray(1 << 31)", "")  # address space (1 GiB)
  assert not code_exec.run_case("open('f', 'wb').write(b'0' * (32 << 20))", "")  # 16 MiB files
  monkeypatch.setenv("DLLM_RL_SECRET", "x")
  assert code_exec.run_case("import os", "assert 'DLLM_RL_SECRET' not in os.environ")
  probe = tmp_path / "cwd.txt"
  assert code_exec.run_case(f"import os\nopen({str(probe)!r}, 'w').write(os.getcwd())",
                            "assert os.listdir('.') == []")
  assert not os.path.exists(probe.read_text())  # its folder is removed afterwards
  # a grandchild that outlives the timeout is killed with it (its own session)
  marker = tmp_path / "late.txt"
  assert not code_exec.run_case(_spawner(marker, "import time\ntime.sleep(30)"), "",
                                timeout_s=0.5)
  time.sleep(2.0)
  assert not marker.exists()


def _spawner(marker, then: str = "") -> str:
  """A program that starts a child writing ``marker`` after 1 s, then runs ``then``."""
  child = f"import time; time.sleep(1.0); open({str(marker)!r}, 'w').write('x')"
  return f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {child!r}])\n{then}"


def test_the_spawner_writes_its_marker_when_nothing_kills_its_child(tmp_path):
  """The control of the tests above and below: run as a plain program, the child lives."""
  marker = tmp_path / "late.txt"
  subprocess.run([sys.executable, "-c", _spawner(marker)], check=True)
  time.sleep(2.0)
  assert marker.read_text() == "x"


def test_the_reward_is_two_times_the_pass_rate_plus_half_the_format():
  good = code_result(f"Sure.\n```python\n{ADD}```\n<|im_end|>", CASES, 2.0, 0.5, 5.0)
  assert good.reward == pytest.approx(2.0 * 2 / 3 + 0.5) and not good.correct
  assert good.parsed == ADD.rstrip() and good.info["pass_rate"] == pytest.approx(2 / 3)
  solved = code_result(f"```python\n{ADD}```\n", CASES[:2], 2.0, 0.5, 5.0)
  assert solved.reward == 2.5 and solved.correct
  broken = code_result("```python\ndef add(a, b:\n```\n", CASES, 2.0, 0.5, 5.0)
  assert (broken.reward, broken.correct) == (0.25, False)  # not run: 0.5 × format only
  assert broken.info["reason"] == "the block does not parse"
  late = code_result(f"```python\n{ADD}```\nDone.", CASES[:2], 2.0, 0.5, 5.0)
  assert late.reward == 0.0 and late.parsed == ADD.rstrip()  # the format fails: not run
  assert code_result("no block", CASES, 2.0, 0.5, 5.0).parsed is None  # malformed


def test_programs_differing_only_in_comments_and_spacing_are_one_answer():
  """distinct_correct and diversity count distinct parsed answers: the code's ast.unparse
  normal form, so comments, blank lines and spacing alone are not a new program; a block that
  does not parse keeps its text (not malformed, as before)."""
  variants = [ADD, "# adds\ndef add(a,b):\n\n    return a+b  # the sum\n",
              "def add( a, b ):\n  return (a + b)\n",
              "def add(b, a):\n    return b + a\n"]  # another program (names)
  results = [code_result(f"```python\n{v}```\n", CASES[:1], 2.0, 0.5, 5.0) for v in variants]
  assert all(r.correct for r in results)
  assert [r.parsed for r in results[:3]] == ["def add(a, b):\n    return a + b"] * 3
  assert len({r.parsed for r in results}) == 2
  broken = "def add(a, b:\n  # unfinished\n"
  r = code_result(f"```python\n{broken}```\n", CASES, 2.0, 0.5, 5.0)
  assert (r.parsed, r.reward) == (broken, 0.25)  # as before: its text, a format score of 0.5


DEEP_FOR_UNPARSE = "x = " + "a + " * 400 + "a\n"  # parses; too deep for ast.unparse


@pytest.mark.parametrize("code", [
    DEEP_FOR_UNPARSE,  # RecursionError
    "x = " + "(" * 5000 + "1" + ")" * 5000,  # too many nested parentheses (SyntaxError)
    "x = " + "not " * 3000 + "x",  # too deep for the parser (MemoryError)
    "x = " + "a + " * 3000 + "a",  # too deep for the parser (RecursionError)
    "x = 1\0  # a null byte",  # ValueError
    "  indented = 1\n",  # does not parse as it would run
    "x  =  1\n" * 10_000,  # over code_exec.MAX_CODE_CHARS: not parsed
])
def test_code_too_deep_long_or_broken_to_normalise_is_kept_as_written(code):
  assert normal_form(code) == code


@pytest.mark.parametrize("code", ["x = " + "-" * 3000 + "1", "x = " + "a + " * 3000 + "a",
                                  "x = " + "not " * 3000 + "x"])
def test_a_block_too_deep_for_the_parser_scores_as_one_that_does_not_parse(code):
  """ast.parse raises RecursionError or MemoryError on these (3 KB of unary minuses): that
  was raised out of the verifier, ending the run; CPython cannot run them either."""
  text = f"```python\n{code}\n```\n"
  assert code_exec.format_score(text) == 0.5
  r = code_result(text, CASES, 2.0, 0.5, 5.0)
  assert (r.reward, r.parsed, r.info["reason"]) == (0.25, f"{code}\n", "the block does not parse")


def test_a_block_too_deep_to_unparse_is_scored_and_kept_as_written():
  r = code_result(f"```python\n{DEEP_FOR_UNPARSE}```\n", CASES[:1], 2.0, 0.5, 5.0)
  assert (r.reward, r.parsed) == (0.5, DEEP_FOR_UNPARSE)  # the format; NameError in the case


def test_the_normal_form_drops_comments_and_spacing_only():
  code = "import os  # unused\n\n\nx = {'a': [1,2]}\nif x :\n        y = \"s\"\n"
  assert normal_form(code) == "import os\nx = {'a': [1, 2]}\nif x:\n    y = 's'"
  assert normal_form(normal_form(code)) == normal_form(code)


def _write(path, records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return str(path)


def test_the_task_reads_problems_and_scores_its_own_reference(tmp_path):
  records = [{"question": f"Write add{i}(a, b).", "test_cases": [f"assert add{i}(1, 2) == 3"],
              "solution": f"def add{i}(a, b):\n    return a + b"} for i in range(4)]
  task = make_task("code", train_file=_write(tmp_path / "train.jsonl", records),
                   test_file=_write(tmp_path / "test.jsonl", records[:2]),
                   exec_weight=1.0, format_weight=0.0)
  ex = task.generate("test", -1, seed=0)[0]
  assert ex.answer == fenced(records[int(ex.prompt[9])]["solution"])
  assert ex.answer.startswith("```python\ndef add") and ex.answer.endswith("```\n")
  result = task.verify(ex, ex.answer)
  assert result.correct and result.reward == 1.0  # the weights are options
  assert not task.verify(ex, "```python\ndef add0(a, b):\n    return 0\n```\n").correct


@pytest.mark.parametrize("record, problem", [
    ({"question": "q"}, "missing field 'test_cases'"),
    ({"question": "q", "test_cases": []}, "1 to 1000 cases"),
    ({"question": "q", "test_cases": ["assert 1", ""]}, "non-empty strings"),
    ({"question": "q", "test_cases": "assert 1"}, "must be list"),
])
def test_bad_records_are_named_by_line(tmp_path, record, problem):
  path = _write(tmp_path / "t.jsonl", [{"question": "ok", "test_cases": ["assert 1"]}, record])
  with pytest.raises(ValueError, match=f"t.jsonl:2: .*{problem}"):
    make_task("code", test_file=path)


@pytest.mark.parametrize("options, message", [
    ({"exec_weight": -1.0}, "exec_weight must be a number >= 0"),
    ({"format_weight": "x"}, "format_weight must be a number >= 0"),
    ({"case_timeout": 0}, r"case_timeout must be seconds in \(0, 3600\)"),
])
def test_bad_options_are_named(tmp_path, options, message):
  path = _write(tmp_path / "t.jsonl", [{"question": "ok", "test_cases": ["assert 1"]}])
  with pytest.raises(ValueError, match=message):
    make_task("code", test_file=path, **options)


def test_a_verify_timeout_shorter_than_the_cases_may_run_is_named(tmp_path):
  """verify_timeout bounds the whole verification: at 3 s, a completion passing two cases of
  2 s each (each within case_timeout) scored 0 ("timeout"), with no word said."""
  slow = "import time; time.sleep(2); assert f(1) == 1"
  path = _write(tmp_path / "t.jsonl", [{"question": "q", "test_cases": ["assert 1"]},
                                      {"question": "q", "test_cases": [slow, slow]}])
  with pytest.raises(ValueError, match=r"verify_timeout=3 s is shorter than the cases of"
                     r" .*t\.jsonl:2 may run \(2 × case_timeout 5 s.* set it >= 11$"):
    make_task("code", test_file=path, verify_timeout=3.0)
  make_task("code", test_file=path, verify_timeout=11.0).close()


def test_the_trainer_verifies_code_completions_at_once_with_the_same_results(tmp_path):
  """``verify_groups`` runs a ``parallel_verify`` task's completions on threads: each
  completion's result is the one verifying it alone gives, in its place, and (with 2+ CPUs)
  two runs overlap in time."""
  import numpy as np
  from dllm_rl.train import evaluation
  log = tmp_path / "spans"
  log.mkdir()
  case = ("import os, time\nt0 = time.time()\ntime.sleep(0.5)\n"
          f"open(os.path.join({str(log)!r}, str(os.getpid())), 'w')"
          ".write(f'{t0} {time.time()}')"
          "\nassert f() == {i}")
  records = [{"question": f"q{i}", "test_cases": [case.replace("{i}", str(i))]} for i in range(2)]
  task = make_task("code", test_file=_write(tmp_path / "t.jsonl", records))
  examples = sorted(task.generate("test", -1, seed=0), key=lambda e: e.prompt)

  class Texts:  # "decodes" a completion row [i, j] to a program whose f() returns i·j
    def decode(self, ids):
      return f"```python\ndef f():\n    return {int(ids[0]) * int(ids[1])}\n```\n"

  completions = np.array([[[i, j] for j in range(2)] for i in range(2)])
  graded = evaluation.verify_groups(task, Texts(), examples, completions)
  spans = sorted(tuple(map(float, p.read_text().split())) for p in log.iterdir())
  want = [[task.verify(ex, Texts().decode([i, j])).reward for j in range(2)]
          for i, ex in enumerate(examples)]
  np.testing.assert_allclose(graded.rewards_BG, want)
  assert graded.correct_BG.tolist() == [[True, True], [False, True]]  # f() == i·j == i
  assert len(spans) == 4
  if (os.cpu_count() or 1) >= 2:
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # two runs at once


def test_what_the_code_started_is_killed_when_it_exits_too(tmp_path):
  """A program that exits at once (0, a pass) leaving a child behind: the child is killed
  with it, not left running (and writing into its removed folder) beside the trainer."""
  marker = tmp_path / "late.txt"
  assert code_exec.run_case(_spawner(marker), "")
  time.sleep(2.0)
  assert not marker.exists()


def test_a_case_that_times_out_zeroes_the_pass_rate_as_officially():
  """DiffuCoder's evaluation script runs the cases with ``subprocess.run(timeout=5)`` and does
  not catch ``TimeoutExpired``: the script dies before printing ``__PASS_RATE__``, and the
  provider scores it None (router) or 0.0, so the code reward is 0 whatever the other cases
  did."""
  slow = "def add(a, b):\n    while a == 2:\n        pass\n    return a + b\n"
  cases = CASES[:2] + ["assert add(2, 2) == 4"]
  # Cases that pass end at once, so their limit costs nothing: a generous one, as Python's
  # start-up alone took 0.9 s on a loaded 2-core box (at 0.5 s a passing case timed out, 0.0).
  assert code_exec.pass_rate(slow, cases[:2], timeout_s=30.0, workers=1) == 1.0
  for workers in (1, 3):
    assert code_exec.pass_rate(slow, cases, timeout_s=0.5, workers=workers) == 0.0
  result = code_result(f"```python\n{slow}```\n", cases, 2.0, 0.5, 0.5)
  assert result.reward == 0.5 and result.info["pass_rate"] == 0.0


def test_a_program_longer_than_one_command_line_argument_runs():
  """Linux caps one argv string at 128 KiB (MAX_ARG_STRLEN): a test case with a large literal
  (a record the task accepts) was an OSError out of the verifier, ending the run."""
  big = "assert len(DATA) == 200000\n"
  assert code_exec.run_case(f"DATA = {'y' * 200_000!r}", big)
  assert not code_exec.run_case(f"DATA = {'y' * 200_000!r}", "assert False")


def test_a_case_the_system_cannot_start_fails_with_a_warning_not_the_run(monkeypatch, caplog):
  """No process slots left (another completion's fork bomb): the case fails after a few
  tries and the verifier goes on."""
  calls = []

  def refuse(*args, **kwargs):
    calls.append(1)
    raise BlockingIOError(11, "Resource temporarily unavailable")

  monkeypatch.setattr(code_exec.subprocess, "Popen", refuse)
  monkeypatch.setattr(code_exec.time, "sleep", lambda s: None)
  assert code_exec.case_outcome(ADD, CASES[0]) == code_exec.FAIL
  assert len(calls) == code_exec.SPAWN_TRIES
  assert "could not start a test case" in caplog.text


def test_threads_verifying_at_once_share_one_timed_worker(tmp_path):
  """verify_timeout > 0 (a worker process) with parallel verification: one worker, made
  once, whichever thread asks first."""
  import concurrent.futures
  path = _write(tmp_path / "t.jsonl", [{"question": "q", "test_cases": ["assert f() == 1"]}])
  task = make_task("code", test_file=path, verify_timeout=30.0)
  ex = task.generate("test", -1, seed=0)[0]
  made = []
  from dllm_rl.tasks.timed_verifier import TimedVerifier
  original = TimedVerifier.__init__

  def counting(self, *args, **kwargs):  # slow: the threads all ask while it is made
    import time
    made.append(1)
    time.sleep(0.3)
    original(self, *args, **kwargs)

  TimedVerifier.__init__ = counting
  try:
    text = "```python\ndef f():\n    return 1\n```\n"
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
      results = list(pool.map(lambda _: task.verify(ex, text), range(4)))
  finally:
    TimedVerifier.__init__ = original
    task.close()
  assert len(made) == 1 and all(r.correct for r in results)


def _alive(pid: int) -> bool:
  """Running (a zombie left for a PID 1 that does not reap is not)."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as fh:
      stat = fh.read()
  except OSError:
    return False
  return stat[stat.rfind(b")") + 2:].split()[0] != b"Z"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds processes in /proc")
def test_a_timed_worker_killed_mid_case_leaves_no_temporary_folder(tmp_path, monkeypatch):
  """A worker killed at its deadline never left its ``with TemporaryDirectory`` block: the
  case's folder (its source.py) stayed in the temporary folder, one per verify timeout of a
  run. The worker's temporary files now go in a folder of its own, removed with it."""
  import functools
  import tempfile

  from dllm_rl.tasks.timed_verifier import TimedVerifier
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  monkeypatch.setenv("TMPDIR", str(tmp))  # what the worker inherited
  monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # where this process makes folders
  with TimedVerifier(functools.partial(code_exec.case_outcome, timeout_s=60.0), 2.0) as timed:
    timed.start()._worker.wait_ready(60.0)
    assert timed("", "import time; time.sleep(60)").info["reason"] == "timeout"
  assert sorted(os.listdir(tmp)) == []


def test_a_timed_worker_killed_on_its_deadline_kills_the_cases_it_started(tmp_path):
  """task.options.verify_timeout: the worker killed at its deadline takes its running test
  cases (each in a session of its own) and what they started with it; a sleeping case uses
  no CPU, so its CPU limit would never end it."""
  import functools

  from dllm_rl.tasks.timed_verifier import TimedVerifier
  pids = tmp_path / "pids"
  case = ("import os, subprocess, sys, time\n"
          "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
          f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{p.pid}}')\n"
          "time.sleep(60)")
  with TimedVerifier(functools.partial(code_exec.case_outcome, timeout_s=60.0), 3.0) as timed:
    timed.start()._worker.wait_ready(60.0)
    assert timed("", case).info["reason"] == "timeout"
  found = [int(p) for p in pids.read_text().split()]
  assert len(found) == 2
  deadline = time.monotonic() + 5.0
  while any(map(_alive, found)) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not any(map(_alive, found))
