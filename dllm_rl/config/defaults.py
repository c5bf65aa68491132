"""The embedded default config (what ``python -m dllm_rl.main`` runs without --config).

A tiny masked-diffusion model on 3-digit addition. Operands are zero-padded
and, like the answer, written least-significant digit first, so answer digit i
sits at a fixed offset from operand digits i: with that, a 0.1M-parameter model
goes from 0 to ~97 % held-out accuracy in 2000 SFT steps (about 45 s on 2
cores); with natural-order operands it stalls near 10 %.
"""

from dllm_rl.config import base_config, locked


def get_config():
  c = base_config()
  c.mode = "pipeline"
  c.task.name = "arithmetic"
  c.task.options.num_digits = 3
  c.task.options.reverse_answer = True
  c.task.options.pad_operands = True
  c.task.options.reverse_operands = True
  c.model.rope_theta = 10000.0
  c.data.prompt_len = 8        # "321+654=" is 8 characters
  c.data.completion_len = 8    # 4 answer digits + EOS fill
  c.sampler.steps = 8
  c.sampler.block_len = 8
  c.sampler.temperature = 0.0
  c.sft.steps = 2000
  c.sft.lr = 2e-3
  c.sft.eval_every = 25
  c.sft.target_accuracy = 0.3   # stop SFT early: leave headroom for RL (DESIGN.md)
  c.rl.steps = 300
  c.rl.batch_prompts = 8
  c.rl.group_size = 16
  c.rl.inner_steps = 2
  c.rl.lr = 1e-4
  c.rl.temperature = 1.0
  c.rl.loss = "stabledrl"
  c.rl.advantage = "centered"
  c.rl.eval_every = 50
  c.estimator.name = "elbo"
  c.estimator.num_samples = 1
  c.checkpoint.save_every = 100
  return locked(c)
