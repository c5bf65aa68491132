"""StableDRL on an SDAR block-diffusion model (e.g. JetLM SDAR-4B/8B-Chat), GSM8K, Cloud TPU.

    python -m dllm_rl.main --config=configs/sdar_tpu.py --workdir=gs://BUCKET/sdar-gsm8k \\
        --config.model.hf_checkpoint=/path/to/SDAR-8B-Chat \\
        --config.task.options.train_file=/path/to/gsm8k/train.jsonl \\
        --config.task.options.test_file=/path/to/gsm8k/test.jsonl

Required overrides as in configs/llada_tpu.py. SDAR is causal across blocks of
4 tokens and bidirectional within a block (`model.block_size` must equal the
checkpoint's `block_size`; validation says so otherwise): likelihoods come from
`block_elbo` (every block scored with clean history in one staircase-attention
pass, the compiled Pallas kernel), rollouts from the KV-cache block sampler, and
StepRS (``--config.rl.advantage=steprs``) numbers denoising states over
(block, step). Other hyper-parameters follow the StableDRL recipe of
configs/llada_tpu.py; 256 tokens are decoded in 64 blocks of 4, 4 steps each.
"""

import os

from dllm_rl.config import load_config_file, locked


def _llada_config():
  return load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "llada_tpu.py"))


def get_config():
  c = _llada_config()
  c.unlock()
  c.model.hf_checkpoint = "REQUIRED: path to an SDAR checkpoint (HF format)"
  c.model.block_size = 4
  c.sampler.block_len = 4
  c.sampler.steps = 256        # 4 steps per block of 4 tokens
  c.estimator.name = "block_elbo"
  c.estimator.num_samples = 2
  c.estimator.prompt_mask_prob = 0.15
  # The compiled Pallas kernel (Mosaic on TPU), inside shard_map over the batch axes: the
  # planner builds it for the slice's devices (python -m dllm_rl.plan --topology=v5p-64).
  # On a CPU-only machine use --config.estimator.attention_impl=auto (the dense reference).
  c.estimator.attention_impl = "pallas"
  c.estimator.antithetic = False  # official noise: independent masks for ℓ̂_old and each ℓ̂_θ
  c.model.prompt_block_causal = True  # SDAR's generate: the prompt attends block-causally
  return locked(c)
