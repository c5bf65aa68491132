"""StableDRL on an SDAR block-diffusion model (e.g. JetLM SDAR-8B-Chat), GSM8K, one node of 8 GPUs.

    python -m dllm_rl.main --config=configs/sdar_gpu.py --workdir=/shared/runs/sdar-gsm8k \\
        --config.model.hf_checkpoint=/path/to/SDAR-8B-Chat \\
        --config.task.options.train_file=/path/to/gsm8k/train.jsonl \\
        --config.task.options.test_file=/path/to/gsm8k/test.jsonl

    JAX_PLATFORMS=cpu python -m dllm_rl.plan --config=configs/sdar_gpu.py --topology=h100-8 \\
        --config.model.hf_checkpoint=/tmp/sdar_8b

(/tmp/sdar_8b: the planner's SDAR-8B config.json, written as docs/scale.md "8B plans" says.)

The experiment of configs/sdar_tpu.py (see there: block_elbo through the staircase
attention kernel, Pallas Triton on GPU, the KV-cache block sampler) in the layout of
configs/llada_gpu.py: 8 prompts × 16 completions a step, one prompt per GPU, FSDP over the
job's GPUs (dllm_rl.config.layouts.gpu_node). Multi-node: launch/slurm_gpu.sh --config
configs/sdar_gpu.py ... (one process per node).
"""

import os

from dllm_rl.config.layouts import gpu_node_config


def get_config():
  return gpu_node_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "sdar_tpu.py"))
