"""StableDRL on LLaDA-8B-Instruct, Countdown (3 numbers), Cloud TPU.

    dllm-rl-data prepare countdown --out gs://BUCKET/data/countdown
    python -m dllm_rl.main --config=configs/llada_countdown.py --workdir=gs://BUCKET/llada-cd \\
        --config.model.hf_checkpoint=GSAI-ML/LLaDA-8B-Instruct \\
        --config.task.options.train_file=gs://BUCKET/data/countdown/train.jsonl \\
        --config.task.options.test_file=gs://BUCKET/data/countdown/test.jsonl

Hyper-parameters: the official StableDRL Countdown run, JianyuanZhong/StableDRL @26ad014
``configs/countdown_spg_snis.yaml``: as its GSM8K / MATH configs (configs/llada_tpu.py) except
AdamW lr 1e-6 (G = 16, 256 tokens in 128 steps with blocks of 32, temperature 0.9, SPG block
ELBO K = 2, prompt masking 0.15, EUBO β 1.5, ω 0.5, C = 5, μ = 2, betas (0.9, 0.99), wd 0.1,
linear decay over 2000 optimizer updates = 1000 rollout batches × μ, clip 0.2, no KL).
Prompts: d1's Countdown prompt (the ``<reasoning>/<answer>`` preset); reward d1's
``compute_score`` (the preset's ``task.options.reward=d1``): 1 iff the last closed ``<answer>``
body's integers are the numbers, each once (a trailing ``=22`` is one too many), it holds only
digits, ``+ - * / ( ) .`` and whitespace, and its value is within 1e-5 of the target (safe
parser, no eval: a unary minus, ``**`` or a decimal point scores 0.1), 0.1 for any other
closed ``<answer>`` span and 0 without one (the preset's ``task.options.format_score``;
StableDRL's ``compute_score_countdown`` gives the same values but also accepts an equation that
uses only some of the numbers). Data:
``dllm-rl-data prepare countdown`` (d1: Jiayi-Pan/Countdown-Tasks-3to4, 3-number instances,
for training; d1's 256-problem countdown_cd3_test.jsonl for testing; StableDRL's yaml points its
loader at that test file, which d1 keeps for evaluation). What you should see: as
configs/llada_tpu.py.
"""

import os

from dllm_rl.config import load_config_file, locked, recipes


def get_config():
  c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "llada_tpu.py"))
  c.unlock()
  c.task.name = "countdown_jsonl"
  c.task.options = {
      "train_file": "REQUIRED: dllm-rl-data prepare countdown --out DIR: DIR/train.jsonl",
      "test_file": "REQUIRED: dllm-rl-data prepare countdown --out DIR: DIR/test.jsonl",
      "prompt_preset": "d1"}
  recipes.task_reward(c)  # 0 for a malformed answer, not llada_tpu.py's -1
  c.task.train_size = 20000
  c.task.val_size = 256
  c.task.test_size = 256      # d1's countdown_cd3_test.jsonl
  c.rl.lr = 1e-6              # countdown_spg_snis.yaml optimizer_kwargs.lr
  return locked(c)
