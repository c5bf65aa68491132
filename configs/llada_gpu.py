"""StableDRL on LLaDA-8B-Instruct, GSM8K, one node of 8 GPUs (or more with launch/slurm_gpu.sh).

    python -m dllm_rl.main --config=configs/llada_gpu.py --workdir=/shared/runs/llada-gsm8k \\
        --config.model.hf_checkpoint=/path/to/LLaDA-8B-Instruct \\
        --config.task.options.train_file=/path/to/gsm8k/train.jsonl \\
        --config.task.options.test_file=/path/to/gsm8k/test.jsonl

Same experiment and hyper-parameters as configs/llada_tpu.py (see there); only
the layout differs: FSDP over the GPUs of the job, 8 prompts × 16 completions
per step so that one node of 8 GPUs holds one prompt per device. Multi-node:
launch/slurm_gpu.sh --config configs/llada_gpu.py ... (one process per node).
"""

import os

from dllm_rl.config.layouts import gpu_node_config


def get_config():
  return gpu_node_config(os.path.join(os.path.dirname(os.path.abspath(__file__)), "llada_tpu.py"))
