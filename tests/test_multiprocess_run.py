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


def _run(tmp_path, workdir, mode: str, overrides=None):
  (tmp_path / "run.json").write_text(json.dumps(
      {"workdir": str(workdir), "mode": mode, "overrides": overrides or {}}))
  outs, _, codes, report = harness.run_workers(WORKER, tmp_path, out_suffix=".json",
                                               devices=1, timeout=20)
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
