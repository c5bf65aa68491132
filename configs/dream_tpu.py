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
decay 0.1, linear decay over 2000 steps, global-norm clip 0.2, no KL, centered
advantages, C = 5, the official mask noise and SPG surrogate. Decoding follows Dream's
``diffusion_generate`` as DARE calls it: the whole completion is one block and the
confidence is the negative entropy (``alg="entropy"``).
"""

from dllm_rl.config import base_config, locked


def get_config():
  c = base_config()
  c.mode = "rl"  # RL starts from the HF checkpoint (no SFT warm-up)
  c.model.hf_checkpoint = "REQUIRED: path to Dream-v0-Instruct-7B (HF format)"
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "float32"
  # One compiled layer body, each layer recomputed in the backward pass, the head and
  # log-softmax only at the scored rows, 32 rows of the 152k vocabulary at a time. The plan
  # (python -m dllm_rl.plan --topology=v5p-64, the command in the docstring; 7.62 B
  # parameters) peaks per chip at 17.3 GiB for rl_step (18.2 % of 95 GiB), 9.7 GiB for the
  # rollout sampler (10.2 %) and 3.6 GiB for the greedy sampler (3.8 %): no micro-batching.
  c.model.scan_layers = True
  c.model.remat = "full"
  c.model.logits_chunk = 32
  c.task.name = "gsm8k"
  c.task.options.train_file = "REQUIRED: gsm8k train.jsonl"
  c.task.options.test_file = "REQUIRED: gsm8k test.jsonl"
  c.task.options.prompt_template = ("{question}\nSolve step by step and give the final answer"
                                    " after '####'.")
  c.task.train_size = 7000
  c.task.val_size = 256
  c.task.test_size = 1319
  c.data.prompt_len = 256
  c.data.completion_len = 256
  c.sampler.steps = 128
  c.sampler.block_len = 256  # one block: Dream's diffusion_generate is not semi-autoregressive
  c.sampler.temperature = 0.0
  c.sampler.remasking = "entropy"
  c.rl.steps = 2000
  c.rl.batch_prompts = 32
  c.rl.group_size = 16
  c.rl.inner_steps = 2
  c.rl.temperature = 0.9
  c.rl.loss = "stabledrl"
  c.rl.clip = "upper"
  c.rl.clip_C = 5.0
  c.rl.advantage = "centered"
  c.rl.lr = 2e-6
  c.rl.schedule = "linear"
  c.rl.b1, c.rl.b2 = 0.9, 0.99
  c.rl.weight_decay = 0.1
  c.rl.grad_clip = 0.2
  c.rl.kl_coef = 0.0
  c.rl.log_every = 1
  c.rl.eval_every = 100
  c.estimator.name = "spg_block"
  c.estimator.num_samples = 2
  c.estimator.prompt_mask_prob = 0.15
  c.estimator.spg_block_len = 32
  c.estimator.antithetic = False
  c.estimator.spg_omega = 0.5
  c.eval.batch_size = 64
  c.eval.num_samples = 8
  c.eval.pass_k = (1, 4, 8)
  c.eval.temperature = 0.9
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1  # FSDP over the slice
  c.checkpoint.save_every = 50
  c.checkpoint.keep = 3
  c.checkpoint.save_every_seconds = 1800.0
  return locked(c)
