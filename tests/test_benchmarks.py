"""The benchmark command lines (python -m dllm_rl.benchmarks.*): a bad flag is an argparse
error naming it (exit 2) before anything is traced or compiled."""

import importlib
import json
import os

import jax
import pytest

TINY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                    "tiny_cpu.py")


@pytest.mark.parametrize("name, argv, message", [
    ("staircase", ["--lengths", "48", "--block", "32"],
     "--lengths: 48 is not a multiple of --block 32"),
    ("staircase", ["--lengths", "0"], "--lengths must be >= 1, got 0"),
    ("staircase", ["--block", "0"], "--block must be >= 1"),
    ("staircase", ["--repeats", "0"], "--repeats must be >= 1"),
    ("staircase", ["--heads", "3", "--kv-heads", "2"],
     "--heads 3 is not a multiple of --kv-heads 2"),
    ("staircase", ["--impl", "pallas", "--lengths", "32"], "--impl pallas compiles the kernel"),
    ("block_elbo", ["--impl", "pallas", "--lengths", "32"], "--impl pallas compiles the kernel"),
    ("block_elbo", ["--lengths", "50"], "--lengths: 50 is not a multiple of --block 32"),
    ("block_elbo", ["--prompt", "-1"], "--prompt must be >= 0"),
    ("sampler", ["--checkpoint", "/nonexistent/ck", "--gen", "20"], "--gen 20 must be a multiple"),
    ("sampler", ["--checkpoint", "/nonexistent/ck", "--steps", "3"], "--steps 3 a multiple of"),
    ("sampler", ["--checkpoint", "/nonexistent/ck", "--block", "0"], "--block must be >= 1"),
    ("sampler", ["--checkpoint", "/nonexistent/ck", "--gen", "8", "--block", "4", "--steps",
                 "10"], "--steps 10 is 5 steps per block of 4 tokens"),
    ("sampler", ["--checkpoint", "/nonexistent/ck", "--repeats", "0"], "--repeats must be >= 1"),
    ("sampler", ["--checkpoint", "/nonexistent/ck"],
     "--checkpoint /nonexistent/ck: no config.json"),
    ("sampler", [], "give --checkpoint (speed) and/or --accuracy-config"),
    ("sampler", ["--accuracy-config", TINY], "needs --accuracy-workdir"),
    ("rl_step_mfu", ["--steps", "0"], "--steps must be >= 1, got 0"),
    ("rl_step_mfu", ["--d-model", "100", "--heads", "16"], "--d-model 100 is not a multiple"),
    ("scale_out", ["--steps", "0"], "--steps must be >= 1, got 0"),
    ("grouped_matmul", ["--experts", "0"], "--experts must be >= 1, got 0"),
    ("grouped_matmul", ["--tiles", "64", "0"], "--tiles must be >= 1, got 0"),
    ("scale_out", ["--devices", "3"], "--devices 3 must divide the step's 8 prompts"),
])
def test_bad_flag_is_named_before_anything_compiles(monkeypatch, capsys, name, argv, message):
  def compiled(*args, **kwargs):
    raise AssertionError("reached jax.jit: the flag was not checked first")
  monkeypatch.setattr(jax, "jit", compiled)
  # restored afterwards (scale_out appends --devices to it); JAX may start here: keep it as is
  monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
  bench = importlib.import_module(f"dllm_rl.benchmarks.{name}")
  with pytest.raises(SystemExit) as exit_:
    bench.main(argv)
  assert exit_.value.code == 2
  err = " ".join(capsys.readouterr().err.split())
  assert err.startswith(f"usage: python -m dllm_rl.benchmarks.{name}") and message in err, err


def test_rl_step_mfu_divides_the_analytic_model_flops_not_xlas_count():
  """XLA's cost analysis counts the μ inner updates' scan body once (on CPU, μ = 2: 0.6 of
  the model FLOPs), so the MFU must come from the analytic count (dllm_rl/train/flops.py)."""
  from dllm_rl.benchmarks.rl_step_mfu import summary
  line = summary(0.5, 30.0, model_flops=7e12, xla_flops=4e12, peak=100e12, dtype="bfloat16")
  assert "model FLOPs/step 7 TFLOP (analytic) → 14 TFLOP/s" in line
  assert "XLA's count 4 TFLOP (a lower bound" in line
  assert line.endswith("MFU 14.0%")


def test_faults_checks_the_config_and_its_fault_points_before_the_reference_run(
    monkeypatch, capsys):
  """A bad override, or a run too short for the kinds' fault points (no RL checkpoint before
  the last step: an IndexError once the minutes-long reference had run), exits 2 first."""
  from dllm_rl.benchmarks import faults
  def ran(*args, **kwargs):
    raise AssertionError("a run started before the config was checked")
  monkeypatch.setattr(faults, "_run", ran)
  for argv, message in [
      (["--config.rl.stepz=3"], "error: config.rl.stepz: unknown key"),
      (["--kinds", "sigterm checkpoint", "--config.rl.steps=4",
        "--config.checkpoint.save_every=4", "--config.rl.warmup_steps=0"],
       "config.checkpoint.save_every: 4, not below rl.steps 4: sigterm checkpoint need")]:
    with pytest.raises(SystemExit) as exit_:
      faults.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
  assert faults.kind_problems(["sigterm rollout"], 1, 1) == [
      "config.rl.steps: 1; a fault needs a run of at least 2 RL steps"]
  assert faults.kind_problems(list(faults.KINDS), 12, 4) == []


def test_sampler_accuracy_flags_are_checked_before_the_speed_part(tmp_path, capsys):
  """--accuracy-block-lens 3 on an 8-token completion was a traceback from inside the trace
  of the accuracy part, after the speed part (minutes) had run."""
  from dllm_rl.benchmarks import sampler
  base = ["--accuracy-config", TINY, "--accuracy-workdir"]
  for argv, message in [
      ([*base, str(tmp_path), "--accuracy-block-lens", "3"],
       "--accuracy-block-lens: 3 does not divide the config's data.completion_len 8"),
      ([*base, str(tmp_path / "none")], "not a folder"),
      (["--accuracy-config", "configs/none.py", "--accuracy-workdir", str(tmp_path)],
       "--accuracy-config configs/none.py:")]:
    with pytest.raises(SystemExit) as exit_:
      sampler.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err



def test_sampler_accuracy_takes_the_runs_overrides_and_names_a_checkpoint_they_miss(
    tmp_path, monkeypatch, capsys):
  """A run trained with --config.model.* overrides could not be measured: the benchmark took
  no --config words, and the checkpoint's ConfigError ("pass --config.model.d_model=...") came
  as a traceback after the speed part. Its overrides now apply to --accuracy-config, and a
  checkpoint the config does not describe is named with them before anything runs."""
  from dllm_rl.benchmarks import sampler
  from tests.helpers import scratch_run_checkpoints
  scratch_run_checkpoints(tmp_path, {"rl": [2]})  # d_model 64, as configs/tiny_cpu.py
  base = ["--accuracy-config", TINY, "--accuracy-workdir", str(tmp_path)]
  measured = []
  monkeypatch.setattr(sampler, "accuracy", lambda args: measured.append(args.accuracy_cfg))
  for argv, message in [
      ([*base, "--config.model.d_model=32"], "its rl2 checkpoint was trained with"
       " model.d_model=64 (--accuracy-config: 32): pass --config.model.d_model=64"),
      ([*base, "--config.rl.stepz=1"], "config.rl.stepz: unknown key"),
      (["--checkpoint", str(tmp_path), "--config.seed=1"],
       "--config.seed=1: --config.KEY=VALUE overrides apply to --accuracy-config")]:
    with pytest.raises(SystemExit) as exit_:
      sampler.main(argv)
    assert exit_.value.code == 2
    assert message in " ".join(capsys.readouterr().err.split())
  assert not measured
  sampler.main([*base, "--config.eval.batch_size=7"])
  assert [c.eval.batch_size for c in measured] == [7]

def test_sampler_benchmark_counts_the_cache_refreshes():
  """Its own FLOP count ignored ``--cache-refresh`` (dual at refresh 2: half the work):
  the benchmark now uses dllm_rl/train/flops.py's, which counts every refresh forward."""
  from dllm_rl.benchmarks.sampler import call_flops
  from dllm_rl.models.transformer import ModelConfig
  from dllm_rl.sampling.sampler import SamplerConfig
  from dllm_rl.train import flops
  m = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=16,
                  mlp_hidden=64)
  at = lambda refresh: SamplerConfig(completion_len=16, steps=8, block_len=8, cache="dual",
                                     cache_refresh=refresh)
  full = flops.forward_flops(m, 24, head_rows=8, last_rows=8)
  step = flops.forward_flops(m, 8, keys=24)
  assert call_flops(m, at(0), 2, 8) == 2 * 2 * (full + 3 * step)
  assert call_flops(m, at(2), 2, 8) == 2 * 2 * (2 * full + 2 * step)


def test_sampler_init_random_refuses_a_folder_of_other_sizes(tmp_path, monkeypatch, capsys):
  """--init-random into a folder that held another random checkpoint silently measured that
  one (its sizes, not the flags'); now an argparse error naming both, before anything runs.
  The same sizes reuse the folder (written once), and so does an empty one get written."""
  from dllm_rl.benchmarks import sampler
  (tmp_path / "config.json").write_text(json.dumps(
      {"d_model": 64, "n_layers": 2, "n_heads": 4, "mlp_hidden_size": 128, "vocab_size": 256}))
  monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("reached jax.jit"))
  sizes = ["--layers", "2", "--heads", "4", "--mlp", "128", "--vocab", "256"]
  with pytest.raises(SystemExit) as exit_:
    sampler.main(["--checkpoint", str(tmp_path), "--init-random", "--d-model", "128", *sizes])
  assert exit_.value.code == 2
  assert "d_model 64 vs --d-model 128" in " ".join(capsys.readouterr().err.split())
  args = sampler.argparse.Namespace(d_model=64, layers=2, heads=4, mlp=128, vocab=256)
  assert sampler.init_random_problem(str(tmp_path / "new"), args) is None
  (tmp_path / "empty").mkdir()
  assert sampler.init_random_problem(str(tmp_path / "empty"), args) is None


def test_sampler_init_random_refuses_a_folder_whose_weights_were_cut_short(tmp_path):
  """A random checkpoint whose write was cut short (config.json beside missing or truncated
  weights) was reused, and the benchmark then failed on its weights or measured nothing; now
  an argparse-time problem naming the folder. A whole one of the same sizes is reused."""
  from dllm_rl.benchmarks import sampler
  args = sampler.argparse.Namespace(d_model=16, layers=1, heads=2, mlp=32, vocab=64,
                                    init_std=0.02, seed=0)
  sampler.write_random_checkpoint(str(tmp_path), args)
  assert sampler.init_random_problem(str(tmp_path), args) is None
  weights = tmp_path / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[:-100])
  assert "holds config.json but not its whole weights" in sampler.init_random_problem(
      str(tmp_path), args)
  weights.unlink()
  assert "a write was cut short" in sampler.init_random_problem(str(tmp_path), args)


def test_staircase_prints_a_failing_kernel_and_times_the_others(capsys):
  """--impl mosaic_gpu on a CPU host cannot build (it needs a GPU target): its row is the
  error, and the dense reference is still timed with its max error against float32."""
  from dllm_rl.benchmarks import staircase
  staircase.main(["--lengths", "32", "--prompt", "0", "--heads", "1", "--kv-heads", "1",
                  "--head-dim", "16", "--impl", "mosaic_gpu"])
  out = capsys.readouterr().out
  assert "kernel [mosaic_gpu]      FAILED ValueError: impl='mosaic_gpu'" in out
  row = next(line for line in out.splitlines() if "reference (dense mask)" in line).split()
  assert float(row[-1]) < 1e-5 and len(row) == 11, row  # float32: the reference itself


def test_grouped_matmul_times_each_dispatch_against_numpy(capsys):
  """Each dispatch's row (and the tiled one at another tile size): times, memory, compile
  seconds and its error against numpy's expert-by-expert product, float32 rounding only."""
  from dllm_rl.benchmarks import grouped_matmul
  assert grouped_matmul.main(["--rows", "96", "--experts", "4", "--d-model", "16", "--hidden",
                              "8", "--repeats", "1", "--tiles", "8"]) == 0
  lines = capsys.readouterr().out.splitlines()[2:]
  assert [line.split()[0] for line in lines] == ["ragged_dot", "tiled", "tiled[8]"], lines
  rows = {line.split()[0]: line.split() for line in lines}
  assert all(len(r) == 10 and float(r[-1]) < 1e-5 for r in rows.values()), rows


@pytest.mark.parametrize("argv, code, message", [
    (["--help"], 0, None),
    ([], 2, "error: expected SOURCE_DIR CHECKPOINT_DIR THREADS, got 0 argument(s)"),
    (["src", "ckpt", "two"], 2, "error: THREADS must be a positive integer, got 'two'"),
])
def test_official_llada_driver_says_its_usage(monkeypatch, capsys, argv, code, message):
  """`python -m dllm_rl.benchmarks.official_llada_driver --help` (it sits beside the
  benchmarks) was an IndexError traceback; a bad THREADS a ValueError. Both print the usage,
  and a wrong call says what is wrong, before torch is imported."""
  from dllm_rl.benchmarks import official_llada_driver as driver
  monkeypatch.setattr("sys.argv", ["official_llada_driver.py", *argv])
  with pytest.raises(SystemExit) as exit_:
    driver.main()
  assert exit_.value.code == code
  out = capsys.readouterr()
  assert "SOURCE_DIR CHECKPOINT_DIR THREADS" in (out.out if code == 0 else out.err)
  if message:
    assert out.err.rstrip().endswith(message), out.err


@pytest.mark.parametrize("name", ["block_elbo", "faults", "gpu_compile", "grouped_matmul",
                                  "rl_step_mfu", "sampler", "scale_out", "staircase"])
def test_help_describes_the_benchmark_in_its_whole_first_sentence(capsys, name):
  """``--help`` showed the docstring's first line: the sampler's read "... (and the official
  LLaDA ``generate``) on an", its sentence cut where the line wrapped."""
  bench = importlib.import_module(f"dllm_rl.benchmarks.{name}")
  with pytest.raises(SystemExit) as exit_:
    bench.main(["--help"])
  assert exit_.value.code == 0
  first = " ".join(bench.__doc__.split("\n\n")[0].split())
  assert first.endswith(".") and first in " ".join(capsys.readouterr().out.split()), first
