"""wd1 (ratio-free weighted likelihood) on LLaDA-8B-Instruct, GSM8K: the official recipe.

    python -m dllm_rl.main --config=configs/wd1.py --workdir=gs://BUCKET/wd1-gsm8k \\
        --config.model.hf_checkpoint=/path/to/LLaDA-8B-Instruct \\
        --config.task.options.train_file=/path/to/gsm8k/train.jsonl \\
        --config.task.options.test_file=/path/to/gsm8k/test.jsonl

    python -m dllm_rl.main --config=configs/wd1.py:tiny --workdir=/tmp/wd1   # CPU, minutes

``:tiny`` is the embedded default (dllm_rl/config/defaults.py: SFT warm-up of a
0.1M-parameter model on 3-digit addition, then RL) with wd1's algorithm
(dllm_rl.config.recipes.wd1); the full-scale form starts from configs/llada_tpu.py
(same required overrides, same mesh and memory settings) and sets wd1's official
hyper-parameters. What you should see: as llada_tpu.py — per-step reward / accuracy in
metrics.jsonl (the ratio statistics are diagnostics only: wd1 uses no ratio; its
``clip_fraction`` is 0), held-out accuracy and pass@k in summary.json.

The loss (dllm_rl/rl/wd1_loss.py; arXiv 2507.08838): per group
L = −Σ_i (softmax_G(A)_i − softmax_G(−A)_i) ℓ̂_θ(o_i), no ratio, no ℓ̂_old.

Official hyper-parameters, from xiaohangt/wd1 ``run/wll_NP_gsm8k.sh`` (trainer
``wll_d1_neg`` = ``wd1/trainers/rev_grpo_trainer.py``) and ``wd1/train.yaml`` (the rest
from ``wd1/trainers/diffu_grpo_config.py`` defaults):

* estimator: d1's one-step log-likelihood, completion fully masked, prompt tokens masked
  with p = 0.15 (``p_mask_prompt``), fresh masks each inner step (``random_masking``),
  summed over the tokens through the first EOS; advantages r − mean_G r (no std);
* μ = ``num_iterations`` = 12 updates per rollout batch; G = ``num_generations`` = 6;
  8 prompts per update (``per_device_train_batch_size`` 6 × 4 processes ×
  ``gradient_accumulation_steps`` 2, one group per device micro-batch);
* AdamW lr 3e-6 constant after a warm-up of ``warmup_ratio`` 1e-4 of the updates
  (11 of 10 epochs × 7473 / 8 ≈ 9341 rollout batches × 12), betas (0.9, 0.99), weight
  decay 0.1, global-norm clip 0.2;
* generation: 256 tokens, 128 steps, blocks of 32, temperature 0.9, low-confidence
  remasking; prompts up to 200 tokens;
* no KL: ``beta`` 0.04 in train.yaml is not read by the wd1 loss; ``epsilon`` neither;
* prompt and reward: d1's (``wd1/data_utils.py`` ``get_gsm8k_questions``,
  ``wd1/diff_grpo_train.py`` ``reward_functions``: d1's five GSM8K functions summed), i.e.
  ``task.options.prompt_preset=d1`` with its ``reward=d1``.

Not reproduced: the official run trains 4-bit QLoRA adapters (r = 128, α = 64, dropout
0.05) on 4 GPUs; here the parameters are trained in full.
"""

import os

from dllm_rl.config import load_config_file, recipes


def _full_scale():
  c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "llada_tpu.py"))
  c.unlock()
  c.estimator.num_samples = 1  # d1's one-step estimate: one forward whatever K (not read)
  c.data.prompt_len = 200
  c.data.completion_len = 256
  c.sampler.steps, c.sampler.block_len = 128, 32
  c.rl.steps = 9341            # 10 epochs of GSM8K's 7473 training prompts, 8 per batch
  c.rl.batch_prompts = 8
  c.rl.group_size = 6
  c.rl.inner_steps = 12
  c.rl.temperature = 0.9
  c.rl.lr = 3e-6
  c.rl.schedule = "constant"
  c.rl.warmup_steps = 11       # warmup_ratio 1e-4 of 9341 × 12 updates
  c.rl.b1, c.rl.b2 = 0.9, 0.99
  c.rl.weight_decay = 0.1
  c.rl.grad_clip = 0.2
  # d1's GSM8K prompt and reward (llada_tpu.py's are StableDRL's)
  c.task.options.prompt_preset = "d1"
  recipes.task_reward(c)
  return c


def get_config(variant: str = ""):
  return recipes.recipe_config(variant, recipes.wd1, _full_scale)
