"""StableDRL on LLaDA-8B-Instruct, MATH (train) / MATH-500 (test), Cloud TPU.

    dllm-rl-data prepare math --out gs://BUCKET/data/math        # train.jsonl, test.jsonl
    python -m dllm_rl.main --config=configs/llada_math.py --workdir=gs://BUCKET/llada-math \\
        --config.model.hf_checkpoint=GSAI-ML/LLaDA-8B-Instruct \\
        --config.task.options.train_file=gs://BUCKET/data/math/train.jsonl \\
        --config.task.options.test_file=gs://BUCKET/data/math/test.jsonl

Hyper-parameters: the official StableDRL MATH run, JianyuanZhong/StableDRL @26ad014
``configs/math_spg_snis.yaml``, which differs from its GSM8K config (configs/llada_tpu.py)
only in the data: G = 8 × 2 = 16, 256 tokens in 128 steps with blocks of 32, temperature 0.9,
SPG block ELBO with K = 2 and prompt masking 0.15, EUBO β 1.5, mix ω 0.5, SNIS clip C = 5,
μ = 2, AdamW lr 2e-6 betas (0.9, 0.99) wd 0.1, linear decay over 2000 optimizer updates (1000
rollout batches × μ), clip 0.2, no KL.
Prompts: the d1 / SPG ``<reasoning>/<answer>`` preset (d1's MATH prompt: answer in
``\\boxed{}`` inside ``<answer>``), reward as d1's MATH reward: math-verify on the last
``\\boxed{}`` of the completion, 0 without one. Data:
``dllm-rl-data prepare math`` (d1's split: ankner/math-500 train, 12,000 problems without the
MATH-500 ones, problems of 1,500+ characters left out as StableDRL does; HuggingFaceH4/MATH-500
test). Prompts are left-padded to 768 tokens in buckets of 256 / 512 / 768, so the longest
MATH-500 problems fit and training compiles only the widths its batches need. What you should
see: as configs/llada_tpu.py, with held-out MATH-500 greedy accuracy in summary.json.
"""

import os

from dllm_rl.config import load_config_file, locked, recipes


def get_config():
  c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "llada_tpu.py"))
  c.unlock()
  c.task.name = "math500"  # reads any MATH-format file: {"problem", "answer" / "solution"}
  c.task.options = {"train_file": "REQUIRED: dllm-rl-data prepare math --out DIR: DIR/train.jsonl",
                    "test_file": "REQUIRED: dllm-rl-data prepare math --out DIR: DIR/test.jsonl",
                    "prompt_preset": "d1"}
  recipes.task_reward(c)  # 0 for a malformed answer, not llada_tpu.py's -1
  c.task.train_size = 11000   # of d1's 12,000 MATH training problems (minus long ones)
  c.task.val_size = 256
  c.task.test_size = 500      # MATH-500
  c.data.prompt_len = 768
  c.data.prompt_buckets = (256, 512)
  c.rl.lr = 2e-6              # math_spg_snis.yaml optimizer_kwargs.lr
  return locked(c)
