"""StableDRL on LLaDA2.0-mini / 2.1-mini (16B MoE, 1.4B active), GSM8K, one node of 8 GPUs.

    python -m dllm_rl.main --config=configs/llada2_gpu.py --workdir=/shared/runs/llada2-gsm8k \\
        --config.model.hf_checkpoint=/path/to/LLaDA2.0-mini \\
        --config.task.options.train_file=/path/to/gsm8k/train.jsonl \\
        --config.task.options.test_file=/path/to/gsm8k/test.jsonl

    JAX_PLATFORMS=cpu python -m dllm_rl.plan --config=configs/llada2_gpu.py --topology=h100-8 \\
        --config.model.hf_checkpoint=tests/fixtures/arch/llada2_mini

The experiment of configs/llada2_tpu.py (see there) in the layout of configs/llada_gpu.py: 8
prompts × 16 completions a step, one prompt per GPU, FSDP over the job's GPUs
(dllm_rl.config.layouts.gpu_node). The experts' grouped matmuls run tiled on GPU
(``model.moe_dispatch=auto``; XLA's GPU ragged dot is a dense dot over every expert: docs/scale.md,
"Model-zoo plans"). Multi-node: launch/slurm_gpu.sh --config configs/llada2_gpu.py ...
"""

import os

from dllm_rl.config.layouts import gpu_node_config


def get_config():
  return gpu_node_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "llada2_tpu.py"))
