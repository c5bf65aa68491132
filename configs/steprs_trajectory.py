"""StepRS-GRPO, state-conditioned: each token's β_s weights its log-probability in its own state.

    python -m dllm_rl.main --config=configs/steprs_trajectory.py:tiny --workdir=/tmp/steprs_traj
    python -m dllm_rl.main --config=configs/steprs_trajectory.py --workdir=gs://BUCKET/run \\
        --config.model.hf_checkpoint=... (the required overrides of configs/llada_tpu.py)

StepRS (arXiv 2610.00661) gives the token unmasked at denoising state s the risk-sensitive
advantage of β_s (β 0 → 2 linear over the states). With the random-mask estimators that
advantage weights an ELBO term scored in a random context; with the ``trajectory``
estimator (TraceRL, arXiv 2509.06949; dllm_rl/diffusion/trajectory.py) it weights
log π_θ(o_j | q, τ_{<s}), the token's log-probability in the very state β_s belongs to.
The StableDRL loss underneath (dllm_rl.config.recipes.steprs_trajectory).

``:tiny``: the embedded default with that recipe (8 states, one pass each). Full scale:
configs/llada_tpu.py (the official StableDRL hyper-parameters: 256 tokens, 128 steps, μ = 2,
lr 2e-6 ...) with the recipe and TraceRL's shrinkage 8 (16 state passes per estimate
instead of spg_block's 2), micro-batched. What you should see: as llada_tpu.py, with
``abs_log_ratio_max_first`` 0 up to float rounding.
"""

import os

from dllm_rl.config import load_config_file, recipes


def _full_scale():
  c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "llada_tpu.py"))
  c.unlock()
  c.estimator.num_samples = 1  # the trajectory estimator's passes come from the states
  c.estimator.trajectory_shrink = 8
  c.estimator.prompt_mask_prob = 0.0
  c.rl.micro_batch = 64
  recipes.task_reward(c)  # 0/1, not llada_tpu.py's ±1; its prompt stays llada_tpu.py's
  return c


def get_config(variant: str = ""):
  return recipes.recipe_config(variant, recipes.steprs_trajectory, _full_scale)
