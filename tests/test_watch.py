"""Watching a run: sample completions (samples.jsonl, TensorBoard text, W&B tables), the W&B
writer (offline), the curves of each phase (ratios on a log axis) and the progress bar."""

from __future__ import annotations

import glob
import json
import os
import struct
import time
import types

import numpy as np
import pytest

from dllm_rl.infra import samples as samples_lib
from dllm_rl.infra.observability import MetricsLogger, postfix, read_metrics
from dllm_rl.infra.plots import Panel, curves_figure
from dllm_rl.tasks import CharTokenizer, make_task
from dllm_rl.tasks.data import encode_examples
from dllm_rl.train import evaluation

RECORDS = [{"index": 3, "prompt": "1+2=", "answer": "3", "completion": "3", "parsed": "3",
            "reward": 1.0, "correct": True},
           {"index": 5, "prompt": "```\nfence", "answer": "30", "completion": "x\n  y",
            "parsed": None, "reward": float("nan"), "correct": False}]


class RecordingWriter:
  """A writer (dllm_rl.infra.writers) that records its calls."""

  def __init__(self):
    self.calls = []

  def scalars(self, phase, step, values):
    self.calls.append(("scalars", phase, step, dict(values)))

  def samples(self, phase, step, records):
    self.calls.append(("samples", phase, step, list(records)))

  def flush(self):
    self.calls.append(("flush",))

  def close(self):
    self.calls.append(("close",))


def test_samples_go_to_samples_jsonl_tensorboard_text_and_every_writer(tmp_path):
  writer = RecordingWriter()
  with MetricsLogger(str(tmp_path), writers=[writer]) as logger:
    logger.log(2, {"loss": 0.5, "flag": True, "note": "x"}, phase="sft")
    logger.log_samples(2, RECORDS, phase="sft")
    logger.log_samples(4, [], phase="sft")  # nothing to write
  lines = (tmp_path / "samples.jsonl").read_text().splitlines()
  assert len(lines) == 2
  first, second = map(json.loads, lines)
  assert first == {"phase": "sft", "step": 2, "time": first["time"], **RECORDS[0]}
  assert second["reward"] == "nan" and second["completion"] == "x\n  y"  # strict JSON
  assert writer.calls[0] == ("scalars", "sft", 2, {"loss": 0.5})  # numbers only
  assert writer.calls[1] == ("samples", "sft", 2, RECORDS)
  assert ("close",) not in writer.calls  # its owner closes it; the logger flushes it
  assert writer.calls[-1] == ("flush",)
  (event,) = glob.glob(str(tmp_path / "tb" / "sft" / "events.out.tfevents*"))
  data = open(event, "rb").read()
  assert b"sft/samples" in data and samples_lib.markdown(RECORDS).encode() in data


def test_markdown_shows_each_prompt_and_completion_verbatim_as_code():
  text = samples_lib.markdown(RECORDS)
  first, second = text.split("\n\n---\n\n")
  assert first.startswith("**#3** · reward 1.0 · correct · answer `3` · parsed `3`")
  assert "prompt:\n\n    1+2=\n\ncompletion:\n\n    3" in first
  # A fence in the text cannot end the block: every line is indented code.
  assert "    ```\n    fence" in second and "    x\n      y" in second and "wrong" in second


def test_a_resumed_phase_drops_its_samples_after_the_restored_step(tmp_path):
  with MetricsLogger(str(tmp_path), tensorboard=False) as logger:
    for step in (2, 4):
      logger.log(step, {"loss": 1.0}, phase="sft")
      logger.log_samples(step, RECORDS[:1], phase="sft")
    for step in (2, 4, 6):
      logger.log(step, {"reward": 1.0}, phase="rl")
      logger.log_samples(step, RECORDS[:1], phase="rl")
  with open(tmp_path / "samples.jsonl", "a") as f:
    f.write('{"phase": "rl", "step": 8, "ind')  # cut short by kill -9
  with MetricsLogger(str(tmp_path), tensorboard=False) as logger:  # resumed at rl step 2
    assert logger.supersede("rl", 1, step=2) == 2
    logger.log_samples(4, RECORDS[1:], phase="rl")
  kept = samples_lib.read_samples((tmp_path / "samples.jsonl").read_text())
  assert [(r["phase"], r["step"], r["index"]) for r in kept] == [
      ("sft", 2, 3), ("sft", 4, 3), ("rl", 2, 3), ("rl", 4, 5)]


def _arithmetic_batch(n: int):
  task = make_task("arithmetic", num_digits=1)
  tok = CharTokenizer()
  examples = task.generate("train", n, seed=0)
  arrays = encode_examples(examples, tok, prompt_len=8, completion_len=4)
  return task, tok, examples, arrays


def test_rollout_records_take_the_first_completion_of_each_prompt():
  task, tok, examples, arrays = _arithmetic_batch(3)
  completion = lambda text: tok.encode(text) + [tok.eos_id] * (4 - len(tok.encode(text)))
  right = [completion(ex.answer) for ex in examples]
  completions_BGL = np.array([[right[0], completion("9")],  # prompt 0: member 0 right
                              [completion("x"), right[1]],  # prompt 1: member 0 wrong
                              [right[2], right[2]]])
  correct_BG = np.array([[True, False], [False, True], [True, True]])
  split = evaluation.Split(examples, {k: arrays[k] for k in ("prompt_BP", "prompt_valid_BP")})
  records = evaluation.rollout_records(task, tok, split, completions_BGL, correct_BG,
                                       np.array([40, 7, 12]))
  assert [r["index"] for r in records] == [40, 7, 12]
  assert [r["prompt"] for r in records] == [ex.prompt for ex in examples]
  assert [r["completion"] for r in records] == [examples[0].answer, "x", examples[2].answer]
  assert [(r["reward"], r["correct"]) for r in records] == [(1.0, True), (0.0, False),
                                                           (1.0, True)]
  assert [r["group_accuracy"] for r in records] == [0.5, 0.5, 1.0]


def test_sft_samples_reuse_the_validation_pass_of_the_same_step_else_grade_the_head():
  from dllm_rl.train.phases import Phase
  task, tok, examples, arrays = _arithmetic_batch(5)
  val = evaluation.Split(examples, arrays)
  graded_all = evaluation.verify_each(task, tok, examples, arrays["completion_BL"])
  calls = []

  def grade(params, split):
    calls.append(len(split.examples))
    return graded_all[:len(split.examples)]

  phase = Phase.__new__(Phase)  # the base class's samples(): only ctx and grade are read
  phase.ctx = types.SimpleNamespace(val=val, tokenizer=tok, config=types.SimpleNamespace(
      log=types.SimpleNamespace(num_samples=2)))
  phase.grade, phase.val_graded = grade, (10, graded_all)
  state = types.SimpleNamespace(params=None)
  assert phase.samples(state, 10) == evaluation.generation_records(
      tok, evaluation.head(val, 2), graded_all[:2])
  assert calls == []  # the validation of step 10 is reused
  assert len(phase.samples(state, 12)) == 2 and calls == [2]  # one greedy pass over the head
  assert all(r["correct"] for r in phase.samples(state, 12))


def test_progress_bar_fields():
  fields = (("reward", "reward_mean"), ("acc", "accuracy"), ("gnorm", "grad_norm"),
            ("tok/s", "tokens_per_second"))
  assert postfix({"reward_mean": 0.41234, "accuracy": 0.375, "grad_norm": 12.345,
                  "tokens_per_second": 51234.7}, fields) == {
      "reward": "0.412", "acc": "0.375", "gnorm": "12.3", "tok/s": "51235"}
  assert postfix({"reward_mean": 1.0, "grad_norm": "nan"}, fields) == {"reward": "1",
                                                                      "gnorm": "nan"}


def test_phase_bars_show_reward_accuracy_grad_norm_and_tokens_per_second():
  from dllm_rl.train.rl_loop import RLPhase
  from dllm_rl.train.sft_loop import SFTPhase
  assert [k for _, k in RLPhase.postfix] == ["reward_mean", "accuracy", "grad_norm",
                                             "tokens_per_second"]
  assert {"grad_norm", "tokens_per_second"} <= {k for _, k in SFTPhase.postfix}
  ratio = [p for p in RLPhase.panels if isinstance(p, Panel) and "ratio_max" in p.keys]
  assert len(ratio) == 1 and ratio[0].log
  quantiles = [p for p in RLPhase.panels if isinstance(p, Panel) and "abs_log_ratio_p99" in p.keys]
  assert len(quantiles) == 1 and quantiles[0].log


def test_ratio_panel_on_a_log_axis_spans_1_to_1e12():
  records = [{"phase": "rl", "step": s, "ratio_max": 10.0 ** (2 * s), "ratio_mean": 1.0 + s,
              "reward_mean": 0.1 * s} for s in range(7)]
  records.append({"phase": "rl", "step": 7, "ratio_max": float("inf"), "ratio_mean": 0.0})
  fig = curves_figure(records, ["reward_mean", Panel(("ratio_mean", "ratio_max"), log=True),
                                "missing"], phase="rl")
  reward_ax, ratio_ax = fig.axes
  assert reward_ax.get_yscale() == "linear" and ratio_ax.get_yscale() == "log"
  ys = {line.get_label(): list(line.get_ydata()) for line in ratio_ax.get_lines()}
  assert ys["ratio_max"] == [10.0 ** (2 * s) for s in range(7)]  # inf dropped
  assert ys["ratio_mean"] == [1.0 + s for s in range(7)]  # 0 cannot be drawn on a log axis


def test_wandb_project_without_the_package_is_a_config_error(monkeypatch):
  import importlib.util

  from dllm_rl.config import ConfigError, base_config
  from dllm_rl.train.validate import validate
  c = base_config()
  c.log.wandb_project = "p"
  validate(c)  # installed here
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "wandb" else real(name, *a))
  with pytest.raises(ConfigError) as err:
    validate(c)
  assert str(err.value).startswith("config.log.wandb_project: needs the wandb package")
  assert "dllm-rl[wandb]" in str(err.value)
  c.log.wandb_project = ""
  validate(c)  # off: no package needed


def test_wandb_that_cannot_start_its_run_is_a_config_error(monkeypatch, tmp_path):
  """No API key (W&B online, not logged in): one error naming log.wandb_project and the three
  ways out, not wandb's traceback; another error of the writer is not renamed."""
  import wandb

  from dllm_rl.config import ConfigError, base_config
  from dllm_rl.train.modes import open_writers
  c = base_config()
  c.log.wandb_project = "p"

  def no_key(**kw):
    raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

  monkeypatch.setattr(wandb, "init", no_key)
  with pytest.raises(ConfigError, match=r"^config\.log\.wandb_project: W&B could not start the"
                                        r" run \(UsageError: No API key .*wandb login.*"
                                        r"WANDB_API_KEY.*WANDB_MODE=offline"):
    with open_writers(c, str(tmp_path), enabled=True):
      pass
  monkeypatch.setattr(wandb, "init", lambda **kw: 1 / 0)
  with pytest.raises(ZeroDivisionError):
    with open_writers(c, str(tmp_path), enabled=True):
      pass


# ------------------------------------------------------------------------- W&B offline


def wandb_records(run_dir: str) -> list:
  """The protobuf records of an offline W&B run (its run-*.wandb file: a 7-byte header, then
  32 KiB blocks of records, each with a 7-byte header: crc32, length, kind; a record split
  over blocks is FIRST (2), MIDDLE (3)..., LAST (4); FULL = 1)."""
  from wandb.proto import wandb_internal_pb2 as pb
  (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
  data = open(path, "rb").read()
  assert data[:4] == b":W&B"
  out, buf, pos, block = [], b"", 7, 32768
  while pos + 7 <= len(data):
    if block - pos % block < 7:  # a block's tail too short for a header: padding
      pos += block - pos % block
      continue
    _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    buf += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):
      record = pb.Record()
      record.ParseFromString(buf)
      out.append(record)
      buf = b""
  return out


def wandb_run(workdir) -> dict:
  """The run, history rows, summary and config of the workdir's offline W&B run."""
  (run_dir,) = glob.glob(os.path.join(workdir, "wandb", "offline-run-*"))
  deadline = time.monotonic() + 30
  while True:  # wandb-core may still be writing the file when finish() returns (seen under load)
    records = wandb_records(run_dir)
    kinds = [r.WhichOneof("record_type") for r in records]
    if ("run" in kinds and "exit" in kinds) or time.monotonic() > deadline:
      break
    time.sleep(0.2)
  assert "run" in kinds, f"no run record in the offline run's file: {kinds}"
  run = records[kinds.index("run")].run
  history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
             for r, k in zip(records, kinds) if k == "history"]
  summary = {u.key: json.loads(u.value_json) for r, k in zip(records, kinds) if k == "summary"
             for u in r.summary.update}
  return {"run": run, "history": history, "summary": summary,
          "config": {u.key: json.loads(u.value_json) for u in run.config.update}}


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
  pytest.importorskip("wandb")  # requirements.txt pins it: CI has it
  for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
                     "WANDB_DIR": str(tmp_path), "WANDB_CACHE_DIR": str(tmp_path / "cache"),
                     "WANDB_CONFIG_DIR": str(tmp_path / "config")}.items():
    monkeypatch.setenv(key, value)


def test_wandb_offline_run_holds_the_metrics_samples_config_and_summary(wandb_offline,
                                                                        tmp_path):
  from dllm_rl.infra.writers import WandbWriter
  workdir = tmp_path / "run"
  config = {"mode": "rl", "rl": {"lr": 1e-4, "group_size": 16}}
  writer = WandbWriter.open(str(workdir), project="dllm-test", config=config)
  with MetricsLogger(str(workdir), tensorboard=False, writers=[writer]) as logger:
    logger.log(5, {"loss": 0.25}, phase="sft")
    logger.log(2, {"reward_mean": 0.125, "ratio_max": float("inf")}, phase="rl")
    logger.log_samples(2, RECORDS[:1], phase="rl")
  writer.summary({"rl_accuracy": 0.5, "pass_at_k": {"1": 0.5}, "calibrated_beta": None})
  writer.close()
  run = wandb_run(workdir)
  assert run["run"].project == "dllm-test" and run["run"].display_name == "run"
  assert run["run"].run_id == (workdir / "wandb_run_id").read_text().strip()
  assert run["config"]["rl"] == config["rl"] and run["config"]["mode"] == "rl"
  rows = run["history"]
  assert {"sft/step": 5, "sft/loss": 0.25} in [{k: v for k, v in r.items()
                                                  if not k.startswith("_")} for r in rows]
  (rl,) = [r for r in rows if "rl/reward_mean" in r]
  assert rl["rl/step"] == 2 and rl["rl/reward_mean"] == 0.125
  (table,) = [r for r in rows if "rl/samples/nrows" in r]
  assert table["rl/step"] == 2 and table["rl/samples/nrows"] == 1
  assert table["rl/samples/ncols"] == len(RECORDS[0])
  assert run["summary"]["rl_accuracy"] == 0.5 and "calibrated_beta" not in run["summary"]
  # The same workdir again (a resumed run): the same W&B run id.
  again = WandbWriter.open(str(workdir), project="dllm-test", config=config)
  assert again.run.id == run["run"].run_id
  again.close()


@pytest.mark.slow
def test_a_pipeline_run_writes_samples_curves_and_its_wandb_run(wandb_offline, tmp_path):
  """A tiny pipeline: SFT samples every 2 steps (step 4 from the validation pass), RL samples
  from the rollout batches, sft_curves.png and rl_curves.png, TensorBoard text, and the offline
  W&B run with the metrics.jsonl values, the resolved config and the summary."""
  from dllm_rl.train import modes
  from tests.helpers import tiny_run_config
  config = tiny_run_config("pipeline", {
      "data.batch_size": 32, "sft.steps": 4, "sft.schedule": "constant", "sft.eval_every": 4,
      "sft.log_every": 2, "sft.target_accuracy": 0.0, "checkpoint.save_every": 10,
      "rl.steps": 4, "rl.log_every": 2, "rl.eval_every": 2, "log.samples_every": 2,
      "log.num_samples": 3, "log.wandb_project": "dllm-test"})
  workdir = tmp_path / "w"
  summary = modes.run(config, str(workdir))
  kept = samples_lib.read_samples((workdir / "samples.jsonl").read_text())
  assert [(r["phase"], r["step"]) for r in kept] == (  # RL: at most rl.batch_prompts = 2
      [("sft", 2)] * 3 + [("sft", 4)] * 3 + [("rl", 2)] * 2 + [("rl", 4)] * 2)
  from dllm_rl.train.context import build_context
  ctx = build_context(config, str(workdir / "ctx"))
  for r in kept:
    split = ctx.val if r["phase"] == "sft" else ctx.train
    example = split.examples[r["index"]]
    assert (r["prompt"], r["answer"]) == (example.prompt, example.answer)
    assert r["reward"] == float(r["correct"]) and ("group_accuracy" in r) == (r["phase"] == "rl")
  assert [r["index"] for r in kept[:6]] == [0, 1, 2] * 2  # SFT: the first validation prompts
  for phase in ("sft", "rl"):
    assert summary[f"{phase}_plot"] == str(workdir / f"{phase}_curves.png")
    assert open(summary[f"{phase}_plot"], "rb").read(4) == b"\x89PNG"
  run = wandb_run(workdir)
  metrics = read_metrics(str(workdir), phase="rl")
  logged = [r for r in run["history"] if "rl/reward_mean" in r]
  assert [(r["rl/step"], r["rl/reward_mean"]) for r in logged] == [
      (m["step"], m["reward_mean"]) for m in metrics if "reward_mean" in m]
  assert {k: v for k, v in run["config"].items() if k != "_wandb"} == json.loads(
      config.to_json_best_effort())
  assert run["summary"]["rl_accuracy"] == summary["rl_accuracy"]
