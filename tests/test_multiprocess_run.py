"""``dllm_rl.train.modes.run`` over 2 real processes (jax.distributed on localhost): what one
process does alone must not leave the other waiting in a collective."""

import fcntl
import json
import os

import pytest

from tests import helpers
from tests.multiprocess import harness

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

WORKER = os.path.join(harness.REPO, "tests", "multiprocess", "run_worker.py")
EXPORT_WORKER = os.path.join(harness.REPO, "tests", "multiprocess", "export_worker.py")


def _run(tmp_path, workdir, mode: str, overrides=None):
  (tmp_path / "run.json").write_text(json.dumps(
      {"workdir": str(workdir), "mode": mode, "overrides": overrides or {}}))
  outs, _, codes, report = harness.run_workers(WORKER, tmp_path, out_suffix=".json",
                                               devices=1, timeout=90)
  assert codes == [0, 0], report
  return [json.loads(out.read_text()) for out in outs]


def test_a_locked_workdir_stops_every_process_with_the_error(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  fd = os.open(workdir / ".dllm_rl.lock", os.O_RDWR | os.O_CREAT)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, b"pid 1 on the other run\n")
    # before the fix process 0 stopped alone and process 1 went on to train, waiting for
    # process 0 in its first collective
    outs = _run(tmp_path, workdir, "sft", {"sft.steps": 2})
  finally:
    os.close(fd)
  assert "--workdir" in outs[0]["error"] and "pid 1 on the other run" in outs[0]["error"]
  assert "--workdir" in outs[1]["error"] and "process 0 could not lock it" in outs[1]["error"]
  assert not (workdir / "checkpoints").exists()


def test_mode_eval_of_a_checkpoint_runs_on_every_process(tmp_path):
  workdir = tmp_path / "run"
  helpers.scratch_run_checkpoints(workdir, {"rl": [2]})
  # before the fix process 0 alone opened the checkpoint again for its trained-with note (an
  # Orbax manager: a collective) while process 1 evaluated: both waited forever
  outs = _run(tmp_path, workdir, "eval", {**helpers.LLADA_TINY_MODEL, "eval.num_samples": 1,
                                          "eval.pass_k": (1,), "task.test_size": 4,
                                          "eval.batch_size": 4})
  assert [o["error"] for o in outs] == [None, None]
  assert outs[0]["summary"]["step_label"] == outs[1]["summary"]["step_label"] == "rl2"
  assert outs[0]["summary"]["test_accuracy"] == outs[1]["summary"]["test_accuracy"]
  report = json.loads((workdir / "eval_arithmetic_rl2.json").read_text())
  assert report["test_size"] == 4


def test_sft_with_the_tensor_axis_across_the_processes_matches_one_process(tmp_path):
  """``mesh.tensor = 2`` over 2 processes of one device each: every batch row is replicated on
  both. Each device now takes its rows from the global batch; before, each process passed its
  half (``host_rows``) for the same replicated rows, so the two devices trained on different
  data. The 2-process SFT run's losses equal the 1-process run's on the same 2-device mesh."""
  overrides = {"mesh.tensor": 2, "sft.steps": 4, "sft.eval_every": 0, "sft.log_every": 1}
  outs = _run(tmp_path, tmp_path / "two", "sft", overrides)
  assert [o["error"] for o in outs] == [None, None]
  from dllm_rl.train import modes
  one = modes.run(helpers.tiny_run_config("sft", {**overrides, "mesh.data": 1}),
                  str(tmp_path / "one"))

  def losses(workdir):
    with open(workdir / "metrics.jsonl") as fh:
      return [r["loss"] for r in map(json.loads, fh) if r.get("phase") == "sft" and "loss" in r]

  assert len(losses(tmp_path / "one")) == 4, one
  assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=1e-5)


def test_convert_export_over_two_processes_is_written_once_by_process_0(tmp_path):
  """``convert export --workdir`` started by a 2-process launch (the DLLM_* variables set):
  both processes join jax.distributed, process 0 alone writes the folder, which equals a
  single-process export, and the other says so. Before, convert never initialised
  jax.distributed: each process was a run of its own, and both wrote the whole folder into the
  same place (both exited 0)."""
  from dllm_rl.models import convert
  from dllm_rl.train.export import export_run
  workdir, out = tmp_path / "run", tmp_path / "hf"
  helpers.scratch_run_checkpoints(workdir, {"rl": [3]})
  (tmp_path / "convert.json").write_text(json.dumps(
      ["export", "--workdir", str(workdir), "--hf_dir", str(out)]))
  outs, _, codes, report = harness.run_workers(EXPORT_WORKER, tmp_path, out_suffix=".json",
                                               devices=2, timeout=60)
  assert codes == [0, 0], report
  results = [json.loads(o.read_text()) for o in outs]
  assert [(r["rc"], r["process_count"]) for r in results] == [(0, 2), (0, 2)], report
  assert "export rl3 [llada]: " in results[0]["stdout"] and "MB/s" in results[0]["stdout"]
  assert (f"export rl3 [llada]: process 1 of 2 gathered its shards; process 0 wrote {out}"
          in results[1]["stdout"])
  export_run(str(workdir), str(tmp_path / "one"))  # this process: one process, one device
  assert sorted(os.listdir(out)) == sorted(os.listdir(tmp_path / "one"))
  assert convert.compare_tensors(str(out), str(tmp_path / "one")) == []


def test_a_failed_write_in_process_0_stops_every_process_of_the_export(tmp_path):
  """Process 0 cannot write past 128 KiB (RLIMIT_FSIZE, as a full disk) while writing the
  448 KB model.safetensors, tensor by tensor as they are gathered: it raises its own error
  (its traceback), process 1 an error naming the folder, both at once, and the folder holds
  no config.json (written last), so that nothing takes it for a finished export. Before,
  process 0 stopped alone and process 1 waited for it in the next tensor's gather until the
  launch was killed (here: the 60 s deadline)."""
  workdir, out = tmp_path / "run", tmp_path / "hf"
  helpers.scratch_run_checkpoints(workdir, {"rl": [3]})
  (tmp_path / "convert.json").write_text(json.dumps(
      ["export", "--workdir", str(workdir), "--hf_dir", str(out)]))
  (tmp_path / "file_size_limit.json").write_text(json.dumps({"process": 0, "bytes": 128 << 10}))
  outs, logs, codes, report = harness.run_workers(EXPORT_WORKER, tmp_path, out_suffix=".json",
                                                  devices=2, timeout=60)
  assert codes == [1, 0], report  # process 0: its error raised; process 1: convert's exit 2
  assert "OSError: [Errno 27] File too large" in logs[0].read_text(), report
  assert "f.write(w.reshape" in logs[0].read_text(), report  # its own traceback: the write
  assert not outs[0].exists()
  result = json.loads(outs[1].read_text())
  assert result["rc"] == 2, report
  assert (f"error: --hf_dir: process 0 failed to write the export folder {out} (its own error"
          " says why)" in logs[1].read_text()), report
  assert 0 < os.path.getsize(out / "model.safetensors") <= 128 << 10
  assert sorted(os.listdir(out)) == ["model.safetensors"]  # no config.json: unfinished
