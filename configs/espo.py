"""ESPO (ELBO-based sequence-level policy optimisation) on LLaDA-8B-Instruct, GSM8K: the
official recipe.

    python -m dllm_rl.main --config=configs/espo.py --workdir=gs://BUCKET/espo-gsm8k \\
        --config.model.hf_checkpoint=/path/to/LLaDA-8B-Instruct \\
        --config.task.options.train_file=/path/to/gsm8k/train.jsonl \\
        --config.task.options.test_file=/path/to/gsm8k/test.jsonl

    python -m dllm_rl.main --config=configs/espo.py:tiny --workdir=/tmp/espo   # CPU, minutes

``:tiny`` is the embedded default with ESPO's algorithm (dllm_rl.config.recipes.espo; the
KL coefficient β / L with the embedded default's L = 8); the full-scale form starts from
configs/llada_tpu.py (same required overrides, mesh and memory settings). What you should
see: as llada_tpu.py, plus ``kl`` in metrics.jsonl; ``ratio_*`` there are of the
un-normalised ℓ̂ (the loss clips exp(Δℓ̂ / L)); ``clip_fraction`` is ESPO's.

The loss (dllm_rl.rl.losses.espo; arXiv 2512.03759): ρ̂_i = exp((ℓ̂_θ(o_i) − ℓ̂_old(o_i)) / L)
with ℓ̂ the summed coupled ELBO and L the generated length,
L = −mean_i min(ρ̂_i A_i, clip(ρ̂_i, 1 − ε, 1 + ε) A_i) + β·mean_i (ℓ̂_θ − ℓ̂_ref)² / (2L).

Official hyper-parameters, from ML-GSAI/ESPO ``recipes/run_gsm8k_llada.sh`` (which
overrides ``recipes/train.yaml``) and ``espo/espo_trainer.py``:

* estimator: the ELBO summed over the tokens, each of ``num_mc`` = 2 Monte-Carlo samples a
  complementary pair (``reduce_var``: the masked and the unmasked positions each scored
  once, weights 1/t and 1/(1 − t), the pair averaged): ``estimator.num_samples`` = 4,
  ``coupled``; the prompt never masked; θ_old and the reference scored on the same mask
  seeds as θ at each inner step (``estimator.antithetic``);
* advantages leave-one-out, r_i − mean_{j≠i} r_j, unscaled (``leave_one_out = True``,
  ``scale_rewards: false``); ε = 0.2; KL k2 with β = 1e-3 (``kl_coef`` = β / 256);
* μ = ``num_iterations`` = 8; G = ``num_generations`` = 6; 16 prompts per update (8
  processes × ``per_device_train_batch_size`` 3 × ``gradient_accumulation_steps`` 4 / G);
* AdamW lr 3e-6 constant after a warm-up of ``warmup_ratio`` 1e-3 of the updates (4 of
  one epoch, 7473 / 16 ≈ 467 rollout batches × 8), betas (0.9, 0.99), weight decay 0.01,
  global-norm clip 0.2;
* generation: 256 tokens, 256 steps, blocks of 32, temperature 1.0, low-confidence
  remasking; prompts up to 400 tokens.

Deviations: the official masks draw the number of masked tokens m ∈ {0..L} (stratified
across the batch, weight (L + 1)/m) over all L generated positions, EOS fill included,
where ``elbo`` draws t ~ U[t_eps, 1 − t_eps] and Bernoulli(t) masks over the action (the
tokens through the first EOS): both are unbiased for the same ELBO; positions after the
first EOS contribute nothing here (the normaliser is still L, as the official
``logits_to_keep``). The official run trains LoRA adapters (r = 128, α = 64) and syncs no
reference (the adapter-free base is the reference); here the parameters are trained in
full and the reference is the starting policy.
"""

import os

from dllm_rl.config import load_config_file, recipes


def _full_scale():
  c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "llada_tpu.py"))
  c.unlock()
  c.data.prompt_len = 400
  c.data.completion_len = 256
  c.sampler.steps, c.sampler.block_len = 256, 32
  c.rl.steps = 467             # one epoch of GSM8K's 7473 training prompts, 16 per batch
  c.rl.batch_prompts = 16
  c.rl.group_size = 6
  c.rl.inner_steps = 8
  c.rl.temperature = 1.0
  c.rl.lr = 3e-6
  c.rl.schedule = "constant"
  c.rl.warmup_steps = 4        # warmup_ratio 1e-3 of 467 × 8 updates
  c.rl.b1, c.rl.b2 = 0.9, 0.99
  c.rl.weight_decay = 0.01
  c.rl.grad_clip = 0.2
  recipes.task_reward(c)  # 0/1, not llada_tpu.py's ±1; its prompt stays llada_tpu.py's
  return c


def get_config(variant: str = ""):
  return recipes.recipe_config(variant, recipes.espo, _full_scale)
