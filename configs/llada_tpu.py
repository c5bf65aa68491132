"""StableDRL on LLaDA-8B-Instruct, GSM8K, Cloud TPU (v5p / v6e slices).

    python -m dllm_rl.main --config=configs/llada_tpu.py --workdir=gs://BUCKET/llada-gsm8k \\
        --config.model.hf_checkpoint=/path/to/LLaDA-8B-Instruct \\
        --config.task.options.train_file=/path/to/gsm8k/train.jsonl \\
        --config.task.options.test_file=/path/to/gsm8k/test.jsonl

Required overrides: ``model.hf_checkpoint`` (an HF folder with config.json,
model*.safetensors and the tokenizer files, local or gs://, or the hub id
GSAI-ML/LLaDA-8B-Instruct; weights stream onto the mesh) and the two JSONL files
({"question", "answer"} with GSM8K's "#### x"; ``dllm-rl-data prepare gsm8k --out
DIR`` writes them). Without them
the run stops at validation with an error naming the key. On a multi-host slice
start it on every worker (launch/tpu_pod.sh); ``distributed.initialize=auto``
finds the slice. What you should see: per-step reward / accuracy / ratio
statistics in metrics.jsonl and TensorBoard, checkpoints every 50 steps, and
held-out greedy accuracy and pass@k in summary.json at the end.

Prompt and reward: StableDRL's own (JianyuanZhong/StableDRL @26ad014, configs/
gsm8k_math_spg_snis.yaml → dataloaders/math.py): the question followed by its "(Please put
the final answer in \\\\boxed{} tag, ...)" instruction in the chat template, graded by
math-verify on the whole response, +1 if right and -1 otherwise
(``task.options.prompt_preset=stabledrl``, ``wrong_reward=-1``, ``rl.malformed_reward=-1``).

Hyper-parameters are the official StableDRL ones (DESIGN.md): G = 16, 256
generated tokens in 128 steps with blocks of 32, temperature 0.9, the SPG
block-wise ELBO with K = 2 and prompt masking 0.15, μ = 2, AdamW lr 2e-6,
betas (0.9, 0.99), weight decay 0.1, linear decay over 2000 optimizer updates
(the official ``total_steps``, which counts updates: ``rl.steps`` = 1000 rollout
batches × μ = 2), global-norm clip 0.2, no KL, centered advantages, C = 5; the
official mask noise (ℓ̂_old and every inner iteration's ℓ̂_θ on independent masks)
and, in the gradient, the SPG surrogate (ELBO where A > 0, ½·EUBO + ½·ELBO
elsewhere).
"""

from dllm_rl.config import base_config, locked


def get_config():
  c = base_config()
  c.mode = "rl"  # RL starts from the HF checkpoint (no SFT warm-up)
  c.model.hf_checkpoint = "REQUIRED: LLaDA-8B-Instruct (local folder, gs:// folder or hub id)"
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "float32"
  # One compiled layer body, each layer recomputed in the backward pass, the head and
  # log-softmax only at the scored rows, 32 rows of the 126k vocabulary at a time: the plan
  # (python -m dllm_rl.plan --topology=v5p-64) fits rl_step in ~20 % of a v5p chip, so no
  # micro-batching (rl.micro_batch = 0: no extra no-grad pass).
  c.model.scan_layers = True
  c.model.remat = "full"
  c.model.logits_chunk = 32
  c.task.name = "gsm8k"
  c.task.options.train_file = "REQUIRED: gsm8k train.jsonl"
  c.task.options.test_file = "REQUIRED: gsm8k test.jsonl"
  # StableDRL's GSM8K prompt and reward (dataloaders/math.py: the question, then "(Please put
  # the final answer in \\boxed{} tag, ...)"; math-verify on the whole response, +1 right and
  # -1 otherwise, malformed included)
  c.task.options.prompt_preset = "stabledrl"
  c.task.options.wrong_reward = -1.0
  c.task.train_size = 7000
  c.task.val_size = 256
  c.task.test_size = 1319
  c.data.prompt_len = 256
  c.data.completion_len = 256
  c.sampler.steps = 128
  c.sampler.block_len = 32
  c.sampler.temperature = 0.0
  c.sampler.remasking = "low_confidence"
  # The official total_steps = 2000 counts optimizer updates (a rollout every num_iterations
  # = 2 of them); rl.steps counts rollout batches, each followed by rl.inner_steps updates.
  c.rl.steps = 1000
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
  c.rl.malformed_reward = -1.0  # StableDRL's reward_mixed: -1 for a response it cannot verify
  c.rl.log_every = 1
  c.rl.eval_every = 100
  c.estimator.name = "spg_block"
  c.estimator.num_samples = 2
  c.estimator.prompt_mask_prob = 0.15
  c.estimator.spg_block_len = 32
  # Official noise: ℓ̂_old on masks drawn at rollout, fresh independent masks at every inner
  # iteration (so log ρ̂ is pure estimator noise at the first one); with spg_block,
  # rl.loss=stabledrl takes its gradient through the SPG surrogate (ω = spg_omega = 0.5).
  c.estimator.antithetic = False
  c.estimator.spg_omega = 0.5
  c.eval.batch_size = 64
  c.eval.num_samples = 8
  c.eval.pass_k = (1, 4, 8)
  c.eval.temperature = 0.9
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1  # FSDP over the slice
  c.checkpoint.save_every = 50
  c.checkpoint.keep = 3
  c.checkpoint.save_every_seconds = 1800.0  # an 8B step is slow: never risk > 30 min of work
  return locked(c)
