"""Tests for dllm_rl.infra.observability: JSONL records, resume append, NaN round trip, TB,
plots."""

from __future__ import annotations

import json
import math
import os

import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.infra.observability import (MetricsLogger, phase_summary, progress,
                                         read_metrics)
from dllm_rl.infra.plots import plot_metrics


def test_one_json_object_per_log_call(tmp_path):
  with MetricsLogger(str(tmp_path), tensorboard=False) as logger:
    out = logger.log(1, {"loss": jnp.float32(0.5), "acc": np.float64(0.25), "n": jnp.int32(3),
                         "lr": 1e-3, "vec1": jnp.ones((1,))}, phase="sft")
    logger.log(2, {"loss": 0.4}, phase="sft")
    logger.log(1, {"reward": 1.0}, phase="rl")
  assert out["loss"] == 0.5 and type(out["loss"]) is float
  assert out["n"] == 3 and type(out["n"]) is int
  assert out["vec1"] == 1.0
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert len(lines) == 3
  first = json.loads(lines[0])
  assert first["phase"] == "sft" and first["step"] == 1 and isinstance(first["time"], float)
  assert first["acc"] == 0.25
  assert [r["step"] for r in read_metrics(str(tmp_path), phase="sft")] == [1, 2]
  assert read_metrics(str(tmp_path / "metrics.jsonl"), phase="rl")[0]["reward"] == 1.0


def test_bad_metrics_rejected(tmp_path):
  with MetricsLogger(str(tmp_path), tensorboard=False) as logger:
    with pytest.raises(TypeError, match="vec"):
      logger.log(1, {"vec": jnp.ones(3)}, phase="sft")
    with pytest.raises(ValueError, match="reserved"):
      logger.log(1, {"step": 3}, phase="sft")


def test_append_across_loggers(tmp_path):
  with MetricsLogger(str(tmp_path), tensorboard=False) as logger:
    logger.log(1, {"loss": 1.0}, phase="sft")
  with MetricsLogger(str(tmp_path), tensorboard=False) as logger:  # A resumed run.
    logger.log(2, {"loss": 0.5}, phase="sft")
  assert [r["loss"] for r in read_metrics(str(tmp_path))] == [1.0, 0.5]


def test_nonfinite_round_trip_and_strict_json(tmp_path):
  with MetricsLogger(str(tmp_path), tensorboard=False) as logger:
    out = logger.log(1, {"a": jnp.nan, "b": np.inf, "c": -math.inf, "d": 2.0}, phase="rl")
  assert out["a"] == "nan" and out["b"] == "inf" and out["c"] == "-inf"
  line = (tmp_path / "metrics.jsonl").read_text().strip()
  json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
  rec = read_metrics(str(tmp_path))[0]
  assert math.isnan(rec["a"]) and rec["b"] == math.inf and rec["c"] == -math.inf
  assert rec["d"] == 2.0


def test_disabled_logger_writes_nothing(tmp_path):
  logger = MetricsLogger(str(tmp_path / "w"), enabled=False)
  assert logger.log(1, {"loss": 1.0}, phase="sft")["loss"] == 1.0
  logger.close()
  assert not os.path.exists(tmp_path / "w")


def test_tensorboard_event_file(tmp_path):
  with MetricsLogger(str(tmp_path)) as logger:
    logger.log(1, {"loss": 1.0, "x": math.nan}, phase="sft")
    logger.flush()
  files = os.listdir(tmp_path / "tb" / "sft")
  assert any(f.startswith("events.out.tfevents") for f in files)
  assert sum(os.path.getsize(tmp_path / "tb" / "sft" / f) for f in files) > 0


def _tensorboard_events(folder) -> list[list]:
  """Each event file's events (TFRecord: length, its crc, the Event proto, its crc)."""
  from tensorboardX.proto import event_pb2
  files = []
  for name in sorted(os.listdir(folder)):  # TensorBoard's order
    data, events, at = (folder / name).read_bytes(), [], 0
    while at < len(data):
      length = int.from_bytes(data[at:at + 8], "little")
      events.append(event_pb2.Event.FromString(data[at + 12:at + 12 + length]))
      at += 12 + length + 4
    files.append(events)
  return files


def test_a_resumed_phase_purges_its_redone_steps_from_tensorboard_only(tmp_path):
  with MetricsLogger(str(tmp_path)) as logger:
    for step in range(1, 6):
      logger.log(step, {"loss": float(step)}, phase="sft")
      logger.log(step, {"loss": float(step)}, phase="rl")
  with MetricsLogger(str(tmp_path)) as logger:  # RL resumed from its step-3 checkpoint
    logger.supersede("rl", 3, step=3)
    logger.log(4, {"loss": 40.0}, phase="rl")
  sft, rl = (_tensorboard_events(tmp_path / "tb" / phase) for phase in ("sft", "rl"))
  assert len(sft) == 1 and [e.step for e in sft[0] if e.summary.value] == [1, 2, 3, 4, 5]
  first, resumed = rl  # in the order of writing, though both were opened in one second
  assert [e.step for e in first if e.summary.value] == [1, 2, 3, 4, 5]
  # TensorBoard's purge marker: the run's events from step 3 on are dropped when it is read;
  # the kept step-3 record is written again after it.
  marker = [e for e in resumed if e.session_log.status]
  assert [(e.step, e.session_log.status) for e in marker] == [(3, 1)]  # SessionLog.START
  assert [(e.step, e.summary.value[0].simple_value) for e in resumed if e.summary.value] == [
      (3, 3.0), (4, 40.0)]
  assert _as_read(tmp_path / "tb" / "rl") == {"rl/loss": [(1, 1.0), (2, 2.0), (3, 3.0),
                                                          (4, 40.0)]}


def _as_read(folder) -> dict[str, list]:
  """The scalars TensorBoard shows of a run's event files: read in name order, a purge marker
  (SessionLog.START at step s) drops the events read before it from step s on."""
  shown: dict[str, list] = {}
  for event in (e for events in _tensorboard_events(folder) for e in events):
    if event.session_log.status == 1:
      shown = {tag: [(s, v) for s, v in points if s < event.step]
               for tag, points in shown.items()}
    for value in event.summary.value:
      if value.HasField("simple_value"):
        shown.setdefault(value.tag, []).append((event.step, value.simple_value))
  return shown


def test_a_finished_phase_rerun_logs_its_test_figures_once_in_tensorboard(tmp_path):
  """A crash after a finished phase's test line (it follows the last save) and before its
  record: the rerun restores the last step, and metrics.jsonl drops the test line it logs
  again at that step; TensorBoard purged only from the step after, so it showed the test
  point twice. The kept step-4 records and samples are written once again with the marker."""
  sample = {"index": 0, "prompt": "1+1=", "completion": "2", "reward": 1.0, "correct": True}
  with MetricsLogger(str(tmp_path)) as logger:
    for step in (2, 4):
      logger.log(step, {"loss": float(step)}, phase="sft")
      logger.log(step, {"val_accuracy": step / 8}, phase="sft")
    logger.log_samples(4, [sample], phase="sft")
    saved = logger.lines("sft")  # the final save at step 4, then the test evaluation
    logger.log(4, {"test_accuracy": 0.5}, phase="sft")
  with MetricsLogger(str(tmp_path)) as logger:  # the rerun: nothing to train
    assert logger.supersede("sft", saved, step=4) == 1
    logger.log(4, {"test_accuracy": 0.5}, phase="sft")
  assert _as_read(tmp_path / "tb" / "sft") == {
      "sft/loss": [(2, 2.0), (4, 4.0)], "sft/val_accuracy": [(2, 0.25), (4, 0.5)],
      "sft/test_accuracy": [(4, 0.5)]}
  texts = [(e.step, v.tag) for events in _tensorboard_events(tmp_path / "tb" / "sft")
           for e in events for v in e.summary.value if not v.HasField("simple_value")]
  assert texts == [(4, "sft/samples/text_summary")] * 2  # the second after the marker


def test_a_phase_started_again_purges_its_step_0_evaluation_from_tensorboard(tmp_path):
  """No checkpoint (a crash before the first): metrics.jsonl drops all the phase's records,
  and the phase logs its starting evaluation at step 0 again. The purge marker was at step 1,
  so TensorBoard kept the old step-0 point beside the new one (two val points at step 0)."""
  with MetricsLogger(str(tmp_path)) as logger:
    logger.log(0, {"val_accuracy": 0.1}, phase="rl")
    logger.log(1, {"loss": 1.0}, phase="rl")
  with MetricsLogger(str(tmp_path)) as logger:
    assert logger.supersede("rl", 0, step=0) == 2
    logger.log(0, {"val_accuracy": 0.2}, phase="rl")
  _, again = _tensorboard_events(tmp_path / "tb" / "rl")
  assert [(e.step, e.session_log.status) for e in again if e.session_log.status] == [(0, 1)]

def test_plot_metrics(tmp_path):
  with MetricsLogger(str(tmp_path), tensorboard=False) as logger:
    for step in range(5):
      logger.log(step, {"loss": 1.0 / (step + 1)}, phase="sft")
      logger.log(step, {"reward": step * 0.1, "loss": 0.3}, phase="rl")
  out = plot_metrics(str(tmp_path / "metrics.jsonl"), str(tmp_path / "p" / "m.png"),
                     ["loss", "reward", "missing"])
  assert out == str(tmp_path / "p" / "m.png")
  data = open(out, "rb").read()
  assert data.startswith(b"\x89PNG") and len(data) > 1000
  out2 = plot_metrics(str(tmp_path), str(tmp_path / "sft.png"), ["loss"], phase="sft")
  assert os.path.getsize(out2) > 0


def test_phase_summary_format(capsys):
  line = phase_summary("sft", {"step": 600, "loss": jnp.float32(0.41234),
                               "accuracy": 0.3519, "note": "ok"}, 83.24)
  assert line == "[sft] done in 83.2s | step 600 | loss 0.4123 | accuracy 0.3519 | note ok"
  assert capsys.readouterr().out.strip() == line
  # a figure not measured (a resumed run's one step compiles: no step time) is left out, not 0
  line = phase_summary("rl", {"steps": 4, "test_accuracy": 0.5, "step_ms": None}, 3.0)
  assert line == "[rl] done in 3.0s | steps 4 | test_accuracy 0.5"


def test_progress_bar():
  bar = progress(10, desc="sft", initial=4)
  assert bar.n == 4 and bar.total == 10 and not bar.disable and bar.mininterval == 1.0
  bar.update(2)
  assert bar.n == 6
  bar.close()
  assert progress(3, desc="x", disable=True).disable


def test_every_record_reaches_the_os_before_close(tmp_path):
  logger = MetricsLogger(str(tmp_path), tensorboard=False)
  logger.log(1, {"loss": 0.5}, phase="rl")
  logger.log(2, {"loss": 0.4}, phase="rl")
  assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2]  # no close/flush needed
  logger.close()


def test_supersede_drops_the_phase_records_after_the_checkpoint(tmp_path):
  with MetricsLogger(str(tmp_path), tensorboard=False) as logger:
    for step in (10, 20):
      logger.log(step, {"loss": 1.0 / step}, phase="sft")
    for step in (1, 2, 3):
      logger.log(step, {"reward": float(step)}, phase="rl")
    kept_at_checkpoint = 2
    assert logger.lines("rl") == 3 and logger.lines("sft") == 2
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"phase": "rl", "step": 4, "rew')  # cut short by kill -9
  with MetricsLogger(str(tmp_path), tensorboard=False) as logger:  # the resumed run
    assert logger.supersede("rl", kept_at_checkpoint) == 2
    assert logger.lines("rl") == 2
    logger.log(3, {"reward": 30.0}, phase="rl")
  records = read_metrics(str(tmp_path))
  assert [(r["phase"], r["step"]) for r in records] == [("sft", 10), ("sft", 20), ("rl", 1),
                                                         ("rl", 2), ("rl", 3)]
  assert records[-1]["reward"] == 30.0


def test_a_line_cut_short_is_never_glued_to_the_next_record(tmp_path):
  (tmp_path / "metrics.jsonl").write_text('{"phase": "rl", "step": 1}\n{"phase": "rl", "st')
  with MetricsLogger(str(tmp_path), tensorboard=False) as logger:
    logger.log(2, {"reward": 1.0}, phase="rl")
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert json.loads(lines[-1])["step"] == 2


class _FullDisk:
  """A metric writer on a full disk: its flush fails (TensorBoard's, after a checkpoint write
  failed for the same reason)."""

  def scalars(self, phase, step, numbers):
    pass

  def flush(self):
    raise OSError(28, "No space left on device")


def test_a_close_that_fails_during_an_error_leaves_that_error_to_be_seen(tmp_path, capsys):
  """A phase stopped by an error (a checkpoint write that failed on a full disk) closes its
  logger on the way out; the close's own OSError (the same full disk) is said on stderr and
  the phase's error goes on, not replaced by it. Without an error in flight it is raised."""
  with pytest.raises(RuntimeError, match="^saving checkpoint step 12 failed$"):
    with MetricsLogger(str(tmp_path), tensorboard=False, writers=[_FullDisk()]) as logger:
      logger.log(1, {"loss": 1.0}, phase="rl")
      raise RuntimeError("saving checkpoint step 12 failed")
  assert (f"warning: closing {tmp_path}/metrics.jsonl failed too (OSError: [Errno 28] No space"
          " left on device)") in capsys.readouterr().err
  with pytest.raises(OSError, match="No space left"):
    with MetricsLogger(str(tmp_path), tensorboard=False, writers=[_FullDisk()]):
      pass


def test_a_full_disk_at_close_still_shuts_tensorboard_so_nothing_retries_at_exit(tmp_path,
                                                                                monkeypatch):
  """metrics.jsonl's last flush refused (a full disk) does not leave TensorBoard open, and
  TensorBoard's own refused flush still stops its event thread and closes its file: left open,
  tensorboardX's exit hook flushed again and its thread read a queue that exit closed, two
  tracebacks after the run's error line. The first OSError is raised."""
  from tensorboardX import record_writer
  logger = MetricsLogger(str(tmp_path))
  logger.log(1, {"loss": 1.0}, phase="rl")
  events = logger._tensorboard._writers["rl"].file_writer.event_writer
  worker = events._worker

  def full(self):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(logger._metrics, "close", lambda: full(None))
  monkeypatch.setattr(record_writer.RecordWriter, "flush", full)
  with pytest.raises(OSError, match="No space left"):
    logger.close()
  assert events._closed and not worker.is_alive()
  events.close()  # what the exit hook calls: nothing left to flush


# --- throughput, MFU, memory and the profiler window (dllm_rl/train/throughput.py) ---

def test_peak_flops_per_device_from_the_kind_or_the_override():
  from dllm_rl.train.throughput import peak_flops_per_device
  assert peak_flops_per_device("TPU v5 lite") == 197e12
  assert peak_flops_per_device("TPU v5") == peak_flops_per_device("TPU v5p") == 459e12
  assert peak_flops_per_device("TPU v4") == 275e12
  assert peak_flops_per_device("TPU v6 lite") == 918e12
  assert peak_flops_per_device("NVIDIA H100 80GB HBM3") == 989e12
  assert peak_flops_per_device("NVIDIA H200") == 989e12
  assert peak_flops_per_device("NVIDIA A100-SXM4-80GB") == 312e12
  assert peak_flops_per_device("cpu") is None  # unknown: no mfu, never a made-up number
  assert peak_flops_per_device("cpu", override_tflops=2.5) == 2.5e12


class _Device:
  def __init__(self, stats):
    self._stats = stats

  def memory_stats(self):
    return self._stats


def test_memory_metrics_max_over_devices_and_absent_without_stats():
  from dllm_rl.train.throughput import GIB, memory_metrics
  devices = [_Device({"bytes_in_use": GIB, "peak_bytes_in_use": 3 * GIB}),
             _Device({"bytes_in_use": 2 * GIB, "peak_bytes_in_use": 2 * GIB})]
  assert memory_metrics(devices) == {"memory_gib": 2.0, "peak_memory_gib": 3.0}
  assert memory_metrics([_Device(None)]) == {}
  assert memory_metrics() == {}  # the CPU backend reports no memory stats


def test_step_timer_window(monkeypatch):
  import types
  from dllm_rl.train import throughput
  monkeypatch.setattr(throughput, "device_kind", lambda: "TPU v5 lite")
  config = types.SimpleNamespace(log=types.SimpleNamespace(peak_tflops=0.0))
  mesh = types.SimpleNamespace(devices=np.zeros((2, 2)))
  timer = throughput.StepTimer.from_config(config, mesh)
  assert timer.num_devices == 4 and timer.peak_flops == 197e12
  timer.add(2.0, tokens=100, flops=4e14, rollout_seconds=0.5)
  timer.add(1.0, tokens=100, flops=4e14, rollout_seconds=0.5)
  m = timer.metrics(rollout=True)
  assert m["step_seconds"] == 1.5 and m["tokens_per_second"] == pytest.approx(200 / 3)
  assert m["rollout_seconds"] == 0.5 and m["update_seconds"] == 1.0
  assert m["mfu"] == pytest.approx(8e14 / (3.0 * 4 * 197e12))
  assert timer.metrics() == {}  # reset; nothing timed since
  monkeypatch.setattr(throughput, "device_kind", lambda: "cpu")
  timer = throughput.StepTimer.from_config(config, mesh)
  timer.add(1.0, tokens=1, flops=1.0)
  assert "mfu" not in timer.metrics() and timer.peak_flops is None


def test_profile_steps_format():
  from dllm_rl.train.throughput import parse_steps
  assert parse_steps("") is None and parse_steps("2:5") == (2, 5)
  for bad in ("5:2", "0:3", "2:2", "2", "a:b", "2:3:4"):
    with pytest.raises(ValueError, match="a:b"):
      parse_steps(bad)


@pytest.mark.slow
def test_rl_run_logs_throughput_and_mfu_and_writes_a_profile(tmp_path):
  """A tiny pipeline with profile.steps = "2:3" and a peak override: a trace under
  workdir/profile, tokens_per_second on every step line, mfu = FLOPs / (time × devices ×
  peak) with the analytic FLOPs of a step (full sampler schedule: stop_at_eos off)."""
  from dllm_rl.train import flops
  from dllm_rl.train import modes as run
  from dllm_rl.train.context import build_context
  from tests.helpers import tiny_run_config
  c = tiny_run_config("pipeline", {
      "data.batch_size": 32, "sft.steps": 4, "sft.log_every": 2, "sft.eval_every": 0,
      "rl.steps": 4, "rl.log_every": 2, "rl.eval_every": 0, "sampler.stop_at_eos": False,
      "log.tensorboard": False, "profile.steps": "2:3", "log.peak_tflops": 0.5})
  run.run(c, str(tmp_path))
  traces = list((tmp_path / "profile").rglob("*.xplane.pb"))
  assert traces and all(t.stat().st_size > 0 for t in traces)
  ctx = build_context(c, str(tmp_path))
  peak = 0.5e12 * 2  # two devices in the mesh
  rl = [r for r in read_metrics(str(tmp_path), phase="rl") if "reward_mean" in r]
  step_flops = (flops.sampler_flops(ctx.model_cfg, ctx.sampler_cfg, 8, c.data.prompt_len)
                + flops.rl_step_flops(c, ctx.model_cfg))
  assert [r["step"] for r in rl] == [2, 4]
  for r in rl:
    assert r["tokens_per_second"] == pytest.approx(8 * c.data.completion_len / r["step_seconds"])
    assert 0 < r["rollout_seconds"] < r["step_seconds"] and r["update_seconds"] > 0
    assert r["mfu"] == pytest.approx(step_flops / (r["step_seconds"] * peak))
    assert "memory_gib" not in r  # CPU: no memory stats
  # the summary's run-long figures are those of the logged windows: step 1 (compiling) is not
  # timed, so line 2 covers step 2 and line 4 steps 3 and 4
  summary = json.load(open(tmp_path / "summary.json"))
  seconds = rl[0]["step_seconds"] + 2 * rl[1]["step_seconds"]
  rollout_seconds = rl[0]["rollout_seconds"] + 2 * rl[1]["rollout_seconds"]
  assert summary["rl_step_seconds"] == pytest.approx(seconds / 3, rel=1e-9)
  assert summary["rollout_tokens_per_second"] == pytest.approx(
      3 * 8 * c.data.completion_len / rollout_seconds, rel=1e-9)
  sft = [r for r in read_metrics(str(tmp_path), phase="sft") if "loss" in r]
  for r in sft:
    assert r["mfu"] == pytest.approx(flops.sft_step_flops(c, ctx.model_cfg)
                                     / (r["step_seconds"] * peak))
    assert r["tokens_per_second"] == pytest.approx(
        32 * (c.data.prompt_len + c.data.completion_len) / r["step_seconds"])
