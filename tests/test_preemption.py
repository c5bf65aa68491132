"""End to end (tiny): SIGTERM in the middle of RL of the embedded default saves the step in
progress, flushes every metric line and exits 75; the resumed run's summary.json and metrics
equal an uninterrupted run's. NaN rewards skip updates; too many in a row stop the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dllm_rl.train import modes as run
from dllm_rl.infra.observability import read_metrics
from dllm_rl.train.resilience import EXIT_PREEMPTED, NonFiniteError
from tests.helpers import TINY_RUN, cli_flags, tiny_run_config

pytestmark = pytest.mark.slow  # whole runs (see pytest.ini)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The embedded default (no --config), made tiny and short on the command line.
TINY = {**TINY_RUN, "sft.steps": 10, "sft.eval_every": 5, "sft.log_every": 5,
        "sft.target_accuracy": 0.0, "rl.steps": 12, "rl.log_every": 2, "rl.eval_every": 4,
        "checkpoint.save_every": 4}
TIMING = ("seconds", "per_second", "plot", "mfu", "memory_gib")  # differ from run to run


def _command(workdir):
  return [sys.executable, "-m", "dllm_rl.main", f"--workdir={workdir}"] + cli_flags(TINY)


def _env():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("DLLM_FAULT", None)
  return env


def _untimed(summary):
  return {k: v for k, v in summary.items() if not any(t in k for t in TIMING)}


def _records(workdir):
  return [{k: v for k, v in r.items() if k != "time" and not any(t in k for t in TIMING)}
          for r in read_metrics(str(workdir))]


def _first_rl_record_seen(path, proc, deadline):
  while time.time() < deadline and proc.poll() is None:
    if os.path.exists(path) and '"phase": "rl"' in open(path).read():
      return True
    time.sleep(0.05)
  return False


def test_sigterm_mid_rl_saves_flushes_and_resumes_to_the_uninterrupted_result(tmp_path):
  straight, split = tmp_path / "straight", tmp_path / "split"
  ref = subprocess.run(_command(straight), cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=600)
  assert ref.returncode == 0, ref.stderr[-3000:]

  proc = subprocess.Popen(_command(split), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  assert _first_rl_record_seen(split / "metrics.jsonl", proc, time.time() + 600)
  proc.send_signal(signal.SIGTERM)  # RL has begun (its step-0 validation is logged)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == EXIT_PREEMPTED, err[-3000:]
  assert not (split / "summary.json").exists()
  steps = sorted(int(s) for s in os.listdir(split / "checkpoints" / "rl"))
  stopped = steps[-1]
  assert 1 <= stopped < TINY["rl.steps"], steps
  assert f"stopped on request after rl step {stopped}" in err
  meta = json.load(open(split / "checkpoints" / "rl" / str(stopped) / "meta" / "metadata"))
  assert meta["data_position"] == stopped
  # every line of the steps done so far is on disk and equals the uninterrupted run's
  want = [r for r in _records(straight) if r["phase"] == "sft" or r["step"] <= stopped]
  want = [r for r in want if not (r["phase"] == "rl" and r["step"] == stopped
                                  and "test_accuracy" in r)]
  assert _records(split) == want

  again = subprocess.run(_command(split), cwd=ROOT, env=_env(), capture_output=True, text=True,
                         timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"resumed at rollout batch {stopped}" in again.stdout
  assert "[sft] finished at step 10: its summary and test evaluation are read from" in again.stdout
  a = json.load(open(straight / "summary.json"))
  b = json.load(open(split / "summary.json"))
  assert _untimed(a) == _untimed(b)
  # no line lost, none repeated, in order: the finished SFT phase is not evaluated again
  assert _records(split) == _records(straight)


def _config(**rl):
  return tiny_run_config("rl", {**TINY, **{f"rl.{k}": v for k, v in rl.items()}})


def test_nan_rewards_skip_updates_and_too_many_in_a_row_stop_the_run(tmp_path, monkeypatch):
  # all rewards of rollout batches 1, 3 and 4 are NaN: each makes inner_steps=2 updates skip
  monkeypatch.setenv("DLLM_FAULT", "nan@reward:1;nan@reward:3;nan@reward:4")
  c = _config()  # TINY's: the programs of the CLI runs above (rl.steps sets the lr schedule)
  c.mode = "pipeline"
  c.checkpoint.save_every = 1
  c.train.max_consecutive_nonfinite = 3
  with pytest.raises(NonFiniteError, match=r"rl step 5: 4 consecutive .*checkpoint \(step 4\)"):
    run.run(c, str(tmp_path))
  logged = {r["step"]: r["skipped_steps"] for r in read_metrics(str(tmp_path), phase="rl")
            if "skipped_steps" in r}
  assert logged == {2: 2, 4: 4}  # batch 1 skipped, the run went on; batch 3 skipped
  assert max(int(s) for s in os.listdir(tmp_path / "checkpoints" / "rl")) == 4  # last good
  assert not any("tmp" in s for s in os.listdir(tmp_path / "checkpoints" / "rl"))


def test_sft_stop_between_log_steps_resumes_to_the_same_metrics_and_params(tmp_path,
                                                                          monkeypatch):
  """A stop request at SFT step 3 (log every 5): the unlogged window travels in the
  checkpoint, so the resumed run logs step 5 exactly as an uninterrupted run does."""
  from dllm_rl.train import resilience
  from dllm_rl.train.resilience import Preempted

  def sft():  # TINY's sft.steps (10, which sets the lr schedule): the CLI runs' SFT step
    c = _config()
    c.mode, c.sft.eval_every, c.checkpoint.save_every = "sft", 0, 100
    return c

  run.run(sft(), str(tmp_path / "straight"))
  polls = iter(range(1, 100))
  monkeypatch.setattr(resilience, "stop_requested", lambda: next(polls) == 3)
  with pytest.raises(Preempted, match="after sft step 3"):
    run.run(sft(), str(tmp_path / "split"))
  assert os.listdir(tmp_path / "split" / "checkpoints" / "sft") == ["3"]
  monkeypatch.setattr(resilience, "stop_requested", lambda: False)
  run.run(sft(), str(tmp_path / "split"))
  a, b = _records(tmp_path / "straight"), _records(tmp_path / "split")
  assert [r for r in a if "loss" in r] == [r for r in b if "loss" in r] and len(a) == len(b)
  assert _untimed(json.load(open(tmp_path / "straight" / "summary.json"))) == _untimed(
      json.load(open(tmp_path / "split" / "summary.json")))
