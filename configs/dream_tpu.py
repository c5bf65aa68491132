"""StableDRL on Dream-v0-Instruct-7B, GSM8K, Cloud TPU (v5p / v6e slices).

    python -m dllm_rl.main --config=configs/dream_tpu.py --workdir=gs://BUCKET/dream-gsm8k \\
        --config.model.hf_checkpoint=/path/to/Dream-v0-Instruct-7B \\
        --config.task.options.train_file=/path/to/gsm8k/train.jsonl \\
        --config.task.options.test_file=/path/to/gsm8k/test.jsonl

Plan it first (no TPU, no weights: config.json is enough):

    python -m dllm_rl.plan --config=configs/dream_tpu.py --topology=v5p-64 \\
        --config.model.hf_checkpoint=tests/fixtures/arch/dream_v0_instruct_7b \\
        --config.task.options.train_file=x --config.task.options.test_file=x

Required overrides: ``model.hf_checkpoint`` (a local HF directory with config.json,
model*.safetensors and the tokenizer files: Dream-org's vocab.json + merges.txt are read
by dllm_rl.tasks.bpe_tokenizer; weights stream onto the mesh) and the two JSONL files
({"question", "answer"} with GSM8K's "#### x"). Without them the run stops at
validation with an error naming the key. On a
multi-host slice start it on every worker (launch/tpu_pod.sh). What you should see:
per-step reward / accuracy / ratio statistics in metrics.jsonl and TensorBoard,
checkpoints every 50 steps, held-out greedy accuracy and pass@k in summary.json.

The model (dllm_rl.models.hf, family "dream"): Qwen2-shaped, q/k/v biases,
bidirectional attention, and the logit shift (the checkpoint's raw row i scores token
i + 1; the model realigns it, so samplers and estimators read row i for token i).
Hyper-parameters are the official StableDRL ones, as configs/llada_tpu.py (DESIGN.md):
G = 16, 256 generated tokens in 128 steps, temperature 0.9, the SPG block-wise ELBO
with K = 2 and prompt masking 0.15, μ = 2, AdamW lr 2e-6, betas (0.9, 0.99), weight
decay 0.1, linear decay over 2000 updates (1000 rollout batches × μ), global-norm
clip 0.2, no KL, centered
advantages, C = 5, the official mask noise and SPG surrogate. Decoding (rollouts, greedy
eval, pass@k) is Dream's own ``diffusion_generate`` (``sampler.kind = "dream"``,
dllm_rl/sampling/dream_rollout.py): the whole completion is one block, ``alg="entropy"``, its
schedule int(masks × (1 − s/t)) over linspace(1, eps = 1e-3, steps + 1), confidences from the
tempered probabilities, top-k 50 (what the official calls leave it at); the rollouts
reproduce the official greedy runs token for token (tests/sampling/test_dream_rollout.py).
"""

import os

from dllm_rl.config import load_config_file, locked


def _llada_config():
  return load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "llada_tpu.py"))


def get_config():
  """configs/llada_tpu.py (the same official StableDRL recipe) with Dream's checkpoint and
  decoding. The plan (python -m dllm_rl.plan --topology=v5p-64, the command in the docstring;
  7.62 B parameters) peaks per chip at 17.3 GiB for rl_step (18.2 % of 95 GiB), 11.3 GiB for
  the rollout sampler (11.9 %) and 3.2 GiB for the greedy sampler (3.3 %): no micro-batching."""
  c = _llada_config()
  c.unlock()
  c.model.hf_checkpoint = "REQUIRED: path to Dream-v0-Instruct-7B (HF format)"
  c.sampler.kind = "dream"  # Dream's own sampler (one block: it is not semi-autoregressive)
  c.sampler.block_len = 256
  c.sampler.remasking = "entropy"  # diffusion_generate's alg
  # DARE's and DiffuCoder's diffusion_generate calls pass no top_k, so it is config.json's 50
  # (transformers 4.x keeps PretrainedConfig's legacy generation defaults, and Dream builds
  # its generation config from config.json: dllm_rl/zoo/generators.py, _DREAM_SAMPLING).
  c.sampler.top_k = 50
  return locked(c)
