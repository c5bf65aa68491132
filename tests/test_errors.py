"""Every bad input of the issue's list is one line per problem, ``error: <key or file>: ...``,
and exit status 2, through the real entry point (``dllm_rl.main.run``, in-process: absl flags
parsed from ``sys.argv`` as the console script does), before anything compiles."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import sys

import pytest
from absl import flags

from tests.helpers import ROOT, hf_fixture_with_tokenizer
from tests.test_production_configs import _gsm8k

SMALL = ["--config.task.train_size=64", "--config.task.val_size=8", "--config.task.test_size=8"]
GCSFS_MISSING = r"gs:// paths need the gcsfs package, which is not installed: pip install"


def _cases(tmp_path):
  """(name, argv after the program name, the expected stderr lines as regexes)."""
  gsm8k_file = tmp_path / "gsm8k_config.py"  # a config file of the GSM8K task on 40 rows
  gsm8k_file.write_text(
      "from dllm_rl.config import base_config\n\n\ndef get_config():\n"
      "  c = base_config()\n  c.task.name = 'gsm8k'\n"
      f"  c.task.options = {{'train_file': {str(_gsm8k(tmp_path))!r},"
      f" 'test_file': {str(_gsm8k(tmp_path))!r}}}\n"
      "  c.data.batch_size = c.rl.batch_prompts = c.eval.batch_size = 8\n  return c\n")
  gsm8k = [f"--config={gsm8k_file}"]
  w = str(tmp_path / "w")
  stray = tmp_path / "stray" / "checkpoints"  # a run folder whose RL checkpoints are a file
  stray.mkdir(parents=True)
  (stray / "rl").write_text("")
  latin1 = tmp_path / "latin1.jsonl"  # the 40 rows with "Café" in Latin-1 on line 11
  rows = _gsm8k(tmp_path).read_bytes().splitlines(keepends=True)
  latin1.write_bytes(b"".join(rows[:10] + [rows[10].replace(b"What", b"Caf\xe9")] + rows[11:]))
  gz = tmp_path / "train.jsonl.gz"  # the 40 rows, gzip-compressed
  gz.write_bytes(gzip.compress(_gsm8k(tmp_path).read_bytes()))
  parquet = tmp_path / "train.parquet"  # a Parquet file starts and ends with "PAR1"
  parquet.write_bytes(b"PAR1\x15\x04\x15\x80\x01" + bytes(range(256)) + b"PAR1")
  empty = tmp_path / "empty.jsonl"  # was "has only 0 ...: lower it", a size no run takes
  empty.write_text("\n\n")
  array = tmp_path / "array.json"  # the 40 rows as one JSON array, pretty-printed
  array.write_text(json.dumps([json.loads(r) for r in rows], indent=2))
  (tmp_path / "long").mkdir()  # 60 rows, a question of 142 characters on line 58
  lines = _gsm8k(tmp_path / "long", n=60).read_text().splitlines(keepends=True)
  lines[57] = json.dumps({**json.loads(lines[57]),
                          "question": "What is " + "1+" * 66 + "1?"}) + "\n"
  long_prompt = tmp_path / "long" / "long_prompt.jsonl"
  long_prompt.write_text("".join(lines))
  (tmp_path / "longer").mkdir()  # 8 rows, a question of 182 characters on line 3
  rows8 = _gsm8k(tmp_path / "longer", n=8).read_text().splitlines(keepends=True)
  rows8[2] = json.dumps({**json.loads(rows8[2]), "question": "What is " + "1+" * 86 + "1?"}) + "\n"
  longer_test = tmp_path / "longer" / "test.jsonl"
  longer_test.write_text("".join(rows8))
  hf_ok = hf_fixture_with_tokenizer(tmp_path / "hf_ok")  # its chat template: "Q: ...\nA: "
  truncated = hf_fixture_with_tokenizer(tmp_path / "hf")  # an interrupted download
  weights = truncated / "model.safetensors"
  os.truncate(weights, os.path.getsize(weights) // 2)
  narrow = _edited_config(tmp_path / "narrow", d_model=32)  # the weights' d_model is 64
  deeper = _edited_config(tmp_path / "deeper", n_layers=3)  # ... and their layers 2
  cut = hf_fixture_with_tokenizer(tmp_path / "cut")  # config.json cut short
  os.truncate(cut / "config.json", 300)
  hf_eval = [f"--workdir={w}", *gsm8k, *SMALL, "--config.mode=eval",
             "--config.data.prompt_len=32"]  # the prompts fit: the old code went on to load
  return [
      ("data file smaller than train_size", [f"--workdir={w}", *gsm8k,
                                             "--config.task.train_size=30",
                                             "--config.task.val_size=20"],
       [r"error: config\.task\.train_size: .*50.*has only 40.*",  # both splits, at once
        r"error: config\.task\.test_size: .*256.*has only 40.*"]),
      ("mode=rl with neither an SFT nor an HF checkpoint", [f"--workdir={w}",
                                                            "--config.mode=rl", *SMALL],
       [r"error: config\.model\.hf_checkpoint: RL starts from an SFT checkpoint or an HF"
        rf" model: no SFT checkpoint under {re.escape(w)}/checkpoints/sft and no"
        r" model\.hf_checkpoint \(set it, run mode 'sft' .*'pipeline'\)"]),
      ("mode=eval with neither a checkpoint nor an HF model", [f"--workdir={w}",
                                                               "--config.mode=eval", *SMALL],
       [r"error: config\.model\.hf_checkpoint: eval mode needs a checkpoint or an HF model.*"]),
      ("a data file that is not UTF-8", [f"--workdir={w}", *gsm8k,
                                         f"--config.task.options.train_file={latin1}"],
       [rf"error: config\.task\.options: task 'gsm8k': {re.escape(str(latin1))}:11: not UTF-8"
        r" text \(byte 0xe9 at column 18\); save the file as UTF-8"]),
      ("a gzip-compressed data file", [f"--workdir={w}", *gsm8k,
                                       f"--config.task.options.train_file={gz}"],
       [rf"error: config\.task\.options: task 'gsm8k': {re.escape(str(gz))}: gzip-compressed,"
        rf" not JSON Lines text: decompress it \(gunzip -k {re.escape(str(gz))}\) and give the"
        r" decompressed file"]),
      ("a Parquet data file", [f"--workdir={w}", *gsm8k,
                               f"--config.task.options.train_file={parquet}"],
       [rf"error: config\.task\.options: task 'gsm8k': {re.escape(str(parquet))}: a Parquet"
        r" file, not JSON Lines text: convert it to JSON Lines with dllm-rl-data prepare gsm8k"
        rf" --out DIR --source train={re.escape(str(parquet))} \(docs/data\.md\), then give"
        r" DIR/train\.jsonl"]),
      ("a data file that is one JSON array", [f"--workdir={w}", *gsm8k,
                                              f"--config.task.options.train_file={array}"],
       [rf"error: config\.task\.options: task 'gsm8k': {re.escape(str(array))}:1: the file"
        r" starts a JSON array \('\['\), not JSON Lines \(one JSON object per line\): write each"
        rf" object on its own line \(jq -c '\.\[\]' {re.escape(str(array))}\) or convert it"
        rf" with dllm-rl-data prepare gsm8k --out DIR --source train={re.escape(str(array))}"
        r" \(docs/data\.md\), then give DIR/train\.jsonl"]),
      ("an empty data file", [f"--workdir={w}", *gsm8k, f"--config.task.options.test_file={empty}"],
       [r"error: config\.task\.train_size: .*has only 40.*",  # the 40 rows: too few as well
        rf"error: config\.task\.options\.test_file: task 'gsm8k': asked for 256 'test' examples but"
        rf" {re.escape(str(empty))} holds no record: the file is empty \(blank lines at most\);"
        r" give a file with records"]),
      ("a data file that is a directory", [f"--workdir={w}", *gsm8k,
                                           f"--config.task.options.train_file={tmp_path}"],
       [rf"error: config\.task\.options: task 'gsm8k': data file '{re.escape(str(tmp_path))}'"
        r" is a directory, not a file \(give the \.jsonl file in it\)"]),
      ("a prompt longer than data.prompt_len", [f"--workdir={w}", *gsm8k,
                                                f"--config.task.options.train_file={long_prompt}",
                                                f"--config.task.options.test_file={long_prompt}",
                                                f"--config.model.hf_checkpoint={hf_ok}",
                                                "--config.data.prompt_len=24",
                                                "--config.data.completion_len=32",
                                                "--config.task.train_size=52",
                                                "--config.task.val_size=8",
                                                "--config.task.test_size=8"],
       [r"error: config\.data\.prompt_len: (train|validation) split of task 'gsm8k':"
        rf" {re.escape(str(long_prompt))}:58: prompt has 148 tokens > data\.prompt_len=24"
        r" \(prompt 'Q: What is 1\+1\+.*'\); 1 of the \d+ prompts does not fit, this one is"
        r" the longest: data\.prompt_len=148 fits them all"]),
      ("prompts longer than data.prompt_len in two splits",  # each split's fit at once
       [f"--workdir={w}", *gsm8k, f"--config.task.options.train_file={long_prompt}",
        f"--config.task.options.test_file={longer_test}", f"--config.model.hf_checkpoint={hf_ok}",
        "--config.data.prompt_len=24", "--config.data.completion_len=32",
        "--config.task.train_size=52", "--config.task.val_size=8", "--config.task.test_size=8"],
       [r"error: config\.data\.prompt_len: (train|validation) split of task 'gsm8k': .*:58:"
        r" prompt has 148 tokens > .*: data\.prompt_len=148 fits them all",
        rf"error: config\.data\.prompt_len: test split of task 'gsm8k':"
        rf" {re.escape(str(longer_test))}:3: prompt has 188 tokens > .*: data\.prompt_len=188"
        r" fits them all"]),
      ("a JSONL task without model.hf_checkpoint", [f"--workdir={w}", *gsm8k,
                                                    "--config.task.train_size=16",
                                                    "--config.task.val_size=8",
                                                    "--config.task.test_size=8"],
       [r"error: config\.model\.hf_checkpoint: task 'gsm8k' needs a real tokenizer, the one of"
        r" model\.hf_checkpoint \(set it to the model's folder, gs:// URL or hub id\): without"
        r" it the run uses the built-in CharTokenizer, made for the generated tasks, which has"
        rf" no '#' \(the answer of {re.escape(str(_gsm8k(tmp_path)))}:\d+\)"]),
      ("a truncated model.safetensors", [f"--workdir={w}", *gsm8k, *SMALL, "--config.mode=eval",
                                         f"--config.model.hf_checkpoint={truncated}"],
       [rf"error: config\.model\.hf_checkpoint: {re.escape(str(truncated))}/model\.safetensors"
        r" looks truncated or corrupt \(an interrupted download\?\): .*; fetch the file again"]),
      ("config.json of a narrower model than its weights",
       [*hf_eval, f"--config.model.hf_checkpoint={narrow}"],
       [rf"error: config\.model\.hf_checkpoint: tensor 'model\.transformer\.wte\.weight' in"
        rf" {re.escape(str(narrow))}/model\.safetensors has shape \(128, 64\), expected"
        r" \(128, 32\) from config\.json \(config\.json and the weights come from different"
        r" models\?\)"]),
      ("config.json of a deeper model than its weights",
       [*hf_eval, f"--config.model.hf_checkpoint={deeper}"],
       [r"error: config\.model\.hf_checkpoint: tensor 'model\.transformer\.blocks\.2\..*'"
        rf" is missing from {re.escape(str(deeper))}/model\.safetensors \(config\.json and the"
        r" weights come from different models\?\)"]),
      ("a truncated config.json", [*hf_eval, f"--config.model.hf_checkpoint={cut}"],
       [rf"error: config\.model\.hf_checkpoint: {re.escape(str(cut))}/config\.json: not valid"
        r" JSON \(.+\)"]),
      ("gs:// workdir without gcsfs", ["--workdir=gs://bucket/run", *SMALL],
       [rf"error: gs://bucket/run: {GCSFS_MISSING}.*"]),
      ("gs:// data file without gcsfs", [f"--workdir={w}", *gsm8k,
                                         "--config.task.options.train_file=gs://b/train.jsonl",
                                         "--config.task.options.test_file=gs://b/test.jsonl"],
       [rf"error: config\.task\.options: gs://b/(train|test)\.jsonl: {GCSFS_MISSING}.*"]),
      ("llada_tpu.py without its three required values", [f"--workdir={w}",
                                                          "--config=configs/llada_tpu.py"],
       [rf"error: config\.{key}: required value not set \(.*\): pass --config\.{key}=\.\.\."
        for key in ("model.hf_checkpoint", "task.options.test_file",
                    "task.options.train_file")]),
      ("a misspelt key another framework spells out", [f"--workdir={w}",
                                                       "--config.rl.lerning_rate=1e-3"],
       [r"error: config\.rl\.lerning_rate: unknown key; did you mean rl\.lr \(other"
        r" frameworks' 'learning_rate'\)\?"]),
      ("several problems at once", [f"--workdir={w}", "--config.rl.lerning_rate=1e-3",
                                    "--config.seed=-1", "--config.sampler.threshold=1.5"],
       [r"error: config\.rl\.lerning_rate: unknown key.*",
        r"error: config\.sampler\.threshold: must be in \[0, 1\)",
        r"error: config\.seed: must be in \[0, 2\*\*31\), got -1"]),
      ("a nan learning rate", [f"--workdir={w}", "--config.rl.lr=nan"],
       [r"error: config\.rl\.lr: must be finite, got nan"]),
      ("a workdir that is a file", [f"--workdir={_file(tmp_path)}/run", *SMALL],
       [rf"error: --workdir: {re.escape(str(tmp_path))}/a_file/run is not a folder: .*"]),
      ("no workdir", [*SMALL], [r"error: --workdir: required: .*"]),
      ("a phase's checkpoint folder that is a file", [f"--workdir={stray.parent}",
                                                      "--config.mode=rl", *SMALL],
       [rf"error: --workdir: {re.escape(str(stray))}/rl is a file, not a folder: the run keeps"
        r" its checkpoints there .*"]),
      ("a workdir that cannot be created", ["--workdir=/proc/dllm_rl_none/run", *SMALL],
       [r"error: --workdir: /proc/dllm_rl_none/run: cannot create it \(.*\)"]),
      ("a pipeline with no SFT steps and nothing RL could start from",
       [f"--workdir={w}", "--config.sft.steps=0", "--config.sft.warmup_steps=0", *SMALL],
       [rf"error: config\.sft\.steps: 0 in mode=pipeline trains no SFT checkpoint, .* no SFT"
        rf" checkpoint under {re.escape(w)}/checkpoints/sft and no model\.hf_checkpoint .*"]),
      ("a mesh that cannot fill the devices", [f"--workdir={w}", "--config.mesh.tensor=3",
                                               *SMALL],
       [r"error: config\.mesh: \{'data': -1, 'fsdp': 1, 'expert': 1, 'tensor': 3\} cannot"
        r" fill 8 devices \(the other axes' product, 3, does not divide it\)"]),
      ("more prompts per rollout batch than training prompts",
       [f"--workdir={w}", "--config.mode=pipeline", "--config.rl.batch_prompts=128", *SMALL],
       [r"error: config\.rl\.batch_prompts: 128 is larger than task\.train_size = 64: .*"]),
      ("the staircase kernel compiled for CPU", [f"--workdir={w}",
                                                 "--config=configs/tiny_block_cpu.py",
                                                 "--config.estimator.attention_impl=pallas",
                                                 *SMALL],
       [r"error: config\.estimator\.attention_impl: impl='pallas' .*needs a GPU or TPU target;"
        r" on CPU use 'auto' .*"]),
  ]


def _edited_config(where, **changes):
  """The llada_tiny fixture (with its tokenizer) whose config.json has ``changes``."""
  folder = hf_fixture_with_tokenizer(where)
  config = json.loads((folder / "config.json").read_text())
  (folder / "config.json").write_text(json.dumps({**config, **changes}))
  return folder


def _file(tmp_path):
  (tmp_path / "a_file").write_text("")
  return tmp_path / "a_file"


NAMES = ["data file smaller than train_size", "mode=rl with neither an SFT nor an HF checkpoint",
         "mode=eval with neither a checkpoint nor an HF model", "a data file that is not UTF-8",
         "a gzip-compressed data file", "a Parquet data file",
         "a data file that is one JSON array", "an empty data file",
         "a data file that is a directory", "a prompt longer than data.prompt_len",
         "prompts longer than data.prompt_len in two splits",
         "a JSONL task without model.hf_checkpoint", "a truncated model.safetensors",
         "config.json of a narrower model than its weights",
         "config.json of a deeper model than its weights", "a truncated config.json",
         "gs:// workdir without gcsfs",
         "gs:// data file without gcsfs", "llada_tpu.py without its three required values",
         "a misspelt key another framework spells out", "several problems at once",
         "a nan learning rate", "a workdir that is a file", "no workdir",
         "a phase's checkpoint folder that is a file",
         "a workdir that cannot be created",
         "a pipeline with no SFT steps and nothing RL could start from",
         "a mesh that cannot fill the devices",
         "more prompts per rollout batch than training prompts",
         "the staircase kernel compiled for CPU"]


def _run_main(argv, monkeypatch):
  """``dllm-rl ARGV`` in this process: the exit status."""
  from dllm_rl import main as entry
  flags.FLAGS.unparse_flags()  # the flags of an earlier call in this process
  monkeypatch.setattr(sys, "argv", ["dllm-rl", *argv])
  with pytest.raises(SystemExit) as stop:
    entry.run()
  return stop.value.code


@pytest.mark.parametrize("name", NAMES)
def test_each_bad_input_is_one_error_line_per_problem_and_exit_2(name, tmp_path, monkeypatch,
                                                                 capsys):
  cases = {n: (argv, expected) for n, argv, expected in _cases(tmp_path)}
  assert sorted(cases) == sorted(NAMES)
  argv, expected = cases[name]
  monkeypatch.chdir(ROOT)  # config files are given relative to the checkout
  real = importlib.util.find_spec  # gcsfs absent whatever this machine has
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda mod, *a: None if mod == "gcsfs" else real(mod, *a))
  code = _run_main(argv, monkeypatch)
  err = capsys.readouterr().err
  assert code == 2, (name, err)
  assert "Traceback" not in err, name
  lines = [line for line in err.splitlines() if line.startswith("error:")]
  assert len(lines) == len(expected), (name, err)
  for line, pattern in zip(lines, expected):
    assert re.fullmatch(pattern, line), (name, line)
  assert not os.path.exists(tmp_path / "w" / "checkpoints"), name  # nothing trained


def test_a_local_hf_checkpoint_without_config_json_is_named_before_the_workdir_is_made(
    tmp_path, monkeypatch, capsys):
  """A run's --workdir (or a path that does not exist) given as model.hf_checkpoint: the error
  names it and the new --workdir is not created (it was, empty, before the error)."""
  (tmp_path / "run" / "checkpoints" / "sft").mkdir(parents=True)
  for source, said in ((tmp_path / "run", "is a training run's --workdir: export its"),
                       (tmp_path / "none", "does not exist")):
    code = _run_main([f"--workdir={tmp_path / 'new'}",
                      f"--config.model.hf_checkpoint={source}"], monkeypatch)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: config.model.hf_checkpoint: ") and said in err
    assert not (tmp_path / "new").exists(), source


def test_distributed_settings_the_config_shows_wrong_are_said_with_the_other_errors(
    tmp_path, monkeypatch, capsys):
  """``--config.distributed.*`` values wrong in the config itself (a port out of range, a
  process id past the count) are config errors, listed with the others before initialize()
  runs or the workdir is made; they once came one at a time from initialize(), after
  validation had passed, and an out-of-range port reached jax.distributed."""
  from dllm_rl.parallel import distributed
  monkeypatch.setattr(distributed, "initialize", lambda *a, **k: pytest.fail("initialized"))
  w = tmp_path / "w"
  code = _run_main([f"--workdir={w}", "--config.seed=-1",
                    "--config.distributed.coordinator_address=node-a:70000",
                    "--config.distributed.num_processes=2", "--config.distributed.process_id=2"],
                   monkeypatch)
  err = capsys.readouterr().err
  assert code == 2 and "Traceback" not in err, err
  assert err.splitlines() == [
      "error: config.distributed.coordinator_address: port 70000 of 'node-a:70000' is not in"
      " 1..65535",
      "error: config.distributed.process_id: must be in [0, num_processes=2) (-1 = from env"
      " DLLM_PROCESS_ID), got 2",
      "error: config.seed: must be in [0, 2**31), got -1"], err
  assert not w.exists()


def test_only_a_task_read_from_files_is_told_to_set_model_hf_checkpoint(tmp_path):
  """The CharTokenizer serves the generated tasks: their text (and a character that is not in
  it, such as one of data.system_prompt) keeps the tokenizer's own message; a JSONL task whose
  text it cannot encode is told to set model.hf_checkpoint, naming the file and line; one whose
  text it can encode (Countdown's) runs."""
  from dllm_rl.tasks import CharTokenizer, Example, make_task
  from dllm_rl.train.context import char_tokenizer_problem
  tok = CharTokenizer()
  foreign = [Example("1+1=", "2 ✓", source="f.jsonl:7")]
  assert char_tokenizer_problem(make_task("arithmetic"), tok, foreign) is None
  gsm8k = make_task("gsm8k", train_file=str(_gsm8k(tmp_path)))
  assert re.search(r"needs a real tokenizer.* no '✓' \(the answer of f\.jsonl:7\)$",
                   char_tokenizer_problem(gsm8k, tok, foreign))
  assert char_tokenizer_problem(gsm8k, tok, [Example("1+1=", "2")]) is None


@pytest.mark.parametrize("overrides, pattern", [
    ([("task.name", "gsm8kk")], r"config\.task\.name: unknown task 'gsm8kk'.*"),
    ([("task.options.num_digitz", "2")],
     r"config\.task\.options: task 'arithmetic' got unknown option\(s\) \['num_digitz'\];"
     r" accepted:.*"),
    ([("rl.lerning_rate", "1e-3")], r"config\.rl\.lerning_rate: unknown key; did you mean rl\.lr"
                                    r" \(other frameworks' 'learning_rate'\)\?"),
])
def test_plan_overrides_with_a_typo_are_one_error_line_and_exit_2(overrides, pattern, capsys):
  """``dllm-rl-plan``'s config path (cli.load with planner.validated, as its main calls it;
  its absl flags clash with dllm_rl.main's in one process, so its own CLI is run as a
  subprocess in tests/test_cli.py): the plan swaps the task for arithmetic, yet a typo in the
  task's name or options is still reported."""
  from dllm_rl.config import cli
  from dllm_rl.planning import planner
  with pytest.raises(SystemExit) as stop:
    cli.load(os.path.join(ROOT, "configs", "tiny_cpu.py"), overrides, check=planner.validated)
  err = capsys.readouterr().err.splitlines()
  assert stop.value.code == 2 and len(err) == 1, err
  assert re.fullmatch("error: " + pattern, err[0]), err[0]


def test_a_workdir_without_write_rights_is_named_before_anything_runs(tmp_path, monkeypatch,
                                                                      capsys):
  """An existing --workdir in which no file can be created (another user's folder, a
  read-only mount; simulated, since root may write anywhere) is one ``error: --workdir:``
  line and exit status 2, not a PermissionError traceback at the run's first write."""
  import builtins
  import errno
  w = tmp_path / "w"
  w.mkdir()

  def refuse(real):
    def opener(path, *args, **kwargs):
      if isinstance(path, (str, os.PathLike)) and os.fspath(path).startswith(str(w)):
        raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
      return real(path, *args, **kwargs)
    return opener

  monkeypatch.setattr(builtins, "open", refuse(builtins.open))
  monkeypatch.setattr(os, "open", refuse(os.open))
  code = _run_main([f"--workdir={w}", *SMALL], monkeypatch)
  err = capsys.readouterr().err
  assert code == 2 and "Traceback" not in err, err
  assert re.search(rf"^error: --workdir: {re.escape(str(w))}: cannot write in it \(.*Permission"
                   " denied", err, re.M), err
  assert os.listdir(w) == []


def test_a_workdir_in_use_by_another_training_run_is_named_and_left_alone(tmp_path,
                                                                          monkeypatch, capsys):
  """The same training command given twice on one folder (or a requeue while the first still
  runs): the second is one ``error: --workdir:`` line naming the holder, exit status 2, and
  writes nothing there; it reads no task data first (the lock was once taken after
  build_context had generated the splits and loaded the HF source); the first run's lock is
  released at its end, so a rerun works."""
  import fcntl

  from dllm_rl.train import context
  real_generate = context._generate
  generated = []
  monkeypatch.setattr(context, "_generate", lambda *a: generated.append(a[1]) or real_generate(*a))
  w = tmp_path / "w"
  w.mkdir()
  argv = [f"--workdir={w}", *SMALL, "--config.mode=sft", "--config.sft.steps=1",
          "--config.sft.warmup_steps=0"]
  with open(w / ".dllm_rl.lock", "w") as held:  # the first run, in another process
    held.write("pid 4242 on node7, since 2026-01-01 00:00:00\n")
    held.flush()
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    code = _run_main(argv, monkeypatch)
  err = capsys.readouterr().err
  assert code == 2 and "Traceback" not in err, err
  assert re.search(rf"^error: --workdir: {re.escape(str(w))} is in use by another training run"
                   r" \(pid 4242 on node7, since 2026-01-01 00:00:00\): ", err, re.M), err
  assert sorted(os.listdir(w)) == [".dllm_rl.lock"] and generated == []
  from dllm_rl.train.modes import workdir_lock
  for _ in range(2):  # the lock ends with its run: the next run in this process takes it
    with workdir_lock(str(w), enabled=True):
      assert "pid" in (w / ".dllm_rl.lock").read_text()


def test_a_write_the_full_disk_refuses_outside_a_checkpoint_is_one_error_line(tmp_path,
                                                                              monkeypatch,
                                                                              capsys):
  """A full disk met by a metrics line, TensorBoard's flush, the curves or a summary (the
  checkpoint's own write names its step): exit 1 and one ``error:`` line saying what stands
  and that a rerun resumes, not a traceback. Another OSError keeps its traceback."""
  import errno

  full = OSError(errno.ENOSPC, "No space left on device", f"{tmp_path}/metrics.jsonl")
  code, err = _main_raising(full, tmp_path, monkeypatch, capsys)
  assert code == 1 and "Traceback" not in err, err
  assert [line for line in err.splitlines() if line.startswith("error:")] == [
      f"error: a write failed ([Errno 28] No space left on device: '{tmp_path}/metrics.jsonl');"
      " the checkpoints committed before it stand: free space or fix the folder's rights, then"
      " rerun the same command to resume from the newest"]
  with pytest.raises(OSError, match="Input/output error"):
    _main_raising(OSError(errno.EIO, "Input/output error"), tmp_path, monkeypatch, capsys)
  raised_after = OSError(errno.EIO, "Input/output error")  # its own errno decides, not its cause's
  raised_after.__cause__ = full
  with pytest.raises(OSError, match="Input/output error"):
    _main_raising(raised_after, tmp_path, monkeypatch, capsys)


def _main_raising(err: OSError, workdir, monkeypatch, capsys) -> tuple[int, str]:
  """(exit status, stderr) of dllm_rl.main on ``workdir`` whose run raises ``err`` (an error
  main does not turn into a status propagates)."""
  from dllm_rl.train import modes

  def run(config, workdir, **kwargs):
    raise err

  monkeypatch.setattr(modes, "run", run)
  code = _run_main([f"--workdir={workdir}", *SMALL], monkeypatch)
  return code, capsys.readouterr().err


def test_a_write_refused_for_want_of_rights_in_the_workdir_is_one_error_line(tmp_path,
                                                                           monkeypatch,
                                                                           capsys):
  """A file of the workdir whose write the folder's rights refuse mid-run (EACCES, EPERM: a
  folder chmod-ed, another user's file) is the same one ``error: a write failed`` line and exit
  1 as a full disk; a file outside the workdir (an input) keeps its traceback."""
  import errno

  def refused(path):
    return PermissionError(errno.EACCES, "Permission denied", os.fspath(path))

  denied = tmp_path / "w" / "tb" / "rl" / "events.out"
  code, err = _main_raising(refused(denied), tmp_path / "w", monkeypatch, capsys)
  assert code == 1 and "Traceback" not in err, err
  assert [line for line in err.splitlines() if line.startswith("error:")] == [
      f"error: a write failed ([Errno 13] Permission denied: '{denied}'); the checkpoints"
      " committed before it stand: free space or fix the folder's rights, then rerun the same"
      " command to resume from the newest"]
  beside = tmp_path / "data" / "train.jsonl"  # beside the workdir: not one of its writes
  with pytest.raises(PermissionError):
    _main_raising(refused(beside), tmp_path / "w", monkeypatch, capsys)
