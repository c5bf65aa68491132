"""Memory planner: compile every program of a run ahead of time for a topology.

    python -m dllm_rl.plan --config=configs/llada_tpu.py --topology=v5p-64 \\
        --config.model.hf_checkpoint=PATH_WITH_CONFIG_JSON [--json=plan.json] [--config.x=y ...]

It builds the run's programs (``rl_step``, ``rollout_sampler``, ``greedy_sampler``,
``sft_step`` when the mode trains SFT; dllm_rl.planning.programs) from abstract shapes and
shardings only — no weights, no data: an HF folder holding only config.json is
enough — compiles them for ``--topology`` (dllm_rl.parallel.topology: ``v5p-64``, ``v5e-8``,
``v4-32``, ``v6e-16``, ``v5p:2x4x4`` through libtpu, no TPU needed; ``cpu:N`` as an
estimate) and prints, per program, the argument / output / temp / peak bytes per
device against the device memory, the program's model FLOPs over all devices
(analytic, dllm_rl.train.flops: matmuls with attention, no remat recompute; the samplers
at their full step schedule) and the time they take at 40 % of the devices' peak.
The table (column "XLA TF/dev") and the JSON (``xla_flops``) also keep XLA's
cost-analysis figure per device: a lower
bound (XLA counts a loop body once: the samplers' denoising steps, the estimators'
draws and rl_step's inner updates), which also counts non-matmul operations.

Exit status: 0 when every program peaks at ≤ 90 % of device memory; 3 when one does
not (the message names the program and its largest buffers); 2 for a bad config or
topology. The task is not needed (shapes come from ``data`` and the model), so it is
swapped for the built-in arithmetic task during validation. ``--config.KEY=VALUE`` goes
through the same parser as ``python -m dllm_rl.main`` (dllm_rl.config.cli): every problem is
printed as ``error: config.<key>: ...`` and the exit status is 2.
"""

from __future__ import annotations

import json
import re
import sys
import time

from dllm_rl.errors import ConfigError

FIT_FRACTION = 0.9
MFU_ASSUMED = 0.4

_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2,
          "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1, "f8e4m3fn": 1, "f8e5m2": 1}
_HLO_VALUE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*([a-z0-9]+)\[([0-9,]*)\]")


def largest_buffers(hlo_text: str, top: int = 5) -> list[tuple[str, str, int]]:
  """(value name, shape, bytes) of the largest array values in an optimized HLO module
  (per device after partitioning), largest first."""
  found = {}
  for line in hlo_text.splitlines():
    m = _HLO_VALUE.match(line)
    if not m or m.group(2) not in _BYTES:
      continue
    dims = [int(d) for d in m.group(3).split(",") if d]
    size = _BYTES[m.group(2)]
    for d in dims:
      size *= d
    found[m.group(1)] = (f"{m.group(2)}[{m.group(3)}]", size)
  ranked = sorted(found.items(), key=lambda kv: -kv[1][1])[:top]
  return [(name, shape, size) for name, (shape, size) in ranked]


def _flops(compiled) -> float:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return float((cost or {}).get("flops", 0.0))


_OOM_SIZE = re.compile(r"required for ([\w ]+?) \(([0-9.]+)([KMGT])\)")
_UNITS = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


def _out_of_memory(program, err: Exception, seconds: float) -> dict:
  """The TPU compiler refuses programs larger than HBM (RESOURCE_EXHAUSTED): the bytes
  its message names are a lower bound of the peak; the message lists the largest
  allocations."""
  text = str(err)
  m = _OOM_SIZE.search(text)
  need = int(float(m.group(2)) * _UNITS[m.group(3)]) if m else 0
  return {"argument_bytes": None, "output_bytes": None, "temp_bytes": need, "alias_bytes": None,
          "peak_bytes_per_device": need, "xla_peak_bytes": None, "xla_flops": None,
          "compile_seconds": seconds, "compile_error": text.strip(), "_hlo": None}


def measure(program) -> dict:
  """Compile one program; its memory per device, XLA's FLOPs and compile time."""
  t0 = time.perf_counter()
  try:
    compiled = program.fn.lower(*program.args).compile()
  except Exception as err:  # jax.errors.JaxRuntimeError; only out-of-memory is expected
    if "RESOURCE_EXHAUSTED" not in str(err):
      raise
    return _out_of_memory(program, err, time.perf_counter() - t0)
  seconds = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  # Conservative: every argument, output and temp buffer live at once (donated
  # arguments aliased to outputs counted once), or XLA's own peak if that is larger.
  xla_peak = int(getattr(mem, "peak_memory_in_bytes", 0) or 0)
  total = (mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
           - mem.alias_size_in_bytes)
  peak = max(xla_peak, int(total))
  return {"argument_bytes": int(mem.argument_size_in_bytes),
          "output_bytes": int(mem.output_size_in_bytes),
          "temp_bytes": int(mem.temp_size_in_bytes),
          "alias_bytes": int(mem.alias_size_in_bytes),
          "peak_bytes_per_device": peak, "xla_peak_bytes": xla_peak,
          "xla_flops": _flops(compiled),
          "compile_seconds": seconds, "_hlo": compiled.as_text}


def _size(n: float) -> str:
  """Bytes in the largest binary unit that keeps them ≥ 1 (8 characters)."""
  for unit, scale in (("G", 1024 ** 3), ("M", 1024 ** 2), ("K", 1024)):
    if n >= scale:
      return f"{n / scale:7.2f}{unit}"
  return f"{n:7.0f}B"


def table(topo, results: dict) -> str:
  hbm = topo.hbm_bytes_per_device
  label = " (ESTIMATE: CPU compiler standing in for the target devices)" if topo.estimate else ""
  lines = [f"topology {topo.name}: {len(topo.devices)} devices ({topo.chips} chips),"
           f" {hbm / 1024 ** 3:.1f} GiB and {topo.peak_flops_per_device / 1e12:.0f} TFLOP/s"
           f" per device{label}",
           f"{'program':<16} {'argument':>8} {'output':>8} {'temp':>8} {'peak':>8}"
           f" {'% mem':>6} {'TFLOP':>9} {'s @40%':>8} {'XLA TF/dev':>10} {'compile s':>9}"]
  for name, r in results.items():
    if r.get("compile_error"):
      lines.append(f"{name:<16} {'-':>8} {'-':>8} {_size(r['temp_bytes'])}"
                   f" {'>' + _size(r['peak_bytes_per_device']).strip():>8}"
                   f" {100 * r['peak_bytes_per_device'] / hbm:6.1f}  compiler: out of memory")
      continue
    lines.append(f"{name:<16} {_size(r['argument_bytes'])} {_size(r['output_bytes'])}"
                 f" {_size(r['temp_bytes'])} {_size(r['peak_bytes_per_device'])}"
                 f" {100 * r['peak_bytes_per_device'] / hbm:6.1f} {r['flops'] / 1e12:9.3g}"
                 f" {r['predicted_seconds']:8.3g} {(r['xla_flops'] or 0) / 1e12:10.3g}"
                 f" {r['compile_seconds']:9.1f}")
  return "\n".join(lines)


def remedies(config, program: str, batch_devices: int) -> list[str]:
  """Config changes that shrink ``program`` and are not on yet (most effective first)."""
  m, out = config.model, []
  if program in ("rl_step", "sft_step"):
    if not m.scan_layers:
      out.append("--config.model.scan_layers=True")
    if m.remat != "full":
      out.append("--config.model.remat=full")
    if m.logits_chunk <= 0 or m.logits_chunk > 64:
      out.append("--config.model.logits_chunk=32")
  if program == "rl_step" and not config.rl.micro_batch:
    n = config.rl.batch_prompts * config.rl.group_size
    if n % batch_devices == 0:
      out.append(f"--config.rl.micro_batch={batch_devices} (one sequence per batch device and"
                 " one draw per pass; larger multiples trade memory for fewer passes)")
  if program == "greedy_sampler":
    out.append("a smaller eval.batch_size")
  if program in ("rl_step", "rollout_sampler", "sft_step"):
    out.append("a larger slice (more chips for FSDP)")
  return out


def plan(config, topo, only: list[str] | None = None) -> tuple[dict, list[str]]:
  """(the JSON plan, one message per program that does not fit); ``only``: a subset."""
  from dllm_rl.planning.programs import build_programs
  from dllm_rl.train.flops import program_flops

  programs, mesh, model_cfg = build_programs(config, topo.devices)
  from dllm_rl.parallel.rules import batch_size_divisor
  model_flops = program_flops(config, model_cfg)
  if only:
    unknown = set(only) - {p.name for p in programs}
    if unknown:
      raise ValueError(f"--programs: {sorted(unknown)} not among this mode's programs "
                       f"{[p.name for p in programs]}")
    programs = [p for p in programs if p.name in only]
  results, problems = {}, []
  for program in programs:
    r = measure(program)
    hlo = r.pop("_hlo")
    r["flops"] = model_flops[program.name]  # all devices; the time: spread over them
    r["predicted_seconds"] = r["flops"] / (
        MFU_ASSUMED * topo.peak_flops_per_device * len(topo.devices))
    results[program.name] = r
    problem = None
    if r.get("compile_error"):
      problem = (f"{program.name} does not fit: the compiler ran out of device memory:"
                 f" {r['compile_error'][:3000]}")
    elif r["peak_bytes_per_device"] > FIT_FRACTION * topo.hbm_bytes_per_device:
      buffers = ", ".join(f"{n} {s} {b / 1024 ** 3:.2f} GiB" for n, s, b in largest_buffers(hlo()))
      problem = (f"{program.name} does not fit: peak {r['peak_bytes_per_device'] / 1024 ** 3:.2f}"
                 f" GiB per device > {FIT_FRACTION:.0%} of"
                 f" {topo.hbm_bytes_per_device / 1024 ** 3:.1f}"
                 f" GiB; largest buffers: {buffers}")
    if problem:
      fixes = remedies(config, program.name, batch_size_divisor(mesh))
      problems.append(problem + ("; try " + "; ".join(fixes) if fixes else ""))
  out = {"topology": topo.name, "chips": topo.chips, "devices": len(topo.devices),
         "estimate": topo.estimate, "hbm_bytes_per_device": topo.hbm_bytes_per_device,
         "peak_flops_per_device": topo.peak_flops_per_device, "programs": results}
  return out, problems


def validated(config):
  """``config`` validated with the task swapped for the built-in arithmetic task (the plan
  reads no data file); the task's name, contract and option names are still checked (a typo in
  ``--config.task.options.KEY`` is an error here too). Every problem at once."""
  import ml_collections

  from dllm_rl import tasks
  from dllm_rl.errors import raise_all
  from dllm_rl.train.validate import validate
  errors = []
  t = config.get("task")
  if isinstance(t, ml_collections.ConfigDict) and isinstance(t.get("name"), str):
    try:
      tasks.check_options(t.name, t.get("options", {}))
    except ValueError as err:
      errors.append(ConfigError("task.name" if t.name not in tasks.TASKS else "task.options",
                                str(err)))
    if t.name in tasks.TASKS and (problem := tasks.contract_problem(t.name)) is not None:
      errors.append(ConfigError("task.name", problem))
  check = ml_collections.ConfigDict(config.to_dict())
  check.task.name = "arithmetic"
  check.task.options = ml_collections.ConfigDict()
  try:
    validate(check)
  except ConfigError as err:
    errors += getattr(err, "errors", [err])
  raise_all(errors)
  return config


def json_path_problems(json_path: str) -> list[ConfigError]:
  """Why ``--json`` cannot be written (a folder, a missing parent, a parent that is a file),
  checked before the plan compiles; [] when it can."""
  from dllm_rl import paths
  path = paths.resolve(json_path)
  if str(json_path).startswith("gs://"):
    return []  # a bucket's folders exist once written
  if path.is_dir():
    return [ConfigError("--json", f"{json_path} is a folder: name a file")]
  if not path.parent.is_dir():
    return [ConfigError("--json", f"{path.parent} is not an existing folder")]
  return []


def run_plan(config, topology: str, *, json_path: str | None = None,
             device_memory_gib: float | None = None, peak_tflops: float | None = None,
             programs: list[str] | None = None, slices: int = 1) -> int:
  """Plan, print the table (and write the JSON); the exit status (0 fits, 3 does not).
  ``slices``: that many copies of a TPU ``topology`` (multislice)."""
  from dllm_rl.parallel.topology import get_topology

  validated(config)
  topo = get_topology(topology, device_memory_gib=device_memory_gib, peak_tflops=peak_tflops,
                      slices=slices)
  out, problems = plan(config, topo, programs)
  print(table(topo, out["programs"]), flush=True)
  if json_path:
    from dllm_rl import paths
    paths.resolve(json_path).write_text(json.dumps(out, indent=2))
  for p in problems:
    print(f"error: {p}", file=sys.stderr)
  return 3 if problems else 0
