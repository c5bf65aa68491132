"""A finished phase's recorded summary (dllm_rl.train.phase_record): read back only for the
step it evaluated and the config that made it (its unrelated keys aside); an unreadable
record is said and read as none."""

import json

import pytest

from dllm_rl.train import phase_record
from tests.helpers import tiny_run_config

SUMMARY = {"sft_accuracy": 0.25, "sft_steps": 20, "sft_plot": "/w/sft_curves.png"}
UNRELATED = ("mode", "rl")


def _write(tmp_path, config, step=20):
  phase_record.write(str(tmp_path), "sft", step, config, UNRELATED, SUMMARY)


def test_the_record_is_read_back_for_its_step_and_config(tmp_path):
  config = tiny_run_config("sft")
  _write(tmp_path, config)
  assert (tmp_path / "sft_summary.json").exists()
  assert not (tmp_path / "sft_summary.json.tmp").exists()
  assert phase_record.read(str(tmp_path), "sft", 20, config, UNRELATED) == SUMMARY
  assert phase_record.read(str(tmp_path), "sft", 30, config, UNRELATED) is None  # trained on
  assert phase_record.read(str(tmp_path), "sft", None, config, UNRELATED) is None  # no checkpoint
  assert phase_record.read(str(tmp_path), "rl", 20, config, UNRELATED) is None  # another phase


def test_unrelated_keys_are_ignored_and_any_other_change_is_not(tmp_path):
  config = tiny_run_config("sft")
  _write(tmp_path, config)
  later = tiny_run_config("pipeline", {"rl.lr": 3e-3, "rl.steps": 7})  # mode and rl.* only
  assert phase_record.read(str(tmp_path), "sft", 20, later, UNRELATED) == SUMMARY
  for key, value in (("seed", 1), ("sft.lr", 1e-2), ("sampler.steps", 3)):
    other = tiny_run_config("sft", {key: value})
    assert phase_record.read(str(tmp_path), "sft", 20, other, UNRELATED) is None, key
  assert phase_record.read(str(tmp_path), "sft", 20, later, ("mode",)) is None  # rl.* count


def test_the_runs_infrastructure_is_no_change_to_a_finished_phase(tmp_path):
  """A pipeline requeued onto another mesh, with another coordinator, checkpoint cadence,
  writers, profile or compilation cache evaluated its finished SFT phase again (costly at
  scale): none of them changes the checkpoint or what its evaluation computes. A record
  written with those keys in its config (before they were left out) still matches."""
  config = tiny_run_config("sft")
  _write(tmp_path, config)
  moved = tiny_run_config("pipeline", {
      "mesh.data": 2, "mesh.fsdp": 4, "distributed.coordinator_address": "h:1234",
      "checkpoint.save_every": 7, "checkpoint.keep": 1, "log.tensorboard": False,
      "profile.steps": "3", "compilation_cache": "", "train.max_consecutive_nonfinite": 9})
  assert phase_record.read(str(tmp_path), "sft", 20, moved, UNRELATED) == SUMMARY
  record = json.loads((tmp_path / "sft_summary.json").read_text())
  assert "mesh" not in record["config"] and "model" in record["config"]
  record["config"] = json.loads(config.to_json())  # as written before: with every section
  (tmp_path / "sft_summary.json").write_text(json.dumps(record))
  assert phase_record.read(str(tmp_path), "sft", 20, moved, UNRELATED) == SUMMARY
  for key, value in (("eval.batch_size", 3), ("model.dtype", "bfloat16"), ("task.test_size", 9)):
    other = tiny_run_config("sft", {key: value})
    assert phase_record.read(str(tmp_path), "sft", 20, other, UNRELATED) is None, key


def test_an_unreadable_record_is_said_and_read_as_none(tmp_path, capsys):
  config = tiny_run_config("sft")
  (tmp_path / "sft_summary.json").write_text('{"step": 20, "config"')  # cut short
  assert phase_record.read(str(tmp_path), "sft", 20, config, UNRELATED) is None
  err = capsys.readouterr().err
  assert "sft_summary.json: unreadable (JSONDecodeError" in err and "run again" in err
  (tmp_path / "sft_summary.json").write_text(json.dumps({"step": 20}))  # no config, no summary
  assert phase_record.read(str(tmp_path), "sft", 20, config, UNRELATED) is None
  assert "unreadable (KeyError" in capsys.readouterr().err


def test_a_failed_write_is_said_and_the_run_goes_on(tmp_path, capsys):
  missing = tmp_path / "gone"  # a workdir that cannot take the file
  phase_record.write(str(missing), "sft", 20, tiny_run_config("sft"), UNRELATED, SUMMARY)
  err = capsys.readouterr().err
  assert "sft_summary.json: not written (FileNotFoundError" in err and "again" in err


def test_sft_reuses_its_record_across_the_estimator_keys_it_does_not_read(tmp_path, capsys):
  """A pipeline resumed with another estimator.name (or t_eps: SFT's is sft.t_eps) than its
  SFT start ran the SFT test evaluation again, as SFT's unrelated keys were mode and rl only;
  SFT reads estimator.attention_impl alone, which still counts. A record written before (the
  whole estimator section in it) is read back too."""
  from dllm_rl.train.sft_loop import SFTPhase
  keys = SFTPhase.unrelated_keys
  _write(tmp_path, tiny_run_config("sft"))  # the old record: every estimator key in it
  later = tiny_run_config("pipeline", {"estimator.name": "spg_block", "estimator.t_eps": 0.2,
                                       "estimator.num_samples": 3})
  assert phase_record.read(str(tmp_path), "sft", 20, later, keys) == SUMMARY
  phase_record.write(str(tmp_path), "sft", 20, tiny_run_config("sft"), keys, SUMMARY)
  assert phase_record.read(str(tmp_path), "sft", 20, later, keys) == SUMMARY
  dense = tiny_run_config("pipeline", {"estimator.attention_impl": "reference"})
  assert phase_record.read(str(tmp_path), "sft", 20, dense, keys) is None
  assert not capsys.readouterr().err


def test_every_process_looks_for_the_checkpoints_before_any_creates_them(tmp_path, monkeypatch):
  """``run_phase`` meets the other processes at a barrier after looking for the phase's
  checkpoint folder (``_recorded``) and before opening it for writing: a process that looked
  after process 0 had made the folder opened it read-only, and its collectives met process
  0's creating ones (a 2-process SFT run on a fresh workdir stopped with "sync_global_devices
  name mismatch" in CI)."""
  from types import SimpleNamespace

  from dllm_rl.train import phases
  calls = []

  class Stop(Exception):
    pass

  def opened(ctx, name):
    calls.append(("open", name))
    raise Stop

  monkeypatch.setattr(phases, "sync", lambda name: calls.append(("sync", name)))
  monkeypatch.setattr(phases, "available_steps",
                      lambda workdir, name: calls.append(("look", name)) or [])
  monkeypatch.setattr(phases, "open_checkpointer", opened)
  phase_cls = type("P", (), {"name": "sft", "unrelated_keys": (), "__init__": lambda s, c: None})
  with pytest.raises(Stop):
    phases.run_phase(phase_cls, SimpleNamespace(workdir=str(tmp_path), config=None))
  assert [c[0] for c in calls] == ["look", "sync", "open"], calls
