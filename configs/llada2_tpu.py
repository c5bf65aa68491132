"""StableDRL on LLaDA2.0-mini / 2.1-mini (inclusionAI, 16B MoE, 1.4B active), GSM8K, Cloud TPU.

    python -m dllm_rl.main --config=configs/llada2_tpu.py --workdir=gs://BUCKET/llada2-gsm8k \\
        --config.model.hf_checkpoint=/path/to/LLaDA2.0-mini \\
        --config.task.options.train_file=/path/to/gsm8k/train.jsonl \\
        --config.task.options.test_file=/path/to/gsm8k/test.jsonl

    python -m dllm_rl.plan --config=configs/llada2_tpu.py --topology=v5p-64 \\
        --config.model.hf_checkpoint=tests/fixtures/arch/llada2_mini

Required overrides as in configs/llada_tpu.py. LLaDA2 is a block-diffusion model
(dllm_rl.models.moe; tests/fixtures/llada2_moe_tiny/README.md): causal across blocks of
32 tokens, bidirectional within one (the official ``generate`` default block_length=32),
so likelihoods come from ``block_elbo`` and rollouts from the KV-cache block sampler,
256 tokens in 8 blocks of 32 at 32 steps per block (the official default). Token ids
come from the checkpoint: pad = eos 156892, mask 156895 (generate()'s defaults; the
config.json holds only pad_token_id). The official ``generate`` aligns blocks to
position 0 (the prompt's last block is shared with the first generated tokens); this
framework's block layout aligns prompt blocks to the prompt's end
(``model.prompt_block_causal``), so rollouts are not token-for-token the official ones.
Every MoE layer routes each token to 8 of 256 experts (group-limited, dropless); the
routing bias (``expert_bias``) is frozen. Other hyper-parameters follow the StableDRL
recipe of configs/llada_tpu.py.

What you should see: the per-step metrics of configs/llada_tpu.py. The plan above
(v5p-64: 32 chips of 95 GiB, FSDP over all of them, experts E/32 = 8 per chip; measured
2026-12-02 through libtpu; the rollout sampler on 2026-12-07) peaks per chip at 27.9 GiB for
rl_step (29 %), 32.7 GiB for the rollout sampler (34 %) and 32.2 GiB for the greedy sampler
(34 %).
"""

import os

from dllm_rl.config import load_config_file, locked


def _llada_config():
  return load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "llada_tpu.py"))


def get_config():
  c = _llada_config()
  c.unlock()
  c.model.hf_checkpoint = "REQUIRED: path to LLaDA2.0-mini or LLaDA2.1-mini (HF format)"
  c.model.block_size = 32
  c.model.prompt_block_causal = True
  c.sampler.block_len = 32
  c.sampler.steps = 256        # 32 steps per block of 32 tokens
  c.estimator.name = "block_elbo"
  c.estimator.num_samples = 2
  c.estimator.prompt_mask_prob = 0.15
  c.estimator.attention_impl = "pallas"  # --config.estimator.attention_impl=auto on CPU
  c.estimator.antithetic = False  # official noise: independent masks for ℓ̂_old and each ℓ̂_θ
  return locked(c)
