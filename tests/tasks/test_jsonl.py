"""JSONL-backed tasks: loading, deterministic generate, malformed lines (raise
naming file:line, or skip and count), missing files, verify right and wrong."""

import codecs
import gzip
import io
import json
import lzma
import os
import re
import zipfile

import pytest

from dllm_rl.tasks import TASKS, make_task
from dllm_rl.tasks.jsonl_base import ON_ERROR

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
  with pytest.raises(ValueError,
                     match=r"asked for 11 'test' examples but .*test.jsonl has only 10"):
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
    with pytest.raises(ValueError, match=r"'math500': verify_timeout must be a finite number"
                                         r" of seconds >= 0"):
      make_task("math500", test_file=task.test_file, verify_timeout=bad)


def test_a_null_field_is_missing(tmp_path):
  """A data frame written by pandas (to_json lines=True) holds null for a missing cell: a MATH
  row with a null answer and a boxed solution is the solution's, as `dllm-rl-data prepare`
  reads it, and a null optional solution (Countdown, code) is none; before, each stopped the
  load ("field 'answer' must be str, got NoneType")."""
  rows = [{"problem": "Simplify $\\sqrt{8}$.", "answer": None,
           "solution": "We get $\\boxed{2\\sqrt{2}}$."},
          {"problem": "What is $1+1$?", "answer": "2", "solution": None}]
  task = make_task("math500", test_file=_write(tmp_path / "m.jsonl", rows), verify_timeout=0)
  exs = {e.meta["reference"]: e.answer for e in task.generate("test", -1, 0)}
  assert exs == {"2\\sqrt{2}": rows[0]["solution"], "2": "\\boxed{2}"}
  # the optional solution of Countdown and code: null is none (was "must be str, got NoneType")
  countdown = make_task("countdown_jsonl", test_file=_write(tmp_path / "c.jsonl", [
      {"nums": [4, 4, 2], "target": 10, "solution": None}, COUNTDOWN[0]]))
  assert sorted(e.answer for e in countdown.generate("test", -1, 0)) == ["", "3*5+7"]
  code = make_task("code", test_file=_write(tmp_path / "code.jsonl", [
      {"question": "Write f.", "test_cases": ["assert f() == 1"], "solution": None}]))
  assert code.generate("test", -1, 0)[0].answer == ""


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
    ("math500", MATH, '{"problem": "p", "answer": null, "solution": null}',
     "'answer' or 'solution' .*a null one counts as missing"),
    # json's ValueError for an integer over 4,300 digits: was raised bare, no file:line
    ("countdown_jsonl", COUNTDOWN, '{"nums": [1, 2], "target": 1' + "0" * 5000 + "}",
     r"invalid JSON value \(Exceeds the limit \(4300 digits\)"),
    # json kept the last of a key given twice without a word
    ("gsm8k", GSM8K, '{"question": "q", "answer": "#### 1", "answer": "#### 2"}',
     r"duplicate key 'answer' in a JSON object"),
    ("countdown_jsonl", COUNTDOWN, '{"nums": [1, 2], "target": 3, "x": {"a": 1, "a": 2}}',
     r"duplicate key 'a'"),
    ("countdown_jsonl", COUNTDOWN, '{"nums": [1, true], "target": 3}', "'nums'"),
    ("countdown_jsonl", COUNTDOWN, '{"nums": [1, 2], "target": "3"}', "'target' must be int"),
    ("countdown_jsonl", COUNTDOWN, '{"nums": [1, 2], "target": 3, "solution": "1*2"}',
     "wrong value"),
    ("sudoku_jsonl", SUDOKU, '{"puzzle": "0034", "solution": "1234341221434321"}', "16 digits"),
    ("sudoku_jsonl", SUDOKU, '{"puzzle": "0034341221404301", "solution": "1234341221434312"}',
     "not a valid grid"),
])
def test_malformed_lines(tmp_path, caplog, name, records, bad, what):
  path = _write(tmp_path / "data.jsonl", records, extra_lines=["", bad])
  line = len(records) + 2  # the blank line is counted, not reported
  with pytest.raises(ValueError, match=rf"data\.jsonl:{line}: .*{what}"):
    make_task(name, train_file=path)
  task = make_task(name, train_file=path, test_file=path, on_error="skip")
  assert task.skipped == 1  # the file is read once, though it serves both splits
  assert task.skip_reasons[0].startswith(f"{path}:{line}: ")
  # the warning names the first skipped line and its problem (it gave only the count)
  (warning,) = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
  assert warning.startswith(f"task {name!r}: skipped 1 malformed line(s) of {path}"
                            f" (on_error='skip'; the first: {path}:{line}: ")
  assert len(task.generate("train", -1, 0)) == len(records)


def test_countdown_solution_the_d1_reward_scores_wrong_is_refused(tmp_path):
  """A stored solution "3*5+7=22" passed the lenient check at load and became an SFT target
  that reward="d1" (d1's compute_score, the d1 preset's) then scored 0.1, not 1: it is now
  refused naming file:line and why; the lenient reward still takes it (as its own target)."""
  rows = COUNTDOWN + [{"nums": [3, 5, 7], "target": 22, "solution": "3*5+7 = 22"}]
  path = _write(tmp_path / "c.jsonl", rows)
  lenient = make_task("countdown_jsonl", train_file=path, reward="verifier")
  ex = next(e for e in lenient.generate("train", -1, 0) if e.answer == "3*5+7 = 22")
  assert lenient.verify(ex, ex.answer).correct
  for options in ({"reward": "d1"}, {"prompt_preset": "d1"}):  # built after: not the cached
    with pytest.raises(ValueError, match=r"c\.jsonl:4: field 'solution' '3\*5\+7 = 22' is"
                       r" scored wrong by reward='d1' .*must use each of \[3, 5, 7\] exactly"
                       r" once \(d1 reads the integers \[3, 5, 7, 22\]\)"):
      make_task("countdown_jsonl", train_file=path, **options)
  skip = make_task("countdown_jsonl", train_file=path, reward="d1", on_error="skip")
  assert skip.skipped == 1 and len(skip.generate("train", -1, 0)) == len(COUNTDOWN)
  d1 = make_task("countdown_jsonl", train_file=_write(tmp_path / "ok.jsonl", COUNTDOWN),
                 prompt_preset="d1")  # the target as tagged scores 1 by the d1 reward
  ex = next(e for e in d1.generate("train", -1, 0) if e.answer)
  assert d1.verify(ex, ex.answer).reward == 1.0


def test_gsm8k_answer_the_d1_reward_scores_wrong_is_refused(tmp_path):
  """d1's GSM8K correctness compares with the text after the first '####', the SFT target
  ends with the text after the last: an answer with two scored its own target 0 of 2.0."""
  bad = {"question": "q?", "answer": "5+1=6 #### 6\nso #### 7"}
  path = _write(tmp_path / "g.jsonl", GSM8K[:3] + [bad])
  assert len(make_task("gsm8k", train_file=path).generate("train", -1, 0)) == 4
  with pytest.raises(ValueError, match=r"g\.jsonl:4: field 'answer': the text after its first"
                     r" '####' \('6\\nso'\) is not the text after its last \('7'\)"):
    make_task("gsm8k", train_file=path, prompt_preset="d1")
  five = {"question": "q?", "answer": "5+1=6 ##### 6"}  # one mark read two ways: '# 6', '6'
  with pytest.raises(ValueError, match=r"first '####' \('# 6'\) is not the text after its"
                     r" last \('6'\)"):
    make_task("gsm8k", train_file=_write(tmp_path / "h.jsonl", GSM8K[:3] + [five]),
              prompt_preset="d1")
  d1 = make_task("gsm8k", train_file=_write(tmp_path / "ok.jsonl", GSM8K[:3]),
                 prompt_preset="d1")
  ex = d1.generate("train", 1, 0)[0]
  assert d1.verify(ex, ex.answer).info["d1_reward"] >= 2.0  # correctness credited


def test_the_parsed_records_are_not_shared_across_answer_tag(tmp_path):
  """The records parsed once per file were shared by a task built with another answer_tag,
  which changes the SFT target: the second task got the first one's (untagged) targets."""
  path = _write(tmp_path / "c.jsonl", COUNTDOWN[:1])
  plain = make_task("countdown_jsonl", train_file=path, test_file=path)
  tagged = make_task("countdown_jsonl", train_file=path, test_file=path, answer_tag=True)
  assert plain.generate("test", 1, 0)[0].answer == "3*5+7"
  assert tagged.generate("test", 1, 0)[0].answer == (
      "<reasoning></reasoning>\n<answer>3*5+7</answer>")


def test_a_task_built_again_on_the_same_file_warns_once(tmp_path, caplog, monkeypatch):
  """Validation and the run each build the task: the on_error='skip' warning came twice and
  each parsed the file; the second now takes the first's records, while the bytes match."""
  from dllm_rl.tasks import jsonl_base
  path = _write(tmp_path / "data.jsonl", GSM8K[:12], extra_lines=["{"])
  a, b = (make_task("gsm8k", train_file=path, on_error="skip") for _ in range(2))
  assert [r.getMessage() for r in caplog.records].count(
      f"task 'gsm8k': skipped 1 malformed line(s) of {path} (on_error='skip'; the first:"
      f" {path}:13: invalid JSON (Expecting property name enclosed in double quotes at column"
      " 2))") == 1
  assert a.skipped == b.skipped == 1 and a.skip_reasons == b.skip_reasons
  assert b.skip_reasons[0].startswith(f"{path}:13: invalid JSON")
  assert a.generate("train", -1, 0) == b.generate("train", -1, 0)
  parsed = []
  parse = jsonl_base.JsonlTask._parse
  monkeypatch.setattr(jsonl_base.JsonlTask, "_parse",
                      lambda self, *args: parsed.append(args[0]) or parse(self, *args))
  make_task("gsm8k", train_file=path, on_error="skip")
  assert parsed == []  # read, not parsed again
  # other options or other bytes: parsed again
  make_task("gsm8k", train_file=path, on_error="skip", prompt_template="Q: {question}")
  _write(tmp_path / "data.jsonl", GSM8K[:11], extra_lines=["{"])
  assert len(make_task("gsm8k", train_file=path, on_error="skip").generate("train", -1, 0)) == 11
  assert parsed == [path, path]


def test_a_file_without_records_says_why(tmp_path):
  """An empty file, or one whose every line was skipped: NoRecords naming the file and why
  (the first skipped line), not "has only 0", whose fix was a smaller size."""
  from dllm_rl.tasks.jsonl_base import NoRecords
  empty = tmp_path / "empty.jsonl"
  empty.write_bytes(codecs.BOM_UTF8 + b"\r\n\n")
  task = make_task("gsm8k", train_file=str(empty))
  assert task.generate("test", 0, 0) == []
  with pytest.raises(NoRecords, match=rf"asked for 2 'test' examples but {empty} holds no record:"
                                      r" the file is empty \(blank lines at most\)$") as err:
    task.generate("test", 2, 0)
  assert err.value.option == "train_file"
  bad = _write(tmp_path / "bad.jsonl", [], extra_lines=['{"question": "q"}', "{"])
  task = make_task("gsm8k", train_file=str(empty), test_file=bad, on_error="skip")
  with pytest.raises(NoRecords, match=rf"holds no record: each of its 2 line\(s\) was skipped as"
                                      rf" malformed \(on_error='skip'; the first: {bad}:1: missing"
                                      r" field 'answer'") as err:
    task.generate("test", 1, 0)
  assert err.value.option == "test_file"


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


def test_an_unpaired_surrogate_escape_is_named_with_its_line(tmp_path):
  """"\ud800" is valid JSON but no Unicode text: it was read, then crashed the HF tokenizer
  (`TypeError: TextInputSequence must be str`, no file or line) or made datasets fail in
  prepare; now it is a malformed line (named, or skipped), as in a code task's test cases."""
  path = _write(tmp_path / "s.jsonl", GSM8K[:3], [
      '{"question": "What is 1+\\ud800?", "answer": "#### 2"}'])
  what = (rf"{path}:4: field 'question' holds an unpaired UTF-16 surrogate \\ud800 at"
          r" character 11 \(half of a \\u escape pair\)")
  with pytest.raises(ValueError, match=rf"task 'gsm8k': {what}"):
    make_task("gsm8k", train_file=path)
  task = make_task("gsm8k", train_file=path, test_file=path, on_error="skip")
  assert task.skipped == 1 and len(task.generate("train", -1, 0)) == 3
  paired = _write(tmp_path / "p.jsonl", [{"question": "Smile \ud83d\ude00?", "answer": "#### 1"}])
  assert "\U0001F600" in make_task("gsm8k", test_file=paired).generate("test", -1, 0)[0].prompt
  code = _write(tmp_path / "c.jsonl", [{"question": "q", "test_cases": ["assert 1", "x\udc80"]}])
  with pytest.raises(ValueError, match=r"c\.jsonl:1: field 'test_cases' holds an unpaired"):
    make_task("code", test_file=code)


def _rows(records=GSM8K[:3]):
  return "".join(json.dumps(r) + "\n" for r in records).encode()


def _zip(data):
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w") as archive:
    archive.writestr("data.jsonl", data)
  return buffer.getvalue()


PREPARE = r"dllm-rl-data prepare gsm8k --out DIR --source train="
THEN = r" \(docs/data\.md\), then give DIR/train\.jsonl"


@pytest.mark.parametrize("name, make, what, todo", [
    ("d.jsonl.gz", gzip.compress, "gzip-compressed",
     r"decompress it \(gunzip -k PATH\) and give the decompressed file"),
    ("d.jsonl.xz", lzma.compress, "xz-compressed",
     r"decompress it \(xz -dk PATH\) and give the decompressed file"),
    ("d.jsonl.zst", lambda b: b"\x28\xb5\x2f\xfd" + b, "zstd-compressed",  # a frame's magic
     r"decompress it \(zstd -d PATH\) and give the decompressed file"),
    ("d.zip", _zip, "a zip archive",
     r"extract the \.jsonl file from it \(unzip PATH\) and give it"),
    # a Parquet file starts and ends with "PAR1" (the columns and footer between)
    ("train.parquet", lambda b: b"PAR1\x15\x04" + b + b"PAR1", "a Parquet file",
     rf"convert it to JSON Lines with {PREPARE}PATH{THEN}"),
    ("train.jsonl", lambda b: b"PAR1\x15\x04" + b + b"PAR1", "a Parquet file",
     rf"convert it to JSON Lines with {PREPARE}PATH \(renamed to end in \.parquet\){THEN}"),
    ("data-00000-of-00001.arrow", lambda b: b"\xff\xff\xff\xff\x80\x00" + b,
     r"an Arrow stream \(a datasets cache or save_to_disk file\)",
     rf"convert its data set with {PREPARE}FOLDER{THEN} \(FOLDER: the save_to_disk folder"
     r" that holds it\)"),
    ("utf16.jsonl", lambda b: b.decode().encode("utf-16"),
     r"UTF-16 text \(it starts with a UTF-16 byte-order mark\)", "save it as UTF-8"),
], ids=["gzip", "xz", "zstd", "zip", "parquet", "parquet-misnamed", "arrow", "utf-16"])
def test_a_file_that_is_not_json_lines_text_says_what_it_is_and_what_to_do(tmp_path, name,
                                                                           make, what, todo):
  """Read line by line, these were "not UTF-8 text (byte 0x8b at column 2)": the file as a
  whole is named by its first bytes, with "skip" too (no line of it is a record)."""
  path = tmp_path / name
  path.write_bytes(make(_rows()))
  todo = todo.replace("PATH", re.escape(str(path)))
  for on_error in ON_ERROR:
    with pytest.raises(ValueError, match=rf"^task 'gsm8k': {re.escape(str(path))}: {what}, not"
                                         rf" JSON Lines text: {todo}$"):
      make_task("gsm8k", train_file=str(path), on_error=on_error)


def test_a_byte_order_mark_is_read_past_and_a_json_array_is_named(tmp_path):
  """A UTF-8 byte-order mark at the start is read past (see not_jsonl); one inside (files
  joined together) is named. A file holding one JSON array, pretty-printed or on one line, is
  named as such, not as invalid JSON at column 2."""
  bom = tmp_path / "bom.jsonl"
  bom.write_bytes(codecs.BOM_UTF8 + _rows())
  assert len(make_task("gsm8k", train_file=str(bom), test_file=str(bom))
             .generate("train", -1, 0)) == 3
  joined = tmp_path / "joined.jsonl"
  joined.write_bytes((codecs.BOM_UTF8 + _rows()) * 2)
  with pytest.raises(ValueError, match=rf"{re.escape(str(joined))}:4: starts with a UTF-8"
                                       r" byte-order mark \(files joined together\?\): remove it"):
    make_task("gsm8k", train_file=str(joined))
  for indent in (2, None):
    array = tmp_path / "array.json"
    array.write_text(json.dumps(GSM8K[:3], indent=indent))
    with pytest.raises(ValueError, match=rf"{re.escape(str(array))}:1: the file starts a JSON"
                                         r" array \('\['\), not JSON Lines \(one JSON object per"
                                         rf" line\): .*jq -c '\.\[\]' .*{PREPARE}"):
      make_task("gsm8k", train_file=str(array))


def test_a_csv_file_is_named_with_the_command_that_converts_it(tmp_path):
  """A .csv file (d1's Sudoku files are CSV) given as a task file is named as CSV with the
  `dllm-rl-data prepare` command that reads it, not as invalid JSON at column 1; a .csv file
  that does hold JSON Lines is read."""
  csv = tmp_path / "4x4_test_sudoku.csv"
  csv.write_text("Puzzle,Solution\n" + "".join(f"{r['puzzle']},{r['solution']}\n"
                                                for r in SUDOKU))
  with pytest.raises(ValueError, match=rf"{re.escape(str(csv))}:1: a CSV file, not JSON Lines"
                                       r" \(one JSON object per line\): convert it with"
                                       r" dllm-rl-data prepare sudoku --out DIR --source"
                                       rf" test={re.escape(str(csv))} "):
    make_task("sudoku_jsonl", test_file=str(csv))
  named_csv = tmp_path / "rows.csv"
  _write(named_csv, SUDOKU)
  assert len(make_task("sudoku_jsonl", test_file=str(named_csv)).generate("test", -1, 0)) == 2


def test_each_jsonl_task_names_the_prepare_data_set_that_writes_its_files():
  """The data set of ``dllm-rl-data prepare`` that a Parquet or JSON file is converted with."""
  from dllm_rl.data.recipes import RECIPES
  for name in ("gsm8k", "math500", "countdown_jsonl", "sudoku_jsonl"):
    recipe = RECIPES[TASKS.get(name).recipe]
    assert recipe.task == name and set(recipe.splits) == {"train", "test"}, name


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


def test_a_large_files_records_are_not_held_past_the_build_that_takes_them(tmp_path, caplog,
                                                                            monkeypatch):
  """The parse cache held the records of the last two files for the process's lifetime (a
  file's records take ~4x its bytes), after every task built on them was gone. A file over
  _PARSED_KEEP_BYTES now has its records kept for one later build (validation, then the run:
  parsed once), then left to the tasks; a build after that parses it again, and its skipped
  lines are still warned about once. A small file's records stay cached, shared with the
  tasks (not a second copy)."""
  import gc
  import weakref
  from dllm_rl.tasks import jsonl_base
  path = _write(tmp_path / "data.jsonl", GSM8K[:12], extra_lines=["{"])
  parsed = []
  parse = jsonl_base.JsonlTask._parse
  monkeypatch.setattr(jsonl_base.JsonlTask, "_parse",
                      lambda self, *args: parsed.append(args[0]) or parse(self, *args))
  small = make_task("gsm8k", train_file=path, on_error="skip")
  again = make_task("gsm8k", train_file=path, on_error="skip")
  assert parsed == [path] and again._records[path][0] is small._records[path][0]  # shared
  monkeypatch.setattr(jsonl_base, "_PARSED_KEEP_BYTES", os.path.getsize(path) - 1, raising=False)
  jsonl_base._PARSED.clear()
  caplog.clear()
  first = make_task("gsm8k", train_file=path, on_error="skip")  # validation
  record = weakref.ref(first._records[path][0])
  del first
  gc.collect()
  assert record() is not None  # kept for the next build
  second = make_task("gsm8k", train_file=path, on_error="skip")  # the run: not parsed again
  assert parsed == [path, path] and second._records[path][0] is record()
  del second, small, again
  gc.collect()
  assert record() is None  # no longer held once the tasks are gone
  third = make_task("gsm8k", train_file=path, on_error="skip")
  assert parsed == [path] * 3 and third.skipped == 1 and len(third.generate("train", -1, 0)) == 12
  assert third.skip_reasons[0].startswith(f"{path}:13: invalid JSON")
  assert sum("skipped 1 malformed line(s)" in r.getMessage() for r in caplog.records) == 1
