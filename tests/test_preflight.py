"""``python -m dllm_rl.config.preflight``: the launchers' config check before any machine."""

import os
import subprocess
import sys

import pytest

from dllm_rl.config.preflight import main, problems

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPU_CONFIG = os.path.join(REPO, "configs", "llada_tpu.py")


def _messages(errors) -> list[str]:
  return [str(e) for e in errors]


def test_mesh_data_must_be_a_multiple_of_the_slices():
  """The data axis alone spans the slices: mesh.data 1 (the TPU config's) or 4 over 3 slices
  is named; 2 or 4 over 2 slices, and any mesh.data on one slice, pass."""
  (msg,) = _messages(problems(TPU_CONFIG, 2, []))
  assert msg.startswith("config.mesh.data: 1 is not a multiple of the 2 slices"), msg
  assert "4 is not a multiple of the 3 slices" in _messages(
      problems(TPU_CONFIG, 3, ["--config.mesh.data=4"]))[0]
  for slices, data in ((2, 2), (2, 4), (1, 1), (1, 3)):
    assert problems(TPU_CONFIG, slices, [f"--config.mesh.data={data}"]) == [], (slices, data)


def test_mesh_data_minus_one_is_left_to_the_workers():
  """-1 takes the devices the other axes leave: only the workers know how many."""
  assert problems(TPU_CONFIG, 2, ["--config.mesh.data=-1", "--config.mesh.fsdp=8"]) == []


def test_every_override_problem_is_named_at_once():
  assert _messages(problems(TPU_CONFIG, 1, ["--config.rl.nosuch=1", "--config.rl.lr=abc",
                                            "--steps=3"])) == [
      "config.overrides: '--steps=3' is neither a --config.KEY=VALUE override nor a flag of"
      " the workers' dllm_rl.main",
      "config.rl.nosuch: unknown key", "config.rl.lr: expected float, got 'abc'"]


def test_the_flags_dllm_rl_main_takes_pass():
  """absl's own flags, which dllm_rl.main takes after the launchers' --, are no problem (before,
  every argument but an override stopped the launch); a bad value of one is named."""
  for flag in (["--alsologtostderr"], ["--verbosity=1"], ["--verbosity", "1"], ["--help"],
               ["--workdir=gs://b/other"]):
    assert problems(TPU_CONFIG, 1, flag) == [], flag
  (msg,) = _messages(problems(TPU_CONFIG, 1, ["--verbosity=abc"]))
  assert msg.startswith("config.overrides: flag --verbosity=abc: invalid literal"), msg
  assert "'extra' is neither" in _messages(problems(TPU_CONFIG, 1, ["extra"]))[0]


def test_absl_s_logging_flags_leave_the_process_s_logging_levels_alone():
  """Checking ``--verbosity=1`` parsed it on a copy of absl's flags, yet put the root logger at
  DEBUG for the rest of the process (JAX's exit then logged to pytest's closed stream), and
  ``--logger_levels`` set the named logger's level."""
  import logging
  named = logging.getLogger("dllm_rl.test_preflight_probe")
  root_level, named_level = logging.root.level, named.level
  for flag in (["--verbosity=1"], ["--logger_levels=dllm_rl.test_preflight_probe:DEBUG"],
               ["--verbosity=-1", "--logger_levels=brand.new.logger:DEBUG"]):
    assert problems(TPU_CONFIG, 1, flag) == [], flag
    assert (logging.root.level, named.level) == (root_level, named_level), flag
    assert logging.getLogger("brand.new.logger").level == logging.NOTSET, flag


def test_main_flags_are_dllm_rl_mains_own():
  """MAIN_FLAGS (the config layer may not import dllm_rl.main) names every flag main defines;
  read in a subprocess: absl's flags are process-global (tests/test_architecture.py)."""
  from dllm_rl.config.preflight import MAIN_FLAGS
  code = ("import dllm_rl.main; from absl import flags;"
          "print(sorted(f.name for f in flags.FLAGS.get_flags_for_module('dllm_rl.main')))")
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       timeout=60)
  assert res.stdout.strip() == str(sorted(MAIN_FLAGS)), (res.stdout, res.stderr)


def test_cli_status_and_messages(tmp_path, capsys):
  assert main([TPU_CONFIG, "2", "--config.mesh.data=2"]) == 0
  broken = tmp_path / "broken.py"
  broken.write_text("def get_config():\n  return 1 / 0\n")
  assert main([str(broken), "1"]) == 2
  assert f"error: --config={broken}, line 2: ZeroDivisionError" in capsys.readouterr().err
  assert main([TPU_CONFIG, "0"]) == 2 and "usage:" in capsys.readouterr().err


def test_runs_as_a_module_without_the_training_stack():
  """What the launchers run: a subprocess that imports neither jax nor flax (fast, and it
  works on a workstation whose venv has no accelerator)."""
  code = ("import sys, runpy; sys.argv = ['preflight', sys.argv[1], '2'];"
          "\ntry: runpy.run_module('dllm_rl.config.preflight', run_name='__main__')"
          "\nexcept SystemExit as e: print('status', e.code)"
          "\nprint(sorted(m for m in ('jax', 'flax') if m in sys.modules))")
  res = subprocess.run([sys.executable, "-c", code, TPU_CONFIG], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
  assert res.stdout.split("\n")[:2] == ["status 2", "[]"], (res.stdout, res.stderr)
  assert "config.mesh.data: 1 is not a multiple of the 2 slices" in res.stderr


def test_a_config_importing_a_package_this_python_lacks_is_not_checked_here(tmp_path, capsys):
  """Status 3 and a note (the launchers go on: the workers check it), not 2 (before, such a
  config stopped the launch); a missing module of dllm_rl's own is still a problem."""
  config = tmp_path / "workers_only.py"
  config.write_text("import numpy\nimport a_package_of_the_workers_only  # noqa\n")
  assert main([str(config), "1"]) == 3  # preflight.EXIT_UNCHECKED
  err = capsys.readouterr().err
  assert err.startswith(f"note: --config={config}, line 2: ModuleNotFoundError: No module named"
                        " 'a_package_of_the_workers_only' (not dllm_rl's"), err
  config.write_text("from dllm_rl.config import no_such_name  # noqa\n")
  assert main([str(config), "1"]) == 2
  assert "error: --config=" in capsys.readouterr().err


def test_help_prints_the_usage_and_succeeds(capsys):
  """``--help`` was read as a missing CONFIG: the usage on stderr with status 2, where every
  other entry point prints it and exits 0."""
  for flag in ("--help", "-h"):
    assert main([flag]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("usage: python -m dllm_rl.config.preflight CONFIG SLICES")
    assert "mesh.data" in out.out and not out.err
  assert main([]) == 2
  assert capsys.readouterr().err.startswith("usage:")


def test_a_setting_the_run_does_not_read_is_warned_with_status_0(capsys):
  """The workers' run says a no-op setting (dllm_rl.config.unread) only once the machines are
  up; the launch check said nothing of it. Now its line, as the run prints it, on stderr and
  status 0 (the launch goes on); none where the config's choices read the key, nor beside a
  problem (status 2: the errors alone)."""
  line = "warning: config.rl.beta_end=4.0 is not read: the steprs advantages' schedule"
  assert main([TPU_CONFIG, "1", "--config.rl.beta_end=4.0"]) == 0
  out = capsys.readouterr()
  assert out.err.splitlines() == [line] and not out.out, out
  assert main([TPU_CONFIG, "1", "--config.rl.advantage=steprs", "--config.rl.beta_end=4.0"]) == 0
  assert not capsys.readouterr().err
  with pytest.raises(SystemExit) as stop:
    main([TPU_CONFIG, "2", "--config.rl.beta_end=4.0"])  # mesh.data 1 over 2 slices
  assert stop.value.code == 2 and "warning:" not in capsys.readouterr().err
