"""Coupled-GRPO (DiffuCoder) on a Dream-family 7B model, on code: the official recipe over the
existing ``estimator.coupled``, with DiffuCoder's execution and format rewards.

    dllm-rl-data prepare acecode --out /data/acecode --source train=acecode_hard.jsonl
    python -m dllm_rl.main --config=configs/coupled_grpo.py --workdir=gs://BUCKET/coupled \\
        --config.model.hf_checkpoint=/path/to/DiffuCoder-7B-Instruct \\
        --config.task.options.train_file=/data/acecode/train.jsonl \\
        --config.task.options.test_file=/data/acecode/test.jsonl

    python -m dllm_rl.main --config=configs/coupled_grpo.py:tiny --workdir=/tmp/coupled  # CPU

``:tiny`` is the embedded default with coupled-GRPO's algorithm
(dllm_rl.config.recipes.coupled_grpo); the full-scale form starts from
configs/dream_tpu.py (Dream's architecture, decoding, mesh and memory settings;
DiffuCoder-7B-Instruct is a Dream-architecture checkpoint — its loading is not tested
here). What you should see: as dream_tpu.py; ``ratio_max_first`` is 1 (θ_old is scored
on θ's masks) and ``clip_fraction`` counts the tokens d1's token-level clip stops.

Slice: 8 prompts a batch, as DiffuCoder's 8 GPUs, is data-parallel over 8 chips (v5p-16, or 8
GPUs); a larger slice needs ``rl.batch_prompts`` a multiple of its chips (on v5p-64, 8 is an
error naming it). The plan on v5p-16 (``python -m dllm_rl.plan --config=configs/coupled_grpo.py
--topology=v5p-16`` with the Dream-7B config.json) peaks per chip at 35.9 GiB for rl_step
(37.7 % of 95 GiB: the policy, the synced reference, Adam's moments), 25.1 GiB for the
rollout sampler and 12.3 GiB for the greedy one.

The task is ``code`` (dllm_rl/tasks/code.py): AceCode-style problems with test cases, the
reward 2.0 × the pass rate of the test cases run against the completion's ```` ```python ````
block (5 s each, only when the format score is 1) + 0.5 × the format score (1 for prose and
one block that parses, 0.5 when it does not parse, 0 otherwise), as DiffuCoder's ``code`` and
``code_format`` rewards with ``reward_weights`` [2.0, 0.5]; system prompt "You are a helpful
assistant.". The completion's code runs on this machine, under limits but not in a sandbox
(dllm_rl/tasks/code_exec.py): train on untrusted data in a container. DiffuCoder trains on
the hard subset of TIGER-Lab/AceCode-89K that its ``recipes/process_data.py`` writes
(``acecode_hard.jsonl``, given above as the train source); ``dllm-rl-data prepare acecode``
without ``--source`` takes all of AceCode-89K. The test split defaults to HumanEval (164
problems; its prompts can run past ``data.prompt_len`` = 200 tokens, which is an error naming
the line: raise ``data.prompt_len`` for it, or use ``prepare mbpp``). ``task.train_size`` =
8000 problems and ``rl.steps`` = 1000 are one epoch of 8,000 at 8 prompts a batch (DiffuCoder:
``num_train_epochs`` 1): set both for your file (rl.steps = train_size / 8).

The algorithm is d1's token-level GRPO loss (``rl.loss=grpo_token``: per-token ratios
exp(ℓ̂_θ,i − ℓ̂_old,i), clipped at ε, Σ over tokens / Σ lengths) on DiffuCoder's per-token
log-probabilities (``estimator.name=elbo`` with ``coupled``, ``full_mask_term``,
``reduction=sum``; dllm_rl/diffusion/estimators.py):

    ℓ̂_i = ½ [ log p(o_i | q, all masked) + w_i log p(o_i | q, x_pair) ],

the pair (M, ¬M) at rates (t, 1 − t), t ~ U(0.2, 0.8) (``t_eps`` = 0.2: coupled draws
t ~ U[t_eps, 1 − t_eps]), w_i = 1/t where i ∈ M and 1/(1 − t) where i ∈ ¬M, each
completion token scored in exactly one half of the pair, the prompt never masked.

Official hyper-parameters, from apple/ml-diffucoder ``recipes/config_coupled_code.yaml``
and ``src/open_r1/coupled_grpo.py`` (``DiffuGRPOTrainer``):

* one complementary pair per inner step (3 forwards: all masked, M, ¬M);
  ``p_mask_prompt`` 0.0; θ_old and the reference on the same mask seeds as θ
  (``estimator.antithetic``); advantages leave-one-out, unscaled; ε = 0.5;
* μ = ``num_iterations`` = 2; G = ``num_generations`` = 10; 8 prompts per update (8
  processes × ``per_device_train_batch_size`` 5 × ``gradient_accumulation_steps`` 2 / G);
* AdamW lr 1e-6, cosine decay to 0.1 × lr (``cosine_with_min_lr``, ``min_lr_rate`` 0.1:
  ``rl.min_lr_ratio``) after a warm-up of ``warmup_ratio`` 1e-4 (HF's ceil makes it 1 update, at
  lr 0), betas
  (0.9, 0.99), weight decay 0.1, global-norm clip 0.2; full fine-tuning;
* generation (Dream's ``diffusion_generate``, ``sampler.kind = "dream"``): 256 tokens in 256
  steps, one block, temperature 1.0, top-p 0.95, ``alg="entropy"``; prompts up to 200 tokens.

The KL: per-token k3 with β = 0.01 against a reference that starts as the initial policy and
moves toward the current one every 64 optimizer updates, π_ref ← 0.6·π_θ + 0.4·π_ref
(``sync_ref_model``, ``ref_model_sync_steps`` 64, TRL's default ``ref_model_mixup_alpha``
0.6): ``rl.kl_level = "token"``, ``rl.ref_sync_every``, ``rl.ref_sync_alpha``.

Not reproduced: one masking rate t per device batch (here one per sequence: the same law per
sequence);
random masks on the positions after the first EOS (here the action ends there, DESIGN.md);
the EOS itself: DiffuCoder ends the action at the first ``<|im_end|>``, here at the
checkpoint's ``eos_token_id`` (``<|endoftext|>``), so the ``<|im_end|>`` before it is scored;
the token mean is over the whole batch, not per device micro-batch.
"""

import os

from dllm_rl.config import load_config_file, recipes


def _full_scale():
  c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "dream_tpu.py"))
  c.unlock()
  c.model.hf_checkpoint = "REQUIRED: path to a Dream-family checkpoint, e.g. DiffuCoder-7B-Instruct"
  c.data.prompt_len = 200
  c.data.completion_len = 256
  c.sampler.steps, c.sampler.block_len = 256, 256
  c.sampler.top_p = 0.95       # DiffuCoder's rollouts (Dream's sampler: dream_tpu.py)
  c.task.name = "code"
  c.task.options = {"train_file": "REQUIRED: code train.jsonl (dllm-rl-data prepare acecode)",
                    "test_file": "REQUIRED: code test.jsonl (prepare acecode / humaneval / mbpp)",
                    "exec_weight": 2.0, "format_weight": 0.5}
  recipes.task_reward(c)  # 0 for a malformed answer, not llada_tpu.py's -1
  c.task.train_size, c.task.val_size, c.task.test_size = 8000, 64, 164
  c.data.system_prompt = "You are a helpful assistant."
  c.rl.steps = 1000            # one epoch of task.train_size = 8000 problems, 8 per batch
  c.rl.batch_prompts = 8
  c.rl.group_size = 10
  c.rl.inner_steps = 2
  c.rl.temperature = 1.0
  c.rl.lr = 1e-6
  c.rl.schedule = "cosine"
  c.rl.min_lr_ratio = 0.1      # lr_scheduler_kwargs.min_lr_rate
  c.rl.warmup_steps = 1        # warmup_ratio 1e-4: HF rounds ceil(1e-4 × updates) up to 1
  c.rl.b1, c.rl.b2 = 0.9, 0.99
  c.rl.weight_decay = 0.1
  c.rl.grad_clip = 0.2
  return c


def get_config(variant: str = ""):
  return recipes.recipe_config(variant, recipes.coupled_grpo, _full_scale)
