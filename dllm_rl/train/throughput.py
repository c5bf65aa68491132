"""Throughput, model FLOP utilisation, device memory and a profiler window for the loops.

Logged with each metrics line (over the steps since the previous line):

* ``step_seconds``: mean wall time of a step; ``tokens_per_second``: tokens of those
  steps over their time (RL: the B·G·L rollout tokens; SFT: the batch's P + L tokens);
  RL also ``rollout_seconds`` (sampling, up to the completions on the host) and
  ``update_seconds`` (the rest: rewards, the rl_step);
* ``mfu``: the steps' model FLOPs (dllm_rl.train.flops: rollout + update) over
  step time × devices × the peak FLOP/s per device — only where the peak is known
  (``log.peak_tflops``, else from the device kind: :func:`peak_flops_per_device`);
* ``memory_gib`` / ``peak_memory_gib``: bytes in use / peak bytes in use, the max over
  this process's devices, where the backend reports them (not on CPU).

The first step a process runs (compilation) is not timed. Timing adds no host
sync per step: the RL loop already waits for every step; the SFT loop's window
ends at the sync of its log line, and evaluation / checkpoints are paused out.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import tempfile

import jax

from dllm_rl import paths
from dllm_rl.parallel.gpu_target import GPUS
from dllm_rl.parallel.topology import TPU_CHIPS

# jax Device.device_kind → generation in dllm_rl.parallel.topology.TPU_CHIPS (v4 and v5p devices are
# whole chips: the two TensorCores form one megacore device).
TPU_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p",
             "TPU v5p": "v5p", "TPU v6 lite": "v6e", "TPU v6e": "v6e"}
# Peak dense bf16 FLOP/s of NVIDIA parts, matched by name in the device kind
# (e.g. "NVIDIA H100 80GB HBM3"; SXM figures): the planner's GPUs (gpu_target.GPUS) and A100.
GPU_PEAKS = (*((gpu.upper(), facts["peak_bf16_flops"]) for gpu, facts in GPUS.items()),
             ("A100", 312e12))
GIB = 1024 ** 3


def peak_flops_per_device(device_kind: str, override_tflops: float = 0.0) -> float | None:
  """Peak FLOP/s of one device: ``override_tflops`` × 1e12 when > 0, else from its kind;
  None for an unknown kind (CPU): no MFU is reported then."""
  if override_tflops > 0:
    return override_tflops * 1e12
  if device_kind in TPU_KINDS:
    return TPU_CHIPS[TPU_KINDS[device_kind]][1]
  for name, peak in GPU_PEAKS:
    if name in device_kind:
      return peak
  return None


def device_kind() -> str:
  """The kind of the run's devices (``jax.devices()[0].device_kind``, e.g. "TPU v5 lite")."""
  return jax.devices()[0].device_kind


def memory_metrics(devices=None) -> dict:
  """``memory_gib`` / ``peak_memory_gib`` (max over ``devices``, default this process's)
  from ``Device.memory_stats()``; {} where the backend returns none."""
  stats = [s for s in (d.memory_stats() for d in devices or jax.local_devices()) if s]
  out = {}
  for name, key in (("memory_gib", "bytes_in_use"), ("peak_memory_gib", "peak_bytes_in_use")):
    values = [s[key] for s in stats if key in s]
    if values:
      out[name] = max(values) / GIB
  return out


@dataclasses.dataclass
class StepTimer:
  """Timed steps since the last log line (wall time, tokens, model FLOPs) and over the whole
  run (``run_*``, never reset: the phase summary)."""

  num_devices: int
  peak_flops: float | None  # per device; None = unknown (no mfu)
  steps: int = 0
  seconds: float = 0.0
  rollout_seconds: float = 0.0
  tokens: float = 0.0
  flops: float = 0.0
  run_steps: int = 0
  run_seconds: float = 0.0
  run_rollout_seconds: float = 0.0
  run_tokens: float = 0.0

  @classmethod
  def from_config(cls, config, mesh) -> "StepTimer":
    """Devices of the run's mesh; peak from ``log.peak_tflops`` or the device kind."""
    return cls(num_devices=mesh.devices.size if mesh is not None else 1,
               peak_flops=peak_flops_per_device(device_kind(), config.log.peak_tflops))

  def add(self, seconds: float, *, tokens: float, flops: float, steps: int = 1,
          rollout_seconds: float = 0.0) -> None:
    self.steps += steps
    self.seconds += seconds
    self.tokens += tokens
    self.flops += flops
    self.rollout_seconds += rollout_seconds
    self.run_steps += steps
    self.run_seconds += seconds
    self.run_tokens += tokens
    self.run_rollout_seconds += rollout_seconds

  def run_step_seconds(self) -> float | None:
    """Mean wall time of a timed step over the run; None when no step was timed."""
    return self.run_seconds / self.run_steps if self.run_steps else None

  def run_rollout_tokens_per_second(self) -> float | None:
    """Tokens over rollout time, over the run; None when no step was timed."""
    return self.run_tokens / self.run_rollout_seconds if self.run_steps else None

  def metrics(self, *, rollout: bool = False) -> dict:
    """The window's throughput metrics (memory included); resets the window. {} (memory
    only) when no step was timed."""
    out = memory_metrics()
    if self.steps and self.seconds > 0:
      out.update(step_seconds=self.seconds / self.steps,
                 tokens_per_second=self.tokens / self.seconds)
      if rollout:
        out.update(rollout_seconds=self.rollout_seconds / self.steps,
                   update_seconds=(self.seconds - self.rollout_seconds) / self.steps)
      if self.peak_flops:
        out["mfu"] = self.flops / (self.seconds * self.num_devices * self.peak_flops)
    self.steps, self.seconds, self.rollout_seconds, self.tokens, self.flops = 0, 0.0, 0.0, 0.0, 0.0
    return out


_STEPS = re.compile(r"([0-9]+):([0-9]+)")


def parse_steps(text: str) -> tuple[int, int] | None:
  """``"a:b"`` → (a, b) with b > a ≥ 1; "" → None; ValueError otherwise."""
  if text == "":
    return None
  m = _STEPS.fullmatch(text.strip())
  if not m or not 1 <= int(m.group(1)) < int(m.group(2)):
    raise ValueError(f"expected \"a:b\" with integers b > a >= 1 (or \"\" = off), got {text!r}")
  return int(m.group(1)), int(m.group(2))


class ProfileWindow:
  """``jax.profiler`` trace of steps a..b (``profile.steps = "a:b"``, 1-based) into
  ``workdir/profile``; only where ``enabled`` (the primary process). A URL workdir
  (gs://) is traced to a local folder and copied there when the trace stops."""

  def __init__(self, steps: str, workdir: str, *, enabled: bool = True):
    self.window = parse_steps(steps) if enabled else None
    self.target = paths.join(workdir, "profile")
    self._local = None

  def before(self, step: int) -> None:
    """Call before running step ``step`` (1-based)."""
    if self.window and step == self.window[0] and self._local is None:
      self._local = (tempfile.mkdtemp(prefix="dllm_profile_") if paths.is_url(self.target)
                     else self.target)
      jax.profiler.start_trace(self._local)

  def after(self, step: int, state) -> None:
    """Call after step ``step``: at the window's last step, waits for ``state`` and stops."""
    if self._local is not None and step >= self.window[1]:
      jax.block_until_ready(state)
      self.stop()

  def stop(self) -> None:
    if self._local is None:
      return
    local, self._local = self._local, None
    jax.profiler.stop_trace()
    if local != self.target:  # copy the local trace to the URL, then drop it
      for folder, _, files in os.walk(local):
        for name in files:
          rel = os.path.relpath(os.path.join(folder, name), local)
          dst = paths.resolve(self.target) / rel
          dst.parent.mkdir(parents=True, exist_ok=True)
          with open(os.path.join(folder, name), "rb") as f:
            dst.write_bytes(f.read())
      shutil.rmtree(local, ignore_errors=True)

  def __enter__(self) -> "ProfileWindow":
    return self

  def __exit__(self, *exc) -> None:
    self.stop()  # a run stopped inside the window still writes what it traced
