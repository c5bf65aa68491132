"""The memory planner (python -m dllm_rl.plan): every program of a run compiled ahead of
time from abstract shapes, at tiny size, on cpu:8 and on a small TPU topology (libtpu,
no TPU); a config that cannot fit exits 3 naming the program."""

import json
import os
import subprocess
import sys

import pytest

from dllm_rl.train import flops

from dllm_rl.planning import planner as plan

from dllm_rl.parallel import topology
from dllm_rl.config import ConfigError, load_config_file
from dllm_rl.planning.programs import model_and_tokens

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "llada_tiny")


def _config(name="tiny_cpu.py", **model):
  c = load_config_file(os.path.join(ROOT, "configs", name))
  for k, v in model.items():
    c.model[k] = v
  return c


def _hf_llada_dir(tmp_path, **overrides):
  """An HF folder holding only config.json (the planner reads no weights)."""
  cfg = json.load(open(os.path.join(FIXTURE, "config.json")))
  cfg.update(overrides)
  d = tmp_path / "arch"
  d.mkdir()
  (d / "config.json").write_text(json.dumps(cfg))
  return str(d)


def _tiny_rl(config, hf_dir):
  c = config
  c.model.hf_checkpoint = hf_dir
  c.data.prompt_len, c.data.completion_len, c.data.batch_size = 16, 16, 8
  c.sampler.steps, c.sampler.block_len = 4, 8
  c.rl.batch_prompts, c.rl.group_size = 8, 2
  c.estimator.spg_block_len = 8
  c.eval.batch_size = 8
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
  return c


def test_slice_names():
  assert topology.tpu_topology_name("v5p-64") == ("v5p", "v5p:2x4x4")
  assert topology.tpu_topology_name("v5p-8") == ("v5p", "v5p:2x2x1")
  assert topology.tpu_topology_name("v4-32") == ("v4", "v4:2x2x4")
  assert topology.tpu_topology_name("v5e-16") == ("v5e", "v5e:4x4")
  assert topology.tpu_topology_name("v5litepod-16") == ("v5e", "v5e:4x4")  # gcloud's name
  assert topology.tpu_topology_name("v6e-8") == ("v6e", "v6e:2x4")
  assert topology.tpu_topology_name("v5p:4x4x4") == ("v5p", "v5p:4x4x4")
  with pytest.raises(ValueError, match="topology .v5e-12.: 12 chips: TPU slices have a power-of-2"):
    topology.tpu_topology_name("v5e-12")
  with pytest.raises(ValueError, match="expected"):
    topology.tpu_topology_name("h100-8")
  assert topology.cpu_device_count("cpu:8") == 8 and topology.cpu_device_count("v5p-8") is None


def test_a_tpu_topology_without_libtpu_names_the_install_of_an_installed_package(monkeypatch):
  """Without libtpu a TPU topology is an error naming how to get it, also for an install from a
  wheel, which has no requirements-tpu.txt: the package's ``tpu`` extra."""
  from jax.experimental import topologies

  def no_libtpu(**_):
    raise RuntimeError("JAX TPU support not installed")
  monkeypatch.setattr(topologies, "get_topology_desc", no_libtpu)
  with pytest.raises(ValueError, match=r"v5p-8.*libtpu.*pip install \"dllm-rl\[tpu\]\""):
    topology.get_topology("v5p-8")


def test_largest_buffers_from_hlo():
  hlo = ("  %p = bf16[4,8]{1,0} parameter(0)\n"
         "  %big = f32[16,1024]{1,0} dot(%p, %p)\n"
         "  ROOT %t = (f32[2]{0}, s32[]) tuple(%a, %b)\n")
  assert plan.largest_buffers(hlo, top=2) == [("big", "f32[16,1024]", 65536),
                                              ("p", "bf16[4,8]", 64)]


@pytest.mark.slow
def test_pipeline_plan_on_cpu8(tmp_path, capsys):
  """Every program of the embedded-style pipeline (SFT + RL) compiles and fits."""
  out = tmp_path / "plan.json"
  assert plan.run_plan(_config(), "cpu:8", json_path=str(out)) == 0
  result = json.loads(out.read_text())
  assert result["topology"] == "cpu:8" and result["chips"] == 8 and result["estimate"]
  assert set(result["programs"]) == {"sft_step", "rl_step", "rollout_sampler", "greedy_sampler"}
  config = _config()
  analytic = flops.program_flops(config, model_and_tokens(config)[0])
  peak = result["peak_flops_per_device"] * result["devices"]
  for name, r in result["programs"].items():
    assert r["argument_bytes"] > 0 and r["temp_bytes"] > 0 and r["xla_flops"] > 0, name
    assert r["peak_bytes_per_device"] >= r["argument_bytes"], name
    # the FLOPs column is the analytic model count; the time is it at 40 % of all devices
    assert r["flops"] == pytest.approx(analytic[name]) and r["flops"] > 0, name
    assert r["predicted_seconds"] == pytest.approx(r["flops"] / (plan.MFU_ASSUMED * peak)), name
  text = capsys.readouterr().out
  assert "ESTIMATE" in text and "rl_step" in text
  assert f"{result['programs']['rl_step']['flops'] / 1e12:9.3g}" in text


@pytest.mark.slow
def test_rl_plan_needs_only_config_json_and_a_misfit_exits_3(tmp_path, capsys):
  """An HF folder with config.json only; against 256 KiB per device rl_step (fp32 params
  and Adam moments of the 0.3M-parameter fixture, 3.6 MB, are 0.45 MB per device over 8)
  does not fit. (At 1 MiB it did not on jax 0.10 and did on jax 0.11, whose plan is
  smaller.) The rl mode plans no SFT step; only rl_step is compiled (--programs; the
  planner's sampler programs compile in test_pipeline_plan_on_cpu8)."""
  config = _tiny_rl(_config("llada_tpu.py"), _hf_llada_dir(tmp_path))
  with pytest.raises(ValueError, match=r"\['sft_step'\] not among this mode's programs"
                     r" \['rl_step', 'rollout_sampler', 'greedy_sampler'\]"):
    plan.run_plan(config, "cpu:8", programs=["sft_step"])  # found before anything compiles
  out = tmp_path / "plan.json"
  assert plan.run_plan(config, "cpu:8", json_path=str(out), device_memory_gib=1 / 4096,
                       programs=["rl_step"]) == 3
  result = json.loads(out.read_text())
  assert set(result["programs"]) == {"rl_step"}
  assert result["hbm_bytes_per_device"] == 256 * 1024
  err = capsys.readouterr().err
  assert "rl_step does not fit" in err and "largest buffers" in err
  # llada_tpu has scan, remat and logits_chunk on: what is left is micro-batching (8 devices).
  assert "--config.rl.micro_batch=8" in err and "scan_layers" not in err


def test_llada_8b_arch_fixture_is_llada_8b_instruct():
  """tests/fixtures/arch/llada_8b_instruct, the folder of docs/scale.md's LLaDA-8B plan commands
  (config.json only): it loads through the planner's code to LLaDA-8B-Instruct's sizes, token
  ids and 8.02 B parameters."""
  import jax
  import numpy as np
  from dllm_rl.models import transformer
  c = _config("llada_tpu.py")
  c.model.hf_checkpoint = os.path.join(ROOT, "tests", "fixtures", "arch", "llada_8b_instruct")
  cfg, mask_id, eos_id = model_and_tokens(c)
  assert (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.mlp_hidden,
          cfg.vocab_size) == (4096, 32, 32, 32, 12288, 126464)
  assert (mask_id, eos_id) == (126336, 126081)
  _, abstract = transformer.abstract_model(cfg)
  count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract))
  assert count == pytest.approx(8.0156e9, rel=1e-4)


def test_plan_checks_model_block_size_against_the_checkpoint():
  """The plan reads config.json only, yet refuses a model.block_size the run would refuse:
  another block size than an SDAR checkpoint's own, or none (a plan of a run that cannot
  start)."""
  sdar = os.path.join(ROOT, "tests", "fixtures", "sdar_tiny")
  for block_size in (8, 0):
    c = _config("sdar_tpu.py", hf_checkpoint=sdar, block_size=block_size)
    with pytest.raises(ConfigError, match="model.block_size.*block_size=4"):
      model_and_tokens(c)
  cfg, _, _ = model_and_tokens(_config("sdar_tpu.py", hf_checkpoint=sdar, block_size=4))
  assert cfg.qk_norm
  with pytest.raises(ConfigError, match="model.block_size.*bidirectional LLaDA"):
    model_and_tokens(_config("llada_tpu.py", hf_checkpoint=FIXTURE, block_size=4))


def test_bad_topology_and_config_are_named(tmp_path):
  with pytest.raises(ValueError, match="only 8 CPU devices"):
    plan.run_plan(_config(), "cpu:64")
  with pytest.raises(ValueError, match="--programs"):
    plan.run_plan(_config(), "cpu:8", programs=["nope"])
  with pytest.raises(ValueError, match="multislice is a TPU topology's"):
    plan.run_plan(_config(), "cpu:8", slices=2)
  config = _config()
  config.rl.batch_prompts = 3
  with pytest.raises(ConfigError, match="rl.batch_prompts"):
    plan.run_plan(config, "cpu:8")


def _tpu_available():
  try:
    import libtpu  # noqa: F401
  except ImportError:
    return False
  return True


needs_libtpu = pytest.mark.skipif(
    not _tpu_available(), reason="libtpu not installed (pip install -r requirements-tpu.txt)")


@needs_libtpu
@pytest.mark.slow
def test_tpu_plan_of_the_greedy_sampler_fits(tmp_path):
  config = _config()
  config.mode = "eval"  # one program: the greedy sampler
  out = tmp_path / "plan.json"
  assert plan.run_plan(config, "v5e-4", json_path=str(out)) == 0
  result = json.loads(out.read_text())
  assert result["chips"] == 4 and result["hbm_bytes_per_device"] == 16 * 1024 ** 3
  assert not result["estimate"] and set(result["programs"]) == {"greedy_sampler"}
  assert result["programs"]["greedy_sampler"]["flops"] > 0
  assert result["programs"]["greedy_sampler"]["xla_flops"] > 0


@needs_libtpu
@pytest.mark.slow
def test_tpu_plan_cli_exits_3_naming_the_program(tmp_path):
  """On a v5e-4 (16 GiB per chip), an RL model whose replicated fp32 params + Adam
  moments (a 2^20-row vocabulary) exceed a chip: exit 3, naming rl_step. Only rl_step is
  compiled (--programs; the samplers would fit, at two more TPU compiles)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  hf_dir = _hf_llada_dir(tmp_path, embedding_size=2 ** 20, vocab_size=2 ** 20, d_model=1024,
                         n_heads=8, n_kv_heads=8, mlp_hidden_size=256, n_layers=1)
  big = subprocess.run([sys.executable, "-m", "dllm_rl.plan", "--topology=v5e-4",
                        f"--config={ROOT}/configs/llada_tpu.py",
                        f"--config.model.hf_checkpoint={hf_dir}",
                        "--config.mesh.data=4", "--config.mesh.fsdp=1",
                        "--config.rl.batch_prompts=4", "--config.rl.group_size=2",
                        "--config.data.prompt_len=8", "--config.data.completion_len=8",
                        "--config.sampler.steps=1", "--config.sampler.block_len=8",
                        "--config.estimator.spg_block_len=8", "--config.eval.batch_size=4",
                        "--config.estimator.num_samples=1", "--config.rl.inner_steps=1",
                        "--programs=rl_step"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert big.returncode == 3, big.stderr[-2000:]
  assert "rl_step does not fit" in big.stderr
  assert "rollout_sampler" not in big.stdout and "greedy_sampler" not in big.stdout


@needs_libtpu
@pytest.mark.slow
def test_sdar_rl_step_lowers_the_mosaic_kernel_for_a_tpu_slice():
  """configs/sdar_tpu.py (attention_impl=pallas) at tiny size, lowered in this CPU process
  for a v5p-8 (4 chips, FSDP 4): the block model's rl_step holds the staircase kernels as
  Mosaic custom calls (not the interpreter, not the dense reference), on per-shard shapes
  (inside shard_map: GSPMD cannot split a custom call). libtpu compiling these kernels in
  an rl_step on this slice: tests/models/test_llada2_moe.py's
  test_rl_step_compiles_for_a_tpu_slice_with_native_grouped_matmuls (a second compile here
  took 14 s of CPU)."""
  from dllm_rl.planning import programs
  config = _config("sdar_tpu.py")
  assert config.estimator.attention_impl == "pallas"
  config.model.hf_checkpoint = os.path.join(ROOT, "tests", "fixtures", "sdar_tiny")
  config.data.prompt_len, config.data.completion_len = 16, 16
  config.sampler.steps, config.sampler.block_len = 8, 4
  config.rl.batch_prompts, config.rl.group_size, config.eval.batch_size = 4, 2, 4
  topo = topology.get_topology("v5p-8")
  progs, mesh, model_cfg = programs.build_programs(config, topo.devices)
  assert dict(mesh.shape) == {"data": 1, "fsdp": 4, "expert": 1, "tensor": 1}
  rl_step = next(p for p in progs if p.name == "rl_step")
  text = rl_step.fn.lower(*rl_step.args).as_text()
  assert "sdy.manual_computation" in text  # shard_map
  calls = [line for line in text.splitlines() if "stablehlo.custom_call @tpu_custom_call" in line]
  names = {line.split('kernel_name = "')[1].split('"')[0] for line in calls}
  assert names == {"staircase_fwd", "staircase_dq", "staircase_dkdv"}, names
  # 4 prompts × 2 completions = 8 sequences over 4 shards: 2 per kernel call.
  b_local, h = 8 // 4, model_cfg.n_heads
  fwd = next(line for line in calls if 'kernel_name = "staircase_fwd"' in line)
  assert f"tensor<{b_local}x{h}x" in fwd.split(" -> ")[0].rsplit(": (", 1)[1], fwd[-300:]


def test_remedies_name_only_options_that_are_off():
  config = _config()  # base config: no scan, no remat, one vocabulary slab, no micro-batching
  fixes = plan.remedies(config, "rl_step", batch_devices=8)
  assert fixes[:3] == ["--config.model.scan_layers=True", "--config.model.remat=full",
                       "--config.model.logits_chunk=32"]
  assert fixes[3].startswith("--config.rl.micro_batch=8")
  assert not any("micro_batch" in f for f in plan.remedies(config, "sft_step", 8))
  assert plan.remedies(config, "greedy_sampler", 8) == ["a smaller eval.batch_size"]


def test_cli_names_a_missing_topology_alone():
  """Without --topology: one line naming it and its forms, status 2 (before, absl's usage text,
  every flag's help, came first). A subprocess: dllm_rl.plan defines absl flags."""
  res = subprocess.run([sys.executable, "-m", "dllm_rl.plan", "--config=configs/tiny_cpu.py"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert res.returncode == 2 and not res.stdout, res
  assert res.stderr.splitlines() == [f"error: --topology: required: the devices to plan for:"
                                     f" {topology.FORMS} (e.g. --topology=v5p-64)"]
