"""dllm_rl: reinforcement learning for diffusion language models in JAX."""

__version__ = "0.1.0"
