"""Tiny block-diffusion pipeline on CPU: SFT → StableDRL → eval on 3-digit addition.

    python -m dllm_rl.main --config=configs/tiny_block_cpu.py --workdir=/tmp/dllm_block

The tiny_cpu experiment with a block-diffusion model (SDAR style: causal across
blocks of 4 tokens, bidirectional within): SFT and RL score all blocks in one
pass through staircase attention ("auto": the Pallas kernel on GPU/TPU, the
dense-mask reference on CPU; ``interpret`` runs the kernel interpreted), the
sampler decodes block by block with a KV cache, and StepRS states are numbered
over (block, step). What you should see: the same phases and summary.json keys
as tiny_cpu.
"""

from dllm_rl.config import locked
from dllm_rl.config.defaults import get_config as _tiny


def get_config():
  c = _tiny()
  c.unlock()
  c.model.block_size = 4
  c.sampler.block_len = 4       # = model.block_size: 2 blocks of the 8-token completion
  c.sampler.steps = 8
  c.estimator.name = "block_elbo"
  c.estimator.attention_impl = "auto"
  return locked(c)
