"""The baselines' algorithms as config overrides, defined once.

Each recipe maps a config to the flattened overrides (``{"rl.loss": "wd1", ...}``) that make
it run one published algorithm as its official code does — the loss, the advantage,
the likelihood estimator and its noise, the clip range and the KL — and nothing about
scale (model, data, lengths, learning rate, batch, μ). They are applied by the config files
``configs/wd1.py``, ``configs/espo.py``, ``configs/coupled_grpo.py``, ``configs/trajectory.py``
and ``configs/steprs_trajectory.py`` (which add the
official scale hyper-parameters at full size) and by the ``baselines`` study's arms
(``dllm_rl/study/arms.py``, over the embedded default). Values and the official files they
come from are documented in those config files.
"""

from __future__ import annotations

from typing import Callable

import ml_collections

from dllm_rl.config import defaults
from dllm_rl.config.schema import locked

# StableDRL's official likelihood estimator (JianyuanZhong/StableDRL, after SPG): block-random
# masks, the mean log-prob over masked tokens (no 1/t weight), K = 2, prompt masking 0.15,
# independent masks for ℓ̂_old and each inner step.
OFFICIAL_ESTIMATOR = {"estimator.name": "spg_block", "estimator.num_samples": 2,
                      "estimator.prompt_mask_prob": 0.15, "estimator.antithetic": False}

VARIANTS = ("", "tiny")  # get_config("") = full scale, get_config("tiny") = the embedded default


def wd1(config: ml_collections.ConfigDict) -> dict:
  """wd1 (xiaohangt/wd1 ``wll_d1_neg``): ratio-free weighted likelihood of the d1 one-step
  estimate (completion fully masked, prompt tokens masked with p = 0.15, summed over the
  tokens), centered advantages, no KL."""
  del config
  return {"rl.loss": "wd1", "rl.advantage": "centered", "rl.kl_coef": 0.0,
          "estimator.name": "mean_field", "estimator.reduction": "sum",
          "estimator.prompt_mask_prob": 0.15}


def espo(config: ml_collections.ConfigDict) -> dict:
  """ESPO (ML-GSAI/ESPO ``ESPOTrainer``): sequence ratio exp(Δℓ̂ / L) clipped at ε = 0.2
  on the summed coupled ELBO (2 Monte-Carlo pairs, prompt clean, θ / θ_old / π_ref on the
  same masks), leave-one-out advantages, k2 KL with β = 1e-3 (kl_coef = β / L, L the
  generated length ``config.data.completion_len``)."""
  return {"rl.loss": "espo", "rl.advantage": "leave_one_out", "rl.eps": 0.2,
          "rl.kl_coef": 1e-3 / config.data.completion_len, "rl.kl_estimator": "k2",
          "estimator.name": "elbo", "estimator.coupled": True, "estimator.num_samples": 4,
          "estimator.reduction": "sum", "estimator.antithetic": True,
          "estimator.prompt_mask_prob": 0.0}


def coupled_grpo(config: ml_collections.ConfigDict) -> dict:
  """DiffuCoder's coupled-GRPO (apple/ml-diffucoder ``DiffuGRPOTrainer``): d1's token-level
  clipped loss at ε = 0.5 on per-token log-probs ½[log p(all masked) + w·log p(pair)] from
  one complementary pair with t ~ U(0.2, 0.8), prompt clean, θ / θ_old on the same masks,
  leave-one-out advantages; its per-token k3 KL with β = 0.01 (``per_token_kl`` on the
  reference's per-token log-probs, same masks), the reference moved toward the policy every
  64 updates with TRL's α = 0.6 (``sync_ref_model``, ``ref_model_sync_steps`` 64,
  ``ref_model_mixup_alpha`` at TRL's default)."""
  del config
  return {"rl.loss": "grpo_token", "rl.advantage": "leave_one_out", "rl.eps": 0.5,
          "rl.kl_coef": 0.01, "rl.kl_estimator": "k3", "rl.kl_level": "token",
          "rl.ref_sync_every": 64, "rl.ref_sync_alpha": 0.6,
          "estimator.name": "elbo", "estimator.coupled": True,
          "estimator.num_samples": 2, "estimator.t_eps": 0.2, "estimator.full_mask_term": True,
          "estimator.reduction": "sum", "estimator.antithetic": True,
          "estimator.prompt_mask_prob": 0.0}


def trajectory(config: ml_collections.ConfigDict) -> dict:
  """TraceRL (Gen-Verse/dLLM-RL ``train/rl_llada.py``, method "TraceRL"): PPO's clipped
  objective at ε = 0.2 on per-token ratios of the trajectory estimate (each token scored in
  the denoising state it was committed from, summed over the tokens), z-scored group
  advantages (``reward/rl_reward.py`` ``z_score_normalize``: (r − mean_G r) / std_G r with the
  population std, no ε, 0 for a uniform group: ``zscore``; d1's ``grpo``, with the ddof = 1 std
  + 1e-4, gave √((G − 1)/G) of the official values). Its per-token k3 penalty
  to θ_old (β = 0.01) has no counterpart here (the KL is to the starting policy): off. The
  shrinkage is a matter of scale (the official 8 is set by configs/trajectory.py; the
  embedded default's 8 steps keep 1)."""
  del config
  return {"rl.loss": "grpo_token", "rl.advantage": "zscore", "rl.eps": 0.2, "rl.kl_coef": 0.0,
          "estimator.name": "trajectory", "estimator.reduction": "sum"}


def tracerl_optimizer(config: ml_collections.ConfigDict) -> None:
  """TraceRL's official training scale, shared by its LLaDA and SDAR configs
  (Gen-Verse/dLLM-RL ``configs/rl_llada.yaml`` and ``rl_sdar.yaml`` agree): AdamW lr 1e-6,
  betas (0.9, 0.999), weight decay 0, a constant lr (cosine with ``min_lr_scale`` 1.0), no
  warm-up, grad-norm clip 1.0; one update per rollout batch, micro-batched at 64 sequences;
  no prompt masking (the estimate is exact). Sets ``config`` in place."""
  r = config.rl
  r.inner_steps = 1
  r.lr = 1e-6
  r.schedule = "constant"
  r.warmup_steps = 0
  r.b1, r.b2 = 0.9, 0.999
  r.weight_decay = 0.0
  r.grad_clip = 1.0
  r.micro_batch = 64
  config.estimator.prompt_mask_prob = 0.0


def task_reward(config: ml_collections.ConfigDict) -> None:
  """The task's own reward for a recipe built on configs/llada_tpu.py, whose reward is
  StableDRL's ±1: a wrong answer (``task.options.wrong_reward``, where the options hold it)
  and a malformed one (``rl.malformed_reward``) score 0. Sets ``config`` in place."""
  if "wrong_reward" in config.task.options:
    config.task.options.wrong_reward = 0.0
  config.rl.malformed_reward = 0.0


def steprs_trajectory(config: ml_collections.ConfigDict) -> dict:
  """StepRS-GRPO, state-conditioned: each token's risk coefficient β_s weights that token's
  log-probability in the state s it was unmasked from (the ``trajectory`` estimator), not an
  ELBO term under random masks; the StableDRL loss underneath, β 0 → 2 linear."""
  del config
  return {"rl.loss": "stabledrl", "rl.advantage": "steprs", "rl.beta_start": 0.0,
          "rl.beta_end": 2.0, "rl.beta_schedule": "linear", "estimator.name": "trajectory"}


def recipe_config(variant: str, recipe: Callable[[ml_collections.ConfigDict], dict],
                  full_scale: Callable[[], ml_collections.ConfigDict]) -> ml_collections.ConfigDict:
  """``get_config(variant)`` of a baseline's config file: ``recipe``'s overrides over
  ``full_scale()`` (``variant=""``: the official scale) or over the embedded default
  (``variant="tiny"``, ``--config=configs/NAME.py:tiny``), locked."""
  if variant not in VARIANTS:
    raise ValueError(f"unknown config variant {variant!r}: '' (full scale) or 'tiny' (the"
                     " embedded default)")
  config = defaults.get_config() if variant == "tiny" else full_scale()
  config.unlock()
  config.update_from_flattened_dict(recipe(config))
  return locked(config)
