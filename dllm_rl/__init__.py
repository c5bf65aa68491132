"""dllm_rl: reinforcement learning for diffusion language models in JAX.

Public API (stable across refactors): :func:`load_pretrained` → :class:`Pretrained`
(:mod:`dllm_rl.zoo.pretrained`). Imported on first use, so ``import dllm_rl`` stays light.
"""

__version__ = "0.1.0"
__all__ = ["load_pretrained", "Pretrained"]


def __getattr__(name: str):
  if name in __all__:
    from dllm_rl.zoo import pretrained
    return getattr(pretrained, name)
  raise AttributeError(f"module 'dllm_rl' has no attribute {name!r}")
