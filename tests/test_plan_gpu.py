"""The planner's GPU topologies (h100-N / h200-N): compile-only CUDA devices from JAX's CUDA
plugin (dllm_rl.parallel.gpu_target), named, refused with the fix where the plugin is missing
or JAX_PLATFORMS is not cpu, and (where the plugin is installed) a real plan on h100-2."""

import json
import os
import subprocess
import sys

import jax
import pytest

from dllm_rl.parallel import gpu_target, topology
from tests.helpers import fresh_jax_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "llada_tiny")
TINY_RL = ["--config.mesh.data=1", "--config.mesh.fsdp=-1",
           "--config.rl.batch_prompts=4", "--config.rl.group_size=2",
           "--config.data.prompt_len=8", "--config.data.completion_len=8",
           "--config.sampler.steps=1", "--config.sampler.block_len=8",
           "--config.estimator.spg_block_len=8", "--config.eval.batch_size=4",
           "--config.estimator.num_samples=1", "--config.rl.inner_steps=1"]


def _plan(*flags, env=None):
  return subprocess.run([sys.executable, "-m", "dllm_rl.plan",
                         f"--config={ROOT}/configs/llada_tpu.py",
                         f"--config.model.hf_checkpoint={FIXTURE}", *TINY_RL, *flags],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_gpu_topology_names():
  assert topology.gpu_topology_name("h100-8") == ("h100", "1x1x8")
  assert topology.gpu_topology_name("h100-1") == ("h100", "1x1x1")
  assert topology.gpu_topology_name("h200-2") == ("h200", "1x1x2")
  assert topology.gpu_topology_name("h200-16") == ("h200", "1x2x8")  # 2 hosts of 8
  for name in ("v5p-8", "cpu:8", "a100-8", "h100:8"):
    assert topology.gpu_topology_name(name) is None, name
  for name in ("h100-12", "h100-0"):
    with pytest.raises(ValueError, match=f"topology '{name}': h100-N needs N from 1 to 8"):
      topology.gpu_topology_name(name)


def test_gpu_facts_give_the_budgets():
  assert gpu_target.GPUS["h100"]["memory_bytes"] == 80 * 10**9
  assert gpu_target.GPUS["h200"]["memory_bytes"] == 141 * 10**9
  assert gpu_target.GPUS["h100"]["peak_bf16_flops"] == gpu_target.GPUS["h200"]["peak_bf16_flops"]
  assert gpu_target.GPUS["h200"]["peak_bf16_flops"] == 989e12


def test_no_plugin_is_named_before_any_compile(monkeypatch):
  monkeypatch.setattr(gpu_target, "plugin_found", lambda: False)
  monkeypatch.setattr(gpu_target, "cuda_topology_desc",
                      lambda *a: pytest.fail("asked the plugin for a topology"))
  with pytest.raises(ValueError) as err:
    topology.get_topology("h100-8")
  assert str(err.value).startswith("--topology=h100-8: no CUDA plugin")
  assert f'pip install "jax[cuda12]=={jax.__version__}"' in str(err.value)


def test_jax_platforms_other_than_cpu_is_named(monkeypatch):
  monkeypatch.setattr(gpu_target, "plugin_found", lambda: True)
  monkeypatch.setattr(gpu_target, "cuda_topology_desc",
                      lambda *a: pytest.fail("asked the plugin for a topology"))
  before = jax.config.jax_platforms
  jax.config.update("jax_platforms", "cuda,cpu")  # this process's backends are already up
  try:
    with pytest.raises(ValueError, match=r"--topology=h200-2: JAX_PLATFORMS is 'cuda,cpu': "
                       "run with JAX_PLATFORMS=cpu"):
      topology.get_topology("h200-2")
  finally:
    jax.config.update("jax_platforms", before)


def test_plan_sets_jax_platforms_to_cpu_for_a_gpu_topology(monkeypatch):
  """The planner forces cpu for h100-N (the plugin's topology exists only then) and, for other
  topologies, only fills it in when unset; JAX is imported by then, so its config too. (Not
  through dllm_rl.plan: importing it defines absl flags that dllm_rl.main defines too.)"""
  before = jax.config.jax_platforms
  try:
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    jax.config.update("jax_platforms", "cuda")
    topology.compile_on_cpu(force=False)
    assert os.environ["JAX_PLATFORMS"] == "cuda" and jax.config.jax_platforms == "cuda"
    topology.compile_on_cpu(force=True)
    assert os.environ["JAX_PLATFORMS"] == "cpu" and jax.config.jax_platforms == "cpu"
    monkeypatch.delenv("JAX_PLATFORMS")
    jax.config.update("jax_platforms", None)
    topology.compile_on_cpu(force=False)
    assert os.environ["JAX_PLATFORMS"] == "cpu" and jax.config.jax_platforms == "cpu"
  finally:
    jax.config.update("jax_platforms", before)


@pytest.mark.skipif(gpu_target.plugin_found(), reason="the CUDA plugin is installed")
def test_plan_cli_without_the_plugin_exits_2_naming_the_install():
  run = _plan("--topology=h100-2", "--programs=rl_step")
  assert run.returncode == 2, run.stderr[-2000:]
  assert "error: --topology=h100-2: no CUDA plugin" in run.stderr
  assert f'pip install "jax[cuda12]=={jax.__version__}"' in run.stderr


def test_plan_cli_names_a_bad_gpu_count():
  run = _plan("--topology=h100-12")
  assert run.returncode == 2 and "--topology" in run.stderr and "h100-N needs N" in run.stderr


@pytest.mark.slow  # a subprocess: ~25 s of GPU compiles on 2 cores
@pytest.mark.skipif(not gpu_target.plugin_found(), reason="JAX's CUDA plugin is not installed: "
                    'pip install "jax[cuda12]==<this jax version>" (no GPU needed)')
def test_plan_for_two_absent_h100s(tmp_path):
  """The real thing, in a fresh process with JAX_PLATFORMS unset (plan.py sets it): rl_step
  compiled by XLA's GPU compiler for 2 compile-only H100s, not an estimate, and the FSDP
  halves of the fixture's fp32 params + Adam moments are per-device arguments."""
  env = fresh_jax_env()
  out = tmp_path / "plan.json"
  run = _plan("--topology=h100-2", "--programs=rl_step", f"--json={out}", env=env)
  assert run.returncode == 0, run.stderr[-3000:]
  assert "topology h100-2: 2 devices (2 chips), 74.5 GiB and 989 TFLOP/s" in run.stdout
  assert "ESTIMATE" not in run.stdout
  result = json.loads(out.read_text())
  assert (result["devices"], result["estimate"], result["hbm_bytes_per_device"]) == (
      2, False, 80 * 10**9)
  step = result["programs"]["rl_step"]
  assert 0 < step["argument_bytes"] < step["peak_bytes_per_device"] < 2**30
