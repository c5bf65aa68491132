"""TraceRL on an SDAR / TraDo block-diffusion model (e.g. SDAR-8B-Chat), math: the official recipe.

    python -m dllm_rl.main --config=configs/trajectory_sdar.py --workdir=gs://BUCKET/tracerl-sdar \\
        --config.model.hf_checkpoint=/path/to/SDAR-8B-Chat \\
        --config.task.options.train_file=/path/to/math/train.jsonl \\
        --config.task.options.test_file=/path/to/math500/test.jsonl

    python -m dllm_rl.main --config=configs/trajectory_sdar.py:tiny --workdir=/tmp/traj_sdar  # CPU

``:tiny`` is configs/tiny_block_cpu.py (the embedded default's task on a block model of
block size 4) with TraceRL's algorithm (dllm_rl.config.recipes.trajectory, shrink 1: 4
staircase passes per estimate, one per denoising step of a block, each scoring that state of
every block at once). The full-scale
form starts from configs/sdar_tpu.py (required overrides, mesh, memory settings, the
compiled staircase kernel) and sets the official values. What you should see: as
sdar_tpu.py; ``abs_log_ratio_max_first`` is 0 up to float rounding (the estimate is exact).

The estimator on a block model (dllm_rl/diffusion/trajectory.py): each token scored in the
state it was committed from — the prompt, the earlier blocks clean, its own block with the
tokens of earlier steps revealed — one staircase pass per group of ``trajectory_shrink``
distinct steps of a block, every block's group k in the same pass (the official
``one_round_vectorized``).

Official values, from Gen-Verse/dLLM-RL ``configs/rl_sdar.yaml`` (trainer
``train/rl_sdar.py``; ``rl_trado.yaml`` is the same for TraDo):

* ``training.method`` "TraceRL", ``block_size`` 4, ``shrink`` 1, ``post_num`` 0, ``eps``
  0.2; advantages = z-scored correctness per group;
* rollout: 64 prompts × 16 responses, temperature 1.0, blocks of 4 with 4 denoising steps
  each, ``low_confidence_dynamic`` remasking at threshold 0.9, up to 2000 generated tokens
  (here 512: the sdar_tpu.py memory plan's scale times two; raise ``data.completion_len``
  and ``sampler.steps`` together, 4 per block of 4);
* AdamW lr 1e-6, betas (0.9, 0.999), weight decay 0, ε 1e-8, cosine schedule with
  ``min_lr_scale`` 1.0 (a constant lr), no warm-up; grad-norm clip 1.0;
  ``experiment.total_step`` 80 rollout batches.

Not reproduced (as in configs/trajectory.py): the official trainer's epoch over (response,
state) rows in optimizer steps of 32 accumulated rows per GPU, its per-token k3 penalty to
θ_old (β = 0.01) and its group filter (accuracy in [0.1, 0.9], ``lower_p`` / ``upper_p``);
here one full-batch update per rollout batch, micro-batched (``rl.micro_batch``). Its z-score
(population std, no ε) is ``rl.advantage=zscore``, as in configs/trajectory.py.
"""

import os

from dllm_rl.config import load_config_file, locked, recipes


def _full_scale():
  c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "sdar_tpu.py"))
  c.unlock()
  c.estimator.num_samples = 1  # the trajectory estimator's passes come from the states
  c.data.completion_len = 512
  c.sampler.steps, c.sampler.block_len = 512, 4  # 4 denoising steps per block of 4
  c.sampler.remasking = "low_confidence"
  c.sampler.threshold = 0.9                    # low_confidence_dynamic, dynamic_threshold 0.9
  c.rl.steps = 80
  c.rl.batch_prompts = 64
  c.rl.group_size = 16
  c.rl.temperature = 1.0
  c.estimator.trajectory_shrink = 1
  recipes.tracerl_optimizer(c)
  recipes.task_reward(c)  # 0/1, not llada_tpu.py's ±1; its prompt stays llada_tpu.py's
  return c


def _tiny():
  c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "tiny_block_cpu.py"))
  c.unlock()
  return c


def get_config(variant: str = ""):
  if variant not in recipes.VARIANTS:
    raise ValueError(f"unknown config variant {variant!r}: '' (full scale) or 'tiny'"
                     " (configs/tiny_block_cpu.py)")
  config = _tiny() if variant == "tiny" else _full_scale()
  config.update_from_flattened_dict(recipes.trajectory(config))
  return locked(config)
