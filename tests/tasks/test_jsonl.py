"""JSONL-backed tasks: loading, deterministic generate, malformed lines (raise
naming file:line, or skip and count), missing files, verify right and wrong."""

import json
import re

import pytest

from dllm_rl.tasks import TASKS, make_task

GSM8K = [{"question": f"Tom has {i} apples and buys {i + 2} more. How many now?",
          "answer": f"{i}+{i + 2}=<<{i}+{i + 2}={2 * i + 2}>>{2 * i + 2}\n#### {2 * i + 2:,}"}
         for i in range(1, 41)]
MATH = [{"problem": "What is $1/2 + 1/4$?", "answer": "\\frac{3}{4}"},
        {"problem": "Simplify $\\sqrt{8}$.", "solution": "We get $\\boxed{2\\sqrt{2}}$."},
        {"problem": "Solve $x + 1 = 3$.", "answer": "2"}]
COUNTDOWN = [{"nums": [3, 5, 7], "target": 22, "solution": "3*5+7"},
             {"nums": [4, 4, 2], "target": 10},
             {"nums": [10, 2, 6, 1], "target": 26}]
SUDOKU = [{"puzzle": "0034341221404301", "solution": "1234341221434321"},
          {"puzzle": "1200340021000000", "solution": "1243341221344321"}]


def _write(path, records, extra_lines=()):
  lines = [json.dumps(r) for r in records] + list(extra_lines)
  path.write_text("\n".join(lines) + "\n")
  return str(path)


def test_registered():
  for name in ("gsm8k", "math500", "countdown_jsonl", "sudoku_jsonl"):
    assert name in TASKS


def test_gsm8k_loading_and_determinism(tmp_path):
  train = _write(tmp_path / "train.jsonl", GSM8K[:30])
  test = _write(tmp_path / "test.jsonl", GSM8K[30:])
  task = make_task("gsm8k", train_file=train, test_file=test,
                   prompt_template="Q: {question}\nA:")
  a = task.generate("train", 10, seed=0)
  assert a == task.generate("train", 10, seed=0)
  assert a != task.generate("train", 10, seed=1)
  assert task.generate("train", 5, seed=0) == a[:5]  # a prefix of the same shuffle
  full = task.generate("train", -1, seed=3)
  assert sorted(ex.prompt for ex in full) == sorted(
      f"Q: {r['question']}\nA:" for r in GSM8K[:30])
  assert len(task.generate("test", -1, seed=0)) == 10
  assert task.generate("train", 0, seed=0) == []
  with pytest.raises(ValueError, match=r"asked for 11 'test' examples but .*test.jsonl has only 10"):
    task.generate("test", 11, seed=0)
  ex = next(e for e in full if e.prompt.startswith("Q: Tom has 20 apples"))
  assert ex.answer == GSM8K[19]["answer"] and ex.meta["reference"] == "42"
  for e in full:
    assert task.verify(e, e.answer).correct  # the SFT target verifies
  for good in ("20+22=42\n#### 42", "The answer is \\boxed{42}.", "42 apples"):
    assert task.verify(ex, good).reward == 1.0, good
  for bad in ("#### 41", "I do not know", "42 then 43"):
    assert task.verify(ex, bad).reward == 0.0, bad


def test_each_example_names_the_file_and_line_it_was_read_from(tmp_path):
  """``Example.source`` is "file:line" of the line that holds the record (blank lines
  counted), in every split and after the shuffle: what a too-long prompt is named by."""
  train = _write(tmp_path / "train.jsonl", GSM8K[:5], extra_lines=["", json.dumps(GSM8K[5])])
  task = make_task("gsm8k", train_file=train, test_fraction=0.5)
  lines = open(train).read().splitlines()
  examples = task.generate("train", -1, 0) + task.generate("test", -1, 0)
  assert len(examples) == 6
  for ex in examples:
    path, line = ex.source.rsplit(":", 1)
    assert path == train and json.loads(lines[int(line) - 1])["question"] in ex.prompt


def test_split_from_train_file(tmp_path):
  train = _write(tmp_path / "train.jsonl", GSM8K)
  task = make_task("gsm8k", train_file=train, test_fraction=0.3)
  tr, te = task.generate("train", -1, 0), task.generate("test", -1, 0)
  assert len(tr) + len(te) == len(GSM8K) and te
  assert not {e.prompt for e in tr} & {e.prompt for e in te}
  only_test = make_task("gsm8k", test_file=train)
  assert len(only_test.generate("test", -1, 0)) == len(GSM8K)
  with pytest.raises(ValueError, match="no train_file"):
    only_test.generate("train", 1, 0)


def test_math500(tmp_path):
  task = make_task("math500", test_file=_write(tmp_path / "m.jsonl", MATH),
                   prompt_template="{question} Put the answer in \\boxed{{}}.")
  exs = {e.meta["reference"]: e for e in task.generate("test", -1, 0)}
  assert set(exs) == {"\\frac{3}{4}", "2\\sqrt{2}", "2"}
  assert exs["\\frac{3}{4}"].answer == "\\boxed{\\frac{3}{4}}"
  assert exs["2\\sqrt{2}"].answer == MATH[1]["solution"]
  assert exs["2"].prompt == "Solve $x + 1 = 3$. Put the answer in \\boxed{}."
  try:
    assert task.verify(exs["\\frac{3}{4}"], "so \\boxed{0.75}").correct
    assert task.verify(exs["2\\sqrt{2}"], "\\boxed{\\sqrt{8}}").correct
    assert not task.verify(exs["2"], "\\boxed{3}").correct
    for ex in exs.values():
      assert task.verify(ex, ex.answer).correct
    assert task._timed is not None  # math is verified in a worker by default
  finally:
    task.close()
  inline = make_task("math500", test_file=task.test_file, verify_timeout=0)
  assert inline.verify(inline.generate("test", 1, 0)[0], "\\boxed{nothing}").reward == 0.0
  assert inline._timed is None
  with pytest.raises(ValueError, match=r"test_fraction splits the test set off train_file .*"
                                       r"not read"):
    make_task("math500", train_file=task.test_file, test_file=task.test_file, test_fraction=0.2)
  for bad in (-1, float("nan"), float("inf")):
    with pytest.raises(ValueError, match=r"'math500': verify_timeout must be a finite number of seconds >= 0"):
      make_task("math500", test_file=task.test_file, verify_timeout=bad)


def test_countdown_and_sudoku(tmp_path):
  cd = make_task("countdown_jsonl", train_file=_write(tmp_path / "c.jsonl", COUNTDOWN),
                 test_file=_write(tmp_path / "c_test.jsonl", COUNTDOWN[:1]))
  exs = {e.meta["target"]: e for e in cd.generate("train", -1, 0)}
  assert exs[22].answer == "3*5+7" and exs[10].answer == ""
  assert "3, 5, 7" in exs[22].prompt and "22" in exs[22].prompt
  assert cd.verify(exs[22], exs[22].answer).correct
  assert cd.verify(exs[10], "<answer>4+4+2</answer>").correct
  assert not cd.verify(exs[10], "<answer>4*2+2</answer>").correct
  assert cd.verify(exs[26], "10*2+6*1").correct
  assert cd.canonical(exs[10]) == "2,4,4>10"
  sd = make_task("sudoku_jsonl", train_file=_write(tmp_path / "s.jsonl", SUDOKU),
                 test_file=_write(tmp_path / "s_test.jsonl", SUDOKU[:1]),
                 prompt_template="{puzzle}=")
  ex = sd.generate("test", 1, 0)[0]
  assert ex.prompt == "0034341221404301=" and ex.answer == "1234341221434321"
  assert sd.verify(ex, ex.answer).reward == 1.0
  assert sd.verify(ex, "2134341221434321").reward == 0.0
  dense = make_task("sudoku_jsonl", test_file=sd.test_file, reward="cell_accuracy")
  assert dense.verify(ex, "2134341221434321").reward == 0.5


@pytest.mark.parametrize("name, records, bad, what", [
    ("gsm8k", GSM8K[:3], "{not json", "invalid JSON"),
    ("gsm8k", GSM8K[:3], '["a list"]', "expected a JSON object"),
    ("gsm8k", GSM8K[:3], '{"question": "q"}', "missing field 'answer'"),
    ("gsm8k", GSM8K[:3], '{"question": "q", "answer": "no marker 5"}', "'#### x'"),
    ("gsm8k", GSM8K[:3], '{"question": "", "answer": "#### 5"}', "'question' is empty"),
    ("math500", MATH, '{"problem": "p"}', "'answer' or 'solution'"),
    ("math500", MATH, '{"problem": "p", "solution": "no box"}', "boxed"),
    ("countdown_jsonl", COUNTDOWN, '{"nums": [1, true], "target": 3}', "'nums'"),
    ("countdown_jsonl", COUNTDOWN, '{"nums": [1, 2], "target": "3"}', "'target' must be int"),
    ("countdown_jsonl", COUNTDOWN, '{"nums": [1, 2], "target": 3, "solution": "1*2"}',
     "wrong value"),
    ("sudoku_jsonl", SUDOKU, '{"puzzle": "0034", "solution": "1234341221434321"}', "16 digits"),
    ("sudoku_jsonl", SUDOKU, '{"puzzle": "0034341221404301", "solution": "1234341221434312"}',
     "not a valid grid"),
])
def test_malformed_lines(tmp_path, name, records, bad, what):
  path = _write(tmp_path / "data.jsonl", records, extra_lines=["", bad])
  line = len(records) + 2  # the blank line is counted, not reported
  with pytest.raises(ValueError, match=rf"data\.jsonl:{line}: .*{what}"):
    make_task(name, train_file=path)
  task = make_task(name, train_file=path, test_file=path, on_error="skip")
  assert task.skipped == 1  # the file is read once, though it serves both splits
  assert task.skip_reasons[0].startswith(f"{path}:{line}: ")
  assert len(task.generate("train", -1, 0)) == len(records)


def test_a_line_that_is_not_utf8_is_named_or_skipped_like_a_malformed_line(tmp_path):
  path = tmp_path / "latin1.jsonl"
  lines = [json.dumps(r).encode() for r in GSM8K[:12]]
  lines[10] = lines[10].replace(b"Tom", "Café Tom".encode("latin-1"))  # line 11
  path.write_bytes(b"\n".join(lines) + b"\n")
  what = rf"{path}:11: not UTF-8 text \(byte 0xe9 at column 18\)"
  with pytest.raises(ValueError, match=rf"task 'gsm8k': {what}"):
    make_task("gsm8k", train_file=str(path))
  task = make_task("gsm8k", train_file=str(path), test_file=str(path), on_error="skip")
  assert task.skipped == 1 and re.match(what, task.skip_reasons[0])
  assert len(task.generate("train", -1, 0)) == 11
  # "\r\n" and a lone "\r" still end lines, as text mode reads them
  crlf = tmp_path / "crlf.jsonl"
  crlf.write_bytes(b"\r\n".join(lines[:3]) + b"\r" + lines[3] + b"\r\n")
  assert len(make_task("gsm8k", train_file=str(crlf), test_file=str(crlf))
             .generate("train", -1, 0)) == 4


def test_option_errors(tmp_path):
  path = _write(tmp_path / "g.jsonl", GSM8K[:2])
  with pytest.raises(FileNotFoundError, match="missing.jsonl"):
    make_task("gsm8k", train_file=path, test_file=str(tmp_path / "missing.jsonl"))
  with pytest.raises(IsADirectoryError, match=rf"'{tmp_path}' is a directory, not a file"):
    make_task("gsm8k", train_file=str(tmp_path))
  with pytest.raises(ValueError, match="train_file"):
    make_task("gsm8k")
  with pytest.raises(ValueError, match="on_error"):
    make_task("gsm8k", train_file=path, on_error="ignore")
  with pytest.raises(ValueError, match=r"prompt_template .*available fields: \['question'\]"):
    make_task("gsm8k", train_file=path, prompt_template="{problem}")
  with pytest.raises(ValueError, match="unknown option"):
    make_task("gsm8k", train_file=path, shuffle=True)
  task = make_task("gsm8k", train_file=path, test_file=path)
  with pytest.raises(ValueError, match="split"):
    task.generate("validation", 1, 0)
  with pytest.raises(ValueError, match="n must be"):
    task.generate("train", -2, 0)
