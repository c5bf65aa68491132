"""StableDRL on Dream-v0-Instruct-7B, GSM8K, one node of 8 GPUs.

    python -m dllm_rl.main --config=configs/dream_gpu.py --workdir=/shared/runs/dream-gsm8k \\
        --config.model.hf_checkpoint=/path/to/Dream-v0-Instruct-7B \\
        --config.task.options.train_file=/path/to/gsm8k/train.jsonl \\
        --config.task.options.test_file=/path/to/gsm8k/test.jsonl

    JAX_PLATFORMS=cpu python -m dllm_rl.plan --config=configs/dream_gpu.py --topology=h100-8 \\
        --config.model.hf_checkpoint=tests/fixtures/arch/dream_v0_instruct_7b \\
        --config.task.options.train_file=x --config.task.options.test_file=x

The experiment of configs/dream_tpu.py (see there) in the layout of configs/llada_gpu.py: 8
prompts × 16 completions a step, one prompt per GPU, FSDP over the job's GPUs
(dllm_rl.config.layouts.gpu_node). Multi-node: launch/slurm_gpu.sh --config
configs/dream_gpu.py ... (one process per node).
"""

import os

from dllm_rl.config.layouts import gpu_node_config


def get_config():
  return gpu_node_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "dream_tpu.py"))
