"""TraceRL (trajectory-aware RL) on LLaDA-8B-Instruct, GSM8K: the official recipe.

    python -m dllm_rl.main --config=configs/trajectory.py --workdir=gs://BUCKET/tracerl \\
        --config.model.hf_checkpoint=/path/to/LLaDA-8B-Instruct \\
        --config.task.options.train_file=/path/to/gsm8k/train.jsonl \\
        --config.task.options.test_file=/path/to/gsm8k/test.jsonl

    python -m dllm_rl.main --config=configs/trajectory.py:tiny --workdir=/tmp/traj   # CPU

``:tiny`` is the embedded default (dllm_rl/config/defaults.py) with TraceRL's algorithm
(dllm_rl.config.recipes.trajectory; 8 sampler steps, shrink 1: 8 state passes per
estimate); the full-scale form starts from configs/llada_tpu.py (same required overrides,
mesh and memory settings) and sets TraceRL's official hyper-parameters. What you should
see: as llada_tpu.py; ``abs_log_ratio_max_first`` is 0 up to float
rounding (the estimate is exact; ~1e-6 on ``:tiny``).

The estimator (dllm_rl/diffusion/trajectory.py; arXiv 2509.06949): each token's
log π_θ(o_j | q, τ_{<t}) in the state it was committed from, the distinct steps grouped
``trajectory_shrink`` at a time into one forward pass (scored in the group's first state).
The loss: PPO's clip at ε on per-token ratios (``grpo_token``), z-scored group advantages.

Official values, from Gen-Verse/dLLM-RL ``configs/rl_llada.yaml`` (trainer
``train/rl_llada.py``, rewards ``reward/rl_reward.py``):

* ``training.method`` "TraceRL", ``shrink`` 8, ``post_num`` 0 (no position after the
  answer is trained), ``eps`` 0.2; advantages = z-scored correctness per group;
* rollout: 32 prompts × 8 responses, temperature 0.8, 512 tokens in 512 steps, blocks of
  32, ``low_confidence_static`` remasking on the confidence; prompts up to 512 tokens;
* AdamW lr 1e-6, betas (0.9, 0.999), weight decay 0, ε 1e-8, cosine schedule with
  ``min_lr_scale`` 1.0 (a constant lr), no warm-up; grad-norm clip 1.0;
  ``experiment.total_step`` 50 rollout batches.

Not reproduced: the official trainer makes one epoch over the (response, state) rows in
optimizer steps of 2048 rows (``batch_size_lm`` 2 × 8 GPUs × ``gradient_accumulation_steps``
128, ≈ 8 steps per rollout batch, each row's loss the mean over its state's tokens); here
one full-batch update per rollout batch (μ = 1, the same rollout used once; the ratio is
exactly 1 then, so the clip does not bind) with d1's token normalisation (Σ over tokens /
Σ lengths). Its per-token k3 penalty to θ_old (β = 0.01) is left out: at μ = 1 the only
update has θ = θ_old, where k3 and its gradient are 0. Its filter that drops groups with
accuracy > 0.8 or < 0.2 is not reproduced. Its z-score (``z_score_normalize``: the
population std, no ε) is ``rl.advantage=zscore``. The estimator at 8B is the expensive one:
64 state passes per estimate against spg_block's 2, so the rl_step is micro-batched
(``rl.micro_batch``: one draw of 64 sequences per backward); see docs/scale.md "Planning an 8B run".
"""

import os

from dllm_rl.config import load_config_file, recipes


def _full_scale():
  c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "llada_tpu.py"))
  c.unlock()
  c.estimator.num_samples = 1  # the trajectory estimator's passes come from the states
  c.data.prompt_len = 512
  c.data.completion_len = 512
  c.sampler.steps, c.sampler.block_len = 512, 32
  c.sampler.remasking = "low_confidence"
  c.rl.steps = 50
  c.rl.batch_prompts = 32
  c.rl.group_size = 8
  c.rl.temperature = 0.8
  c.estimator.trajectory_shrink = 8
  recipes.tracerl_optimizer(c)
  recipes.task_reward(c)  # 0/1, not llada_tpu.py's ±1; its prompt stays llada_tpu.py's
  return c


def get_config(variant: str = ""):
  return recipes.recipe_config(variant, recipes.trajectory, _full_scale)
