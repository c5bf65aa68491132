"""``python -m dllm_rl.plan``: the AOT memory / FLOPs planner (dllm_rl.planning.planner).

Exit status: 0 every program fits (≤ 90 % of device memory), 3 one does not, 2 a bad config
or topology (every config problem printed as ``error: config.<key>: ...``).

    python -m dllm_rl.plan --config=configs/llada_tpu.py --topology=v5p-64 \\
        --config.model.hf_checkpoint=PATH_WITH_CONFIG_JSON [--json=plan.json] [--config.x=y ...]

It compiles for devices this host does not have, so JAX runs on the CPU (JAX_PLATFORMS=cpu:
always for h100-N / h200-N, whose CUDA plugin builds compile-only GPUs only then; otherwise
unless JAX_PLATFORMS is set).
"""

import os
import sys

from absl import flags

from dllm_rl.config import cli
from dllm_rl.errors import ConfigError, each, raise_all
from dllm_rl.parallel import topology
from dllm_rl.planning import planner

_CONFIG = flags.DEFINE_string("config", None, "ml_collections config file.")
_TOPOLOGY = flags.DEFINE_string("topology", None, topology.FORMS)
_JSON = flags.DEFINE_string("json", None, "Write the plan as JSON to this path.")
_MEMORY = flags.DEFINE_float("device_memory_gib", None,
                             "Override the memory per device (cpu:N default: 80 GiB).")
_PROGRAMS = flags.DEFINE_list("programs", None,
                              "Compile only these programs (default: every program of the mode).")
_TFLOPS = flags.DEFINE_float("peak_tflops", None,
                             "Override the peak bf16 TFLOP/s per device (cpu:N default: 989).")
_SLICES = flags.DEFINE_integer(
    "slices", 1, "TPU multislice: this many slices of --topology over the data-center network"
    " (the mesh's data axis spans them: mesh.data must be a multiple).")
_overrides: list[tuple[str, str]] = []


def main(argv):
  if len(argv) > 1:
    raise cli.usage_error(f"unexpected arguments: {argv[1:]}")
  missing = [ConfigError(f"--{flag}", f"required: {what}") for flag, value, what in (
      ("config", _CONFIG.value, "the config file to plan, e.g. --config=configs/llada_tpu.py"),
      ("topology", _TOPOLOGY.value,
       f"the devices to plan for: {topology.FORMS} (e.g. --topology=v5p-64)")) if not value]
  if missing:  # the problem alone, not absl's usage text (every flag's help) before it
    cli.fail(missing)
  n = topology.cpu_device_count(_TOPOLOGY.value)
  problems = [ConfigError(f"--{flag}", f"must be positive, got {value}") for flag, value in
              (("device_memory_gib", _MEMORY.value), ("peak_tflops", _TFLOPS.value))
              if value is not None and not value > 0]
  if n == 0:
    problems.append(ConfigError("--topology", "cpu:N needs N >= 1 devices, got cpu:0"))
  try:
    gpu = topology.gpu_topology_name(_TOPOLOGY.value)
  except ValueError as err:
    gpu = None
    problems.append(ConfigError("--topology", str(err)))
  if _SLICES.value < 1 or (_SLICES.value > 1 and (n is not None or gpu is not None)):
    problems.append(ConfigError("--slices", f"{_SLICES.value}: must be >= 1, and 1 unless"
                                f" --topology is a TPU slice (multislice), got {_TOPOLOGY.value}"))
  elif _SLICES.value > topology.MAX_SLICES:
    problems.append(ConfigError("--slices", f"{_SLICES.value}: at most {topology.MAX_SLICES}"
                                " (dllm_rl.parallel.topology.MAX_SLICES)"))
  if _JSON.value:  # found before the compile, which takes minutes at 8B
    problems += planner.json_path_problems(_JSON.value)

  def check(config):  # the config's problems and the flags', all at once (exit 2)
    errors = list(problems)
    try:
      planner.validated(config)
    except ConfigError as err:
      errors = each(err) + errors
    raise_all(errors)

  config = cli.load(_CONFIG.value, _overrides, check=check)
  if n is not None:  # before JAX starts: N simulated devices
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={n}").strip()
  topology.compile_on_cpu(force=gpu is not None)
  try:
    code = planner.run_plan(config, _TOPOLOGY.value, json_path=_JSON.value,
                            device_memory_gib=_MEMORY.value, peak_tflops=_TFLOPS.value,
                            programs=_PROGRAMS.value, slices=_SLICES.value)
  except (ConfigError, ValueError) as err:  # each problem on its own line
    for one in each(err) if isinstance(err, ConfigError) else [err]:
      print(f"error: {one}", file=sys.stderr)
    code = 2
  sys.exit(code)


def run():
  """Console-script entry point (pyproject.toml)."""
  cli.run_app(main, _overrides, sys.modules[__name__])


if __name__ == "__main__":
  run()
