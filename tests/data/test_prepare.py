"""dllm-rl-data prepare: each named data set from tiny local stand-ins of its official source
(no network), written as the JSONL files the trainer's task reads; local and gs:// output;
named errors."""

import json
import os

import pytest

from dllm_rl.config import load_config_file

datasets = pytest.importorskip("datasets")

from dllm_rl.data import cli, prepare as prep  # noqa: E402
from dllm_rl.data.recipes import RECIPES  # noqa: E402
from dllm_rl.tasks import make_task  # noqa: E402

ROWS = {  # a few rows shaped like each official source's (names and types of its columns)
    "gsm8k": [{"question": f"Tom has {i} apples and buys 2 more. How many?",
               "answer": f"{i}+2={i + 2}\n#### {i + 2}"} for i in range(5)],
    "math": [{"problem": "What is $1+1$?", "solution": "It is $\\boxed{2}$.", "answer": "2",
              "level": "Level 1"},
             {"problem": "Simplify $\\sqrt{8}$.", "solution": "We get $\\boxed{2\\sqrt{2}}$."},
             {"problem": "No answer here.", "solution": "none"},
             {"problem": "Long. " * 250, "answer": "1"}],  # 1,500 characters
    "countdown": [{"target": 22, "nums": [3, 5, 7]}, {"target": 10, "nums": [4, 4, 2]},
                  {"target": 26, "nums": [10, 2, 6, 1]}],
    "countdown_test": [{"input": "30,100,93", "output": "23"}],
    # d1's CSV: a CSV reader takes "0034..." for the integer 34...
    "acecode": [{"id": "a0", "source": "oss", "question": "Write add(a, b).",
                 "test_cases": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
                 "inferences": []},
                {"id": "a1", "question": "No tests.", "test_cases": []}],
    "humaneval": [{"task_id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"Sum.\"\"\"\n",
                   "canonical_solution": "    return a + b\n",
                   "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
                   "entry_point": "add"}],
    "mbpp": [{"source_file": "x", "task_id": 2, "prompt": "Write a function to add two numbers.",
              "code": "import math\ndef add(a, b):\n    return math.fsum([a, b])",
              "test_imports": ["import math"],
              "test_list": ["assert add(1, 2) == 3", "assert math.isclose(add(0.5, 0.5), 1)"]}],
    "sudoku": "Puzzle,Solution\n0034341221404301,1234341221434321\n"
              "1200340021000000,1243341221344321\n1200340021000000,1111111111111111\n",
}


def _saved(tmp_path, name, rows):
  """A ``save_to_disk`` folder (what --source takes, like a downloaded hub split)."""
  path = str(tmp_path / "src" / name)
  datasets.Dataset.from_list(rows).save_to_disk(path)
  return path


def _jsonl(tmp_path, name, rows):
  path = tmp_path / "src" / f"{name}.jsonl"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def _read(path):
  return [json.loads(line) for line in open(path)]


def test_every_recipe_names_the_official_sources():
  assert set(RECIPES) == {"gsm8k", "math", "math500", "countdown", "sudoku", "acecode",
                          "humaneval", "mbpp"}
  src = {name: {s: r.splits[s].describe() for s in r.splits} for name, r in RECIPES.items()}
  assert src["gsm8k"] == {"train": "openai/gsm8k (main) split train",
                          "test": "openai/gsm8k (main) split test"}
  assert src["math"]["train"] == "ankner/math-500 split train"
  assert src["math"]["test"] == src["math500"]["test"] == "HuggingFaceH4/MATH-500 split test"
  assert set(src["math500"]) == {"test"}  # evaluation only
  assert src["countdown"]["train"] == "Jiayi-Pan/Countdown-Tasks-3to4 split train"
  assert src["countdown"]["test"].endswith("/dataset/countdown_cd3_test.jsonl")
  assert src["sudoku"]["train"].endswith("/dataset/4x4_sudoku_unique_puzzles.csv")
  assert src["sudoku"]["test"].endswith("/dataset/4x4_test_sudoku.csv")
  assert src["acecode"]["train"] == "TIGER-Lab/AceCode-89K split train"
  assert src["acecode"]["test"] == src["humaneval"]["test"] == (
      "openai/openai_humaneval split test")
  assert src["mbpp"] == {"test": "google-research-datasets/mbpp (sanitized) split test"}
  assert {r.task for r in RECIPES.values()} == {"gsm8k", "math500", "countdown_jsonl",
                                                "sudoku_jsonl", "code"}


def test_gsm8k_from_a_saved_dataset_is_read_by_the_task(tmp_path, capsys):
  train, test = _saved(tmp_path, "train", ROWS["gsm8k"]), _jsonl(tmp_path, "t", ROWS["gsm8k"][:2])
  out = tmp_path / "gsm8k"
  assert cli.main(["prepare", "gsm8k", "--out", str(out), "--source", f"train={train}",
                   "--source", f"test={test}", "--cache-dir", str(tmp_path / "cache")]) == 0
  assert _read(out / "train.jsonl") == ROWS["gsm8k"]
  printed = capsys.readouterr().out
  assert f"--config.task.options.train_file={out / 'train.jsonl'}" in printed
  assert [x.split(":")[0] for x in printed.splitlines()[:2]] == ["train", "test"]  # as README
  manifest = json.loads((out / "dataset.json").read_text())
  assert manifest["rows"] == {"train": 5, "test": 2} and manifest["task"] == "gsm8k"
  task = make_task("gsm8k", train_file=str(out / "train.jsonl"),
                   test_file=str(out / "test.jsonl"))
  ex = task.generate("test", -1, seed=0)[0]
  assert task.verify(ex, ex.answer).correct
  # a rerun whose test source fails leaves the folder as it was (train.jsonl not replaced)
  before = {f: (out / f).read_text() for f in ("train.jsonl", "test.jsonl", "dataset.json")}
  other = _jsonl(tmp_path, "other", ROWS["gsm8k"][:3])
  bad = tmp_path / "src" / "bad.jsonl"
  bad.write_bytes(b'{"question": "x", "answer": "\xff"}\n')
  assert cli.main(["prepare", "gsm8k", "--out", str(out), "--source", f"train={other}",
                   "--source", f"test={bad}", "--cache-dir", str(tmp_path / "cache")]) != 0
  assert {f: (out / f).read_text() for f in before} == before


def test_a_gsm8k_row_whose_answer_is_a_number_is_dropped_naming_the_type(tmp_path):
  """A numeric answer was counted as "no 'question' or 'answer'", though both were there."""
  rows = [*ROWS["gsm8k"][:2], {"question": "q", "answer": 42}, {"question": "q", "answer": " "},
          {"answer": "#### 1"}]
  records, dropped = prep.convert_rows(rows, RECIPES["gsm8k"], "train")
  assert records == ROWS["gsm8k"][:2]
  assert dropped == {"'answer' is int, not text (a GSM8K answer is the worked solution ending in"
                     " '#### x', the SFT target; a bare final answer x can be given as the text"
                     " '#### x')": 1, "'answer' is empty": 1, "no 'question'": 1}
  numbers = _jsonl(tmp_path, "n", [{"question": "q", "answer": 7}])  # read by datasets as int64
  with pytest.raises(prep.DataError, match=r"no usable row .*'answer' is int, not text"):
    prep.prepare("gsm8k", str(tmp_path / "g"), sources={
        "train": prep.Source(_jsonl(tmp_path, "t", ROWS["gsm8k"]), local=True),
        "test": prep.Source(numbers, local=True)})


def test_math_keeps_answers_and_boxed_solutions_and_says_what_it_dropped(tmp_path):
  manifest = prep.prepare("math", str(tmp_path / "math"), sources={
      "train": prep.parse_source("train=" + _saved(tmp_path, "m", ROWS["math"]))[1],
      "test": prep.parse_source("test=" + _saved(tmp_path, "m5", ROWS["math"][:1]))[1]})
  assert manifest["rows"] == {"train": 2, "test": 1}
  assert manifest["dropped"]["train"] == {
      "no 'answer' and no \\boxed{} in the solution": 1,
      "problem of 1500+ characters (StableDRL's training filter)": 1}
  long = prep.parse_source("test=" + _saved(tmp_path, "long", ROWS["math"][3:]))[1]
  assert prep.prepare("math500", str(tmp_path / "t"), sources={"test": long})["rows"] == {
      "test": 1}  # the test split stays whole
  assert _read(tmp_path / "math" / "train.jsonl")[0] == {
      "problem": "What is $1+1$?", "solution": "It is $\\boxed{2}$.", "answer": "2"}


def test_math500_is_test_only(tmp_path):
  manifest = prep.prepare("math500", str(tmp_path / "m"), sources={
      "test": prep.parse_source("test=" + _saved(tmp_path, "m5", ROWS["math"][:2]))[1]})
  assert set(manifest["files"]) == {"test"}
  assert manifest["config"] == ["--config.task.name=math500",
                                f"--config.task.options.test_file={tmp_path / 'm' / 'test.jsonl'}"]
  assert not os.path.exists(tmp_path / "m" / "train.jsonl")


@pytest.mark.parametrize("name, instead", [("math500", "math"), ("humaneval", "acecode"),
                                           ("mbpp", "acecode")])
def test_an_evaluation_only_set_refuses_a_train_source(tmp_path, capsys, name, instead):
  """`prepare math500 --source train=FILE` wrote FILE's rows as train.jsonl, without the
  training filter of `prepare math` (a 1,500-character problem kept), although the docs list
  math500 as evaluation only: it stops now, before writing, naming the recipe to use."""
  train = _jsonl(tmp_path, "t", ROWS["math"])
  assert cli.main(["prepare", name, "--out", str(tmp_path / "o"), "--source",
                   f"train={train}", "--source", f"test={train}"]) == cli.EXIT_ERROR
  assert capsys.readouterr().err == (
      f"error: --source train=...: {name} is evaluation only (it has only a test split, for"
      f" mode=eval); for train data of task {RECIPES[name].task}, use `dllm-rl-data prepare"
      f" {instead} --source train=PATH`\n")
  assert not os.path.exists(tmp_path / "o")


def test_the_printed_flags_start_from_a_config_of_the_task(tmp_path):
  """The embedded default's arithmetic options and 0.1M model do not fit GSM8K: the flags
  `prepare` prints name the repo's config of the task when it writes a train file."""
  files = {"train": "/d/train.jsonl", "test": "/d/test.jsonl"}
  assert prep.config_overrides("gsm8k", files) == [
      "--config=configs/llada_tpu.py", "--config.task.name=gsm8k",
      "--config.task.options.test_file=/d/test.jsonl",
      "--config.task.options.train_file=/d/train.jsonl"]
  for task, path in prep.TASK_CONFIGS.items():
    assert prep.config_overrides(task, files)[0] == f"--config={path}"
    config = load_config_file(os.path.join(os.path.dirname(__file__), "..", "..", path))
    assert config.task.name == task
  assert prep.config_overrides("sudoku_jsonl", files)[0] == "--config.task.name=sudoku_jsonl"


def test_a_relative_out_folder_is_named_by_its_absolute_path(tmp_path, monkeypatch, capsys):
  """The printed flags are run from a checkout's root (their --config=configs/...), not from
  the folder `prepare` ran in: a relative --out is named by its absolute path there and in
  dataset.json. Before, `--out data/gsm8k` printed train_file=data/gsm8k/train.jsonl, which
  the run, started elsewhere, did not find."""
  train = _jsonl(tmp_path, "train", ROWS["gsm8k"])
  test = _jsonl(tmp_path, "test", ROWS["gsm8k"][:2])
  monkeypatch.chdir(tmp_path)
  assert cli.main(["prepare", "gsm8k", "--out", "data/gsm8k", "--source", f"train={train}",
                   "--source", f"test={test}", "--cache-dir", str(tmp_path / "cache")]) == 0
  out = tmp_path / "data" / "gsm8k"
  printed = capsys.readouterr().out
  assert f"--config.task.options.train_file={out / 'train.jsonl'} " in printed
  assert f"train: 5 rows -> {out / 'train.jsonl'}" in printed
  manifest = json.loads((out / "dataset.json").read_text())
  assert manifest["files"] == {"train": str(out / "train.jsonl"),
                               "test": str(out / "test.jsonl")}


def test_countdown_keeps_three_numbers_and_reads_d1s_test_file(tmp_path):
  manifest = prep.prepare("countdown", str(tmp_path / "cd"), sources={
      "train": prep.parse_source("train=" + _jsonl(tmp_path, "cd", ROWS["countdown"]))[1],
      "test": prep.parse_source("test=" + _jsonl(tmp_path, "cdt", ROWS["countdown_test"]))[1]},
      cache_dir=str(tmp_path / "cache"))
  assert _read(tmp_path / "cd" / "train.jsonl") == [{"nums": [3, 5, 7], "target": 22},
                                                   {"nums": [4, 4, 2], "target": 10}]
  assert manifest["dropped"]["train"] == {"4 numbers (d1 keeps the 3-number instances)": 1}
  assert _read(tmp_path / "cd" / "test.jsonl") == [{"nums": [30, 100, 93], "target": 23}]


def test_sudoku_restores_leading_zeros_and_drops_invalid_grids(tmp_path):
  csv = tmp_path / "sudoku.csv"
  csv.write_text(ROWS["sudoku"])
  manifest = prep.prepare("sudoku", str(tmp_path / "s"), cache_dir=str(tmp_path / "cache"),
                          sources={s: prep.parse_source(f"{s}={csv}")[1]
                                   for s in ("train", "test")})
  assert _read(tmp_path / "s" / "train.jsonl")[0] == {"puzzle": "0034341221404301",
                                                      "solution": "1234341221434321"}
  assert manifest["rows"]["train"] == 2 and sum(manifest["dropped"]["train"].values()) == 1


def test_output_to_gs_through_the_path_layer(tmp_path, fake_gcs):
  train = _saved(tmp_path, "train", ROWS["gsm8k"])
  prep.prepare("gsm8k", "gs://bucket/data/gsm8k",
               sources={s: prep.parse_source(f"{s}={train}")[1] for s in ("train", "test")},
               limit=3)
  lines = fake_gcs.cat("bucket/data/gsm8k/train.jsonl").decode().splitlines()
  assert [json.loads(x) for x in lines] == ROWS["gsm8k"][:3]
  assert json.loads(fake_gcs.cat("bucket/data/gsm8k/dataset.json"))["rows"]["test"] == 3
  task = make_task("gsm8k", train_file="gs://bucket/data/gsm8k/train.jsonl")
  assert len(task.generate("train", -1, 0)) + len(task.generate("test", -1, 0)) == 3


def test_problems_are_one_error_line(tmp_path, capsys):
  def error(*argv):
    assert cli.main(list(argv)) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, lines  # (datasets' progress bars go to stderr too)
    return lines[0]

  assert error("prepare", "gsm9k", "--out", str(tmp_path)) == (
      "error: unknown data set 'gsm9k'; available: acecode, countdown, gsm8k, humaneval, math,"
      " math500, mbpp, sudoku")
  assert "expected train=PATH or test=PATH" in error("prepare", "gsm8k", "--out", str(tmp_path),
                                                     "--source", "dev=x")
  assert "neither a local file / folder nor a hub data set id" in error(
      "prepare", "gsm8k", "--out", str(tmp_path), "--source", "train=no/such/file:x:y")
  assert "no/such/file.jsonl does not exist (a local file" in error(
      "prepare", "gsm8k", "--out", str(tmp_path), "--source", "train=no/such/file.jsonl")
  bad = _jsonl(tmp_path, "bad", [{"question": "q", "answer": "no hashes"}])
  assert "gsm8k train: no usable row" in error("prepare", "gsm8k", "--out", str(tmp_path / "o"),
                                               "--source", f"train={bad}", "--source",
                                               f"test={bad}", "--cache-dir", str(tmp_path / "c"))
  assert error("weights", str(tmp_path / "none")).startswith("error: '")
  good = _jsonl(tmp_path, "good", ROWS["gsm8k"])
  (tmp_path / "a_file").write_text("")
  assert error("prepare", "gsm8k", "--out", str(tmp_path / "a_file"), "--source",
               f"train={good}") == (f"error: --out {tmp_path / 'a_file'} is a file, not a "
                                    "folder; give a new or existing folder")
  latin1 = tmp_path / "src" / "latin1.jsonl"  # "Café" in Latin-1 on line 2, at column 18
  latin1.write_bytes(b'{"question": "q", "answer": "#### 1"}\n{"question": "Caf\xe9?", '
                     b'"answer": "#### 2"}\n')
  assert error("prepare", "gsm8k", "--out", str(tmp_path / "o"), "--source", f"train={latin1}",
               "--source", f"test={good}") == (
      f"error: {latin1}:2: not UTF-8 text (byte 0xe9 at column 18); save the file as UTF-8")
  latin1 = latin1.with_suffix(".csv")
  latin1.write_bytes(b"question,answer\nq,#### 1\nCaf\xe9,#### 2\n")
  assert error("prepare", "gsm8k", "--out", str(tmp_path / "o"), "--source", f"train={good}",
               "--source", f"test={latin1}") == (
      f"error: {latin1}:3: not UTF-8 text (byte 0xe9 at column 4); save the file as UTF-8")


def test_an_unreachable_source_says_how_to_work_offline(tmp_path):
  """Any failure of datasets to read a source (no network, a moved file) is one DataError
  naming the source and the offline route."""
  gone = prep.Source("json", data_files=str(tmp_path / "moved" / "test.jsonl"))
  with pytest.raises(prep.DataError, match=r"cannot read .*moved/test\.jsonl \(FileNotFoundError"
                                           r".*--source SPLIT=FILE"):
    prep.load_rows(gone, cache_dir=str(tmp_path / "cache"))


def test_a_hub_override_parses():
  assert prep.parse_source("train=qwedsacf/competition_math")[1] == prep.Source(
      "qwedsacf/competition_math", None, "train")
  assert prep.parse_source("test=openai/gsm8k:main")[1] == prep.Source(  # split: the key's
      "openai/gsm8k", "main", "test")
  assert prep.parse_source("test=org/x@validation")[1] == prep.Source("org/x", None, "validation")


def test_weights_and_list_commands(tmp_path, fake_gcs, monkeypatch, capsys):
  """`dllm-rl-data weights SPEC` (what launch/tpu_pod.sh --stage-weights runs on every worker)
  stages the checkpoint and prints the local folder a run will read."""
  monkeypatch.setenv("DLLM_RL_CACHE", str(tmp_path / "cache"))
  with fake_gcs.open("bucket/ckpt/config.json", "wb") as f:
    f.write(b"{}")
  assert cli.main(["weights", "gs://bucket/ckpt"]) == 0
  folder = capsys.readouterr().out.strip()
  assert folder == str(tmp_path / "cache" / "weights" / "gs" / "bucket" / "ckpt")
  assert sorted(os.listdir(folder)) == [".dllm_rl_staged.json", "config.json"]
  assert cli.main(["list"]) == 0
  listed = capsys.readouterr().out.splitlines()
  assert len(listed) == 8 and listed[5].startswith("math500 (task math500): test: HuggingFaceH4")


def test_the_weights_command_offline_does_not_send_the_user_back_to_itself(
    tmp_path, monkeypatch, capsys):
  """`dllm-rl-data weights ID` with HF_HUB_OFFLINE=1 and ID not cached said "Fetch it with
  `dllm-rl-data weights ID`": the command that failed. It names the way to fetch it here and
  the way to bring it from a machine with network."""
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  assert cli.main(["weights", "org/absent"]) == cli.EXIT_ERROR
  err = capsys.readouterr().err
  assert err.startswith("error: 'org/absent' is not a local folder") and err.count("\n") == 1
  assert "with `dllm-rl-data weights org/absent`" not in err, err
  assert "`HF_HUB_OFFLINE=0 dllm-rl-data weights org/absent`" in err, err
  assert "`hf download org/absent --local-dir DIR`, copy DIR here" in err, err
  assert f"models--org--absent folder from there into {tmp_path / 'hub'} here" in err, err


def test_a_missing_local_file_is_not_looked_up_on_the_hub(tmp_path, monkeypatch):
  """data/train.jsonl that does not exist was tried as a hub id (40 s of retries offline,
  then a network error): a data file's extension, a path prefix or an existing parent folder
  make it "does not exist" at once; org/name stays a hub id."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "data").mkdir()
  for missing in ("data/train.jsonl", "data/train", "./train", str(tmp_path / "x.parquet")):
    with pytest.raises(prep.DataError, match=r"does not exist \(a local file"):
      prep.parse_source(f"train={missing}")
  assert prep.parse_source("train=org/name")[1].path == "org/name"


def test_code_sets_become_problems_whose_references_pass_their_own_tests(tmp_path):
  """AceCode rows (question + asserts), HumanEval (the test body, then check(entry_point))
  and MBPP (its paper's prompt; the imports before each assert) → the code task's records;
  the HumanEval and MBPP references pass their cases when run."""
  manifest = prep.prepare("acecode", str(tmp_path / "ace"), sources={
      "train": prep.parse_source("train=" + _jsonl(tmp_path, "ace", ROWS["acecode"]))[1],
      "test": prep.parse_source("test=" + _jsonl(tmp_path, "he", ROWS["humaneval"]))[1]},
      cache_dir=str(tmp_path / "cache"))
  assert _read(tmp_path / "ace" / "train.jsonl") == [
      {"question": "Write add(a, b).", "test_cases": ["assert add(1, 2) == 3",
                                                    "assert add(0, 0) == 0"]}]
  assert manifest["dropped"]["train"] == {"'test_cases' is empty": 1}
  he = _read(tmp_path / "ace" / "test.jsonl")[0]
  assert he["test_cases"] == [ROWS["humaneval"][0]["test"] + "\ncheck(add)"]
  assert "```python\ndef add(a, b):" in he["question"]
  assert manifest["config"][0] == "--config=configs/coupled_grpo.py"
  prep.prepare("mbpp", str(tmp_path / "mbpp"), sources={
      "test": prep.parse_source("test=" + _jsonl(tmp_path, "mb", ROWS["mbpp"]))[1]},
      cache_dir=str(tmp_path / "cache"))
  mb = _read(tmp_path / "mbpp" / "test.jsonl")[0]
  assert mb["question"].startswith("You are an expert Python programmer, and here is your"
                                    " task: Write a function to add two numbers. Your code")
  assert mb["test_cases"] == ["import math\nassert add(1, 2) == 3",
                              "import math\nassert math.isclose(add(0.5, 0.5), 1)"]
  for folder in ("ace", "mbpp"):
    task = make_task("code", test_file=str(tmp_path / folder / "test.jsonl"))
    ex = task.generate("test", -1, seed=0)[0]
    result = task.verify(ex, ex.answer)
    assert result.correct and result.reward == 2.5, result


def test_a_humaneval_case_carries_the_prompts_imports_and_helpers():
  """HumanEval/38-style: the prompt defines a helper the test calls; the official harness runs
  prompt + completion, an instruct completion holds the asked function alone, so the case
  brings the prompt's imports and helpers (not the asked function's stub)."""
  from dllm_rl.data.recipes import code_record
  from dllm_rl.tasks.code import code_result
  prompt = ("import math\n\n\ndef helper(x):\n    return x * 2\n\n\n"
            "def f(x):\n    \"\"\"helper(x) plus one.\"\"\"\n")
  row = {"prompt": prompt, "entry_point": "f", "canonical_solution": "    return helper(x) + 1\n",
         "test": "def check(candidate):\n    assert candidate(1) == 3\n    assert helper(2) == 4\n"}
  case, = code_record(row)["test_cases"]
  assert case.startswith("import math\ndef helper(x):\n    return x * 2\n\n")
  assert "def f(" not in case and case.endswith("check(f)")
  alone = "```python\ndef f(x):\n    return helper(x) + 1\n```\n"  # the function, no helper
  assert code_result(alone, [case], 2.0, 0.5, 5.0).correct


def test_a_file_of_another_code_layout_is_not_converted(tmp_path):
  """`prepare mbpp` given a HumanEval file (and `prepare humaneval` an MBPP one): every row is
  dropped, named by the field it lacks, and the data set is an error, not a converted file."""
  for name, rows, field in (("mbpp", ROWS["humaneval"], "test_list"),
                            ("humaneval", ROWS["mbpp"], "entry_point")):
    source = prep.parse_source("test=" + _jsonl(tmp_path, f"wrong_{name}", rows))[1]
    with pytest.raises(prep.DataError, match=f"not a .* row: no '{field}'"):
      prep.prepare(name, str(tmp_path / name), sources={"test": source},
                   cache_dir=str(tmp_path / "cache"))
    assert not os.path.exists(tmp_path / name / "test.jsonl")


def test_a_surrogate_escape_in_a_json_source_is_named_with_its_record(tmp_path):
  """A .json source (an array, or JSON Lines under that name) holding "\\ud800" was passed to
  datasets, which dropped the character without a word (the .jsonl check read .json files'
  first line only): it is now an error naming the file and the array record (index, line)."""
  good = '{"question": "q", "answer": "#### 1"}'
  bad = '{"question": "q\\ud800", "answer": "#### 1"}'
  (tmp_path / "array.json").write_text(f"[\n  {good},\n  {good}, {bad}\n]\n")
  (tmp_path / "lines.json").write_text(f"{good}\n\n{bad}\n")
  (tmp_path / "fine.json").write_text(f"[{good}, {good}]")
  what = "field 'question' holds an unpaired UTF-16 surrogate \\ud800"
  for name, expected in (("array.json", ": record 2 of its JSON array (line 3): "),
                         ("lines.json", ":3: ")):
    with pytest.raises(prep.DataError) as err:
      prep.load_rows(prep.parse_source(f"train={tmp_path / name}")[1],
                     cache_dir=str(tmp_path / "cache"))
    assert str(err.value).startswith(f"{tmp_path / name}{expected}{what}"), str(err.value)
  prep.check_json_file(str(tmp_path / "fine.json"))


def test_a_bad_local_file_is_named_with_its_line_not_sent_offline(tmp_path):
  """A local --source that datasets cannot read was "cannot read FILE (DatasetGenerationError:
  An error occurred ...); on a machine without network pass the split as a local file" (a
  line that is not JSON, an empty file: StopIteration; a folder that is no save_to_disk one),
  and a gzip file named .jsonl "not UTF-8 text (byte 0x8b ...)": each now says what is wrong
  and where, before datasets reads it."""
  import gzip
  good = '{"question": "q", "answer": "#### 1"}\n'
  src = tmp_path / "src"
  src.mkdir()
  (src / "bad.jsonl").write_text(good + "{question: 2}\n" + good)
  (src / "empty.jsonl").write_text("\n")
  (src / "zipped.jsonl").write_bytes(gzip.compress(good.encode()))
  (src / "rows.jsonl.gz").write_bytes(gzip.compress(good.encode()))
  (src / "surrogate.jsonl").write_text(good + '{"question": "q\\udc80", "answer": "#### 1"}\n')
  cases = {
      "bad.jsonl": ":2: invalid JSON (Expecting property name enclosed in double quotes at"
                   " column 2)",
      "empty.jsonl": ": the file is empty (no rows)",
      "zipped.jsonl": ": gzip-compressed, not JSON Lines text: decompress it (gunzip -k",
      "rows.jsonl.gz": ": gzip-compressed, not JSON Lines text: decompress it (gunzip -k",
      "surrogate.jsonl": ":2: field 'question' holds an unpaired UTF-16 surrogate \\udc80"}
  for name, expected in cases.items():
    source = prep.parse_source(f"train={src / name}")[1]
    with pytest.raises(prep.DataError) as err:
      prep.load_rows(source, cache_dir=str(tmp_path / "cache"))
    assert str(err.value).startswith(f"{src / name}{expected}"), str(err.value)
  with pytest.raises(prep.DataError) as err:  # a folder that datasets cannot load
    prep.load_rows(prep.parse_source(f"train={src}")[1], cache_dir=str(tmp_path / "cache"))
  assert "without network" not in str(err.value) and "save_to_disk folder" in str(err.value)


def test_a_json_lines_source_is_checked_by_its_own_lines(tmp_path):
  """A .json file of JSON Lines was read whole and split by str.splitlines, which also splits
  at a U+2028 / U+0085 inside a string (JSON allows them raw): the record holding one was
  cut in two, neither half JSON, so its surrogate escape passed unnamed (datasets then
  dropped it), and every later line was named one line too far. Lines end at \\n only."""
  sep = '{"question": "a\u2028b\u0085c", "answer": "#### 1"}'
  bad = '{"question": "q\\ud800", "answer": "#### 1"}'
  cut = '{"question": "x\u2028y\\ud800", "answer": "#### 1"}'
  what = "field 'question' holds an unpaired UTF-16 surrogate \\ud800"
  for name, text, line in (("after.json", f"\ufeff{sep}\n{sep}\n{bad}\n", 3),
                           ("inside.json", f"{sep}\n\n{cut}\n", 3)):
    (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(prep.DataError) as err:
      prep.check_json_file(str(tmp_path / name))
    assert str(err.value).startswith(f"{tmp_path / name}:{line}: {what}"), str(err.value)
  (tmp_path / "fine.json").write_text(f"{sep}\n{sep}\n", encoding="utf-8")
  prep.check_json_file(str(tmp_path / "fine.json"))


def test_a_cut_line_reads_the_same_to_prepare_and_to_the_task(tmp_path):
  """A line cut short inside a string (an interrupted copy) was "invalid JSON (Invalid control
  character at at column 40)" to prepare, which parsed the line with its newline, and
  "(Unterminated string starting at at column 22)" to the trainer's task: json's message
  already ends in "at". Both now name the unterminated string and its column once."""
  good = '{"question": "q", "answer": "#### 1"}'
  path = tmp_path / "cut.jsonl"
  path.write_text(f"{good}\n{good[:-5]}\n{good}\n")
  what = f"{path}:2: invalid JSON (Unterminated string starting at column 29)"
  with pytest.raises(prep.DataError) as err:
    prep.load_rows(prep.parse_source(f"train={path}")[1], cache_dir=str(tmp_path / "cache"))
  assert str(err.value) == what
  with pytest.raises(ValueError) as err:
    make_task("gsm8k", train_file=str(path))
  assert str(err.value).endswith(what), str(err.value)


def test_a_key_given_twice_in_a_local_source_is_named_with_its_line(tmp_path):
  """The trainer's JSONL reader refuses an object that gives a key twice (FILE:LINE and the
  key); prepare passed such a .jsonl source to datasets, whose error named neither ("cannot read
  FILE (DatasetGenerationError: An error occurred while generating the dataset)"), and a .json
  array's record kept the key's last value without a word. Both are now named as the reader
  names them: the line, or the array record and its line."""
  good = '{"question": "q", "answer": "#### 1"}'
  twice = '{"question": "q", "answer": "#### 1", "answer": "#### 2"}'
  nested = '{"question": "q", "answer": "#### 1", "meta": {"id": 1, "id": 2}}'
  what = ("duplicate key {!r} in a JSON object (json would keep only its last value):"
          " keep one")
  cases = {"rows.jsonl": (f"{good}\n{twice}\n", ":2: ", "answer"),
           "nested.jsonl": (f"{good}\n\n{nested}\n", ":3: ", "id"),
           "array.json": (f"[\n  {good},\n  {good}, {twice}\n]\n",
                          ": record 2 of its JSON array (line 3): ", "answer"),
           "lines.json": (f"{good}\n{twice}\n", ":2: ", "answer"),
           "object.json": ('{\n  "question": "q",\n  "question": "r"\n}\n',
                           ": its JSON object: ", "question")}
  for name, (text, where, key) in cases.items():
    (tmp_path / name).write_text(text)
    with pytest.raises(prep.DataError) as err:
      prep.load_rows(prep.parse_source(f"train={tmp_path / name}")[1],
                     cache_dir=str(tmp_path / "cache"))
    assert str(err.value) == f"{tmp_path / name}{where}{what.format(key)}"
  with pytest.raises(ValueError) as err:  # the trainer's reader: the same line, the same words
    make_task("gsm8k", train_file=str(tmp_path / "rows.jsonl"))
  assert str(err.value).endswith(f"{tmp_path / 'rows.jsonl'}:2: {what.format('answer')}")
  (tmp_path / "fine.json").write_text(f"[{good},\n{good}]")
  prep.check_json_file(str(tmp_path / "fine.json"))


def test_an_integer_over_pythons_limit_is_named_with_its_line(tmp_path):
  """An integer literal of over 4,300 digits made json raise a bare ValueError (Python's int
  conversion limit) in prepare's pre-read check: "cannot read FILE (ValueError: Exceeds the
  limit ...)", no line, where the trainer's reader says FILE:LINE: invalid JSON value (...).
  prepare names it the same way: the line, or the array record and its line."""
  good = '{"question": "q", "answer": "#### 1"}'
  big = '{"question": "q", "answer": "#### 1", "n": [1, ' + "7" * 4301 + "]}"
  what = ("invalid JSON value (Exceeds the limit (4300 digits) for integer string conversion:"
          " value has 4301 digits")
  cases = {"rows.jsonl": (f"{good}\n\n{big}\n", ":3: "),
           "array.json": (f"[\n  {good},\n  {good}, {big}\n]\n",
                          ": record 2 of its JSON array (line 3): "),
           "lines.json": (f"{good}\n{big}\n", ":2: "),
           "object.json": ('{\n  "question": "q",\n  "n": ' + "7" * 4301 + "\n}\n",
                           ": its JSON object: ")}
  for name, (text, where) in cases.items():
    (tmp_path / name).write_text(text)
    with pytest.raises(prep.DataError) as err:
      prep.load_rows(prep.parse_source(f"train={tmp_path / name}")[1],
                     cache_dir=str(tmp_path / "cache"))
    assert str(err.value).startswith(f"{tmp_path / name}{where}{what}"), str(err.value)
  with pytest.raises(ValueError) as err:  # the trainer's reader: the same line, the same words
    make_task("gsm8k", train_file=str(tmp_path / "rows.jsonl"))
  assert f"{tmp_path / 'rows.jsonl'}:3: {what}" in str(err.value), str(err.value)
  # an array whose long integers are within the limit is read as it is
  (tmp_path / "fine.json").write_text(f"[{good[:-1]}, \"n\": {'7' * 4300}}},\n{good}]")
  prep.check_json_file(str(tmp_path / "fine.json"))


def test_an_acecode_row_is_dropped_naming_the_field_it_lacks():
  """An AceCode row without a usable question or test cases was counted as "no 'question' or
  no non-empty 'test_cases'", whichever it lacked: the reason now names the field and what is
  wrong with it (the question first), one count per reason in the manifest."""
  good = ROWS["acecode"][0]
  rows = [good, {**good, "question": None}, {**good, "question": " "},
          {**good, "test_cases": None}, {**good, "test_cases": "assert f()"},
          {**good, "test_cases": []}, {**good, "test_cases": ["assert f()", " "]},
          {**good, "test_cases": ["assert f()", 3]}, {**good, "test_cases": ["x", " "]},
          {**good, "question": "", "test_cases": []}]
  records, dropped = prep.convert_rows(rows, RECIPES["acecode"], "train")
  assert records == [{"question": good["question"], "test_cases": good["test_cases"]}]
  assert dropped == {"no 'question'": 1, "'question' is empty": 2, "no 'test_cases'": 1,
                     "'test_cases' is str, not a list of text": 1, "'test_cases' is empty": 1,
                     "'test_cases' holds an empty item": 2,
                     "'test_cases' holds an item that is int, not text": 1}


def test_a_humaneval_or_mbpp_row_is_dropped_naming_the_field_it_lacks():
  """HumanEval's "no 'prompt', 'test' or 'entry_point'" and MBPP's "no 'text' / 'prompt' or
  no non-empty 'test_list'" named three and two fields for a row that lacked one: each reason
  now names the one, as AceCode's do."""
  he, mb = ROWS["humaneval"][0], ROWS["mbpp"][0]
  _, dropped = prep.convert_rows([{**he, "test": None}, {**he, "prompt": " "},
                                  {**he, "entry_point": 0}], RECIPES["humaneval"], "test")
  assert dropped == {"no 'test'": 1, "'prompt' is empty": 1, "'entry_point' is int, not text": 1}
  _, dropped = prep.convert_rows([{**mb, "prompt": ""}, {**mb, "test_list": []},
                                  {**mb, "test_list": ["assert 1", None]}], RECIPES["mbpp"],
                                 "test")
  assert dropped == {"no 'text' / 'prompt' (or an empty one)": 1, "'test_list' is empty": 1,
                     "'test_list' holds an item that is NoneType, not text": 1}
