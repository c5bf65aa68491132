"""dllm_rl: reinforcement learning for diffusion language models in JAX.

Public API (stable across refactors): :func:`load_pretrained` → :class:`Pretrained`
(:mod:`dllm_rl.zoo.pretrained`). Imported on first use, so ``import dllm_rl`` stays light.
"""

__version__ = "0.1.0"
__all__ = ["load_pretrained", "Pretrained"]


def version_problem(jax_version: str, flax_version: str) -> str | None:
  """Why this jax / flax pair cannot run dllm_rl, or None. flax < 0.12.10 fails on importing
  ``flax.nnx`` under jax ≥ 0.11 (``jax.experimental.hijax.HiPrimitive`` is gone): seen with
  flax 0.12.8 (the Python 3.11 pin) on jax 0.11.2 on the GPU machine, where flax 0.12.10 runs
  the study (docs/gpu.md); flax ≥ 0.12.9 needs Python ≥ 3.12."""
  import re

  def key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v)[:3])
  if key(jax_version) >= (0, 11) and key(flax_version) < (0, 12, 10):
    return (f"flax {flax_version} does not run on jax {jax_version} (flax.nnx needs"
            " jax.experimental.hijax.HiPrimitive, which jax 0.11.2 lacks): install flax>=0.12.10"
            " (Python >= 3.12), or jax 0.10.2 with requirements.txt")
  return None


def _check_versions() -> None:
  from importlib import metadata
  try:
    problem = version_problem(metadata.version("jax"), metadata.version("flax"))
  except metadata.PackageNotFoundError:
    return
  if problem:
    raise ImportError(problem)


_check_versions()


def __getattr__(name: str):
  if name in __all__:
    from dllm_rl.zoo import pretrained
    return getattr(pretrained, name)
  raise AttributeError(f"module 'dllm_rl' has no attribute {name!r}")
