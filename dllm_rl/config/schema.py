"""The configuration schema: one ConfigDict with every key the framework reads.

Experiment files in ``configs/`` start from :func:`base_config` and change
values; the returned dict is locked, so a typo in a key fails where it is
written. ``dllm_rl.train.validate`` checks a config against this schema before
anything compiles.
"""

from __future__ import annotations

import ml_collections


# The default of config.compilation_cache; a cache directory set through JAX itself
# (JAX_COMPILATION_CACHE_DIR, jax.config) is kept over it (dllm_rl.train.modes).
DEFAULT_COMPILATION_CACHE = "~/.cache/dllm_rl/xla"

def base_config() -> ml_collections.ConfigDict:
  """Every key the framework reads, with documented defaults."""
  c = ml_collections.ConfigDict()
  c.mode = "sft"  # one of dllm_rl.config.choices.RUN_MODES
  c.seed = 0

  c.model = m = ml_collections.ConfigDict()
  # A Hugging Face checkpoint directory (config.json + safetensors + tokenizer files) of a
  # supported family (LLaDA; Dream; SDAR with model.block_size = its block size), or its
  # `python -m dllm_rl.convert import` output; also a gs:// folder (copied to
  # $DLLM_RL_CACHE/weights first) or a hub id such as "GSAI-ML/LLaDA-8B-Instruct" (fetched into
  # the Hugging Face cache; dllm_rl/infra/weights.py). When set, the
  # architecture, the weights, the token ids (mask, EOS, pad) and the tokenizer come from it
  # and the size keys below are ignored (set away from their defaults: a "not read" warning,
  # dllm_rl/config/unread.py HF_ARCHITECTURE).
  m.hf_checkpoint = ""
  m.vocab_size = 0        # 0 = the task tokenizer's vocabulary size
  m.d_model = 64
  m.n_layers = 2
  m.n_heads = 4
  m.n_kv_heads = 0        # 0 = n_heads (no GQA)
  m.head_dim = 0          # 0 = d_model // n_heads
  m.mlp_hidden = 176
  m.rope_theta = 500000.0
  m.rms_norm_eps = 1e-5
  m.tie_embeddings = False
  m.qk_norm = False
  m.qkv_bias = False      # biases on the q/k/v projections (Qwen2 / Dream)
  m.logit_shift = False   # Dream: raw output row i predicts token i + 1; the model realigns
                          # it so every consumer sees row i predict token i
  m.init_std = 0.02
  m.block_size = 0        # > 0: block-diffusion model (SDAR style): causal across blocks of
                          # this size, bidirectional within; 0: bidirectional (LLaDA)
  m.prompt_block_causal = True  # block models: the prompt attends block-causally (blocks aligned
                                # to its end), as SDAR's official generate; False = one full block
  m.dtype = "float32"     # compute dtype: float32 | bfloat16 (HF checkpoints too)
  m.param_dtype = "float32"
  # --- scale (issue 10): layer stack as one lax.scan, rematerialisation policy per layer.
  m.scan_layers = False   # True: one compiled block body for all layers (same param layout)
  m.remat = "none"        # none | full | minimal | dots (dllm_rl.models.scan.REMAT_POLICIES)
  # Likelihoods and SFT apply the head only at the scored rows, through a log-softmax with
  # its own VJP, this many rows of the sequence at a time (one [batch, chunk, vocab] float32
  # slab live; dllm_rl/models/logprob.py). 0 = the whole completion in one slab.
  m.logits_chunk = 0
  # --- mixture of experts (LLaDA2 MoE; dllm_rl/models/moe.py). n_experts = 0: dense layers.
  m.n_experts = 0
  m.experts_per_token = 0   # routed experts per token (top-k)
  m.moe_hidden = 0          # width of one expert's SwiGLU
  m.n_shared_experts = 0    # always-on shared expert of width moe_hidden * n_shared_experts
  m.n_expert_groups = 1     # contiguous expert groups; a token keeps its topk_groups best
  m.topk_groups = 1
  m.routed_scaling = 1.0    # the routed combine weights sum to this
  m.first_dense_layers = 0  # layers before this one keep the dense SwiGLU (mlp_hidden)
  m.rotary_dim = 0          # partial RoPE: dims rotated per head (0 = head_dim)
  # The experts' grouped matmuls (dllm_rl/kernels/grouped_matmul.py): auto (TPU: XLA's ragged
  # dot; GPU and CPU: tiled) | ragged_dot | tiled | mosaic_gpu (JAX's Mosaic GPU kernels, Hopper,
  # bfloat16; opt-in). Not an architecture key: kept with HF models.
  m.moe_dispatch = "auto"

  # LoRA (dllm_rl/models/lora.py; docs/models.md): adapters A [in, r], B [r, out] on the chosen
  # projections, h = x·W + (alpha / rank)·(x·A)·B. rank 0 = off (full fine-tuning). On: only the
  # adapters train and hold optimizer state; the base is frozen and stored in base_dtype;
  # adapters are float32; checkpoints hold the adapters only (the base is rebuilt from
  # model.hf_checkpoint or, for a model from scratch, the seed; a full-fine-tuned SFT
  # checkpoint cannot be the base: export it and point model.hf_checkpoint at it).
  c.lora = a = ml_collections.ConfigDict()
  a.rank = 0
  a.alpha = 16.0
  a.targets = ("q", "k", "v", "o", "gate", "up", "down")  # names in dllm_rl.models.lora.TARGETS
  a.base_dtype = "bfloat16"  # the frozen base's storage dtype (model.param_dtype when off)

  c.task = t = ml_collections.ConfigDict()
  t.name = "arithmetic"   # a name in dllm_rl.tasks.TASKS
  t.options = ml_collections.ConfigDict()  # keyword arguments of that task
  t.train_size = 20000    # distinct training examples generated
  t.val_size = 256        # further train-split examples, never trained on (early stopping)
  t.test_size = 256       # held-out test-split prompts (reported accuracy)

  c.data = d = ml_collections.ConfigDict()
  d.prompt_len = 16       # prompts are left-padded to this length
  d.completion_len = 8    # completions (answer + EOS fill) have this length
  d.batch_size = 64
  # Prompt-length buckets, e.g. (64, 128): each batch (rollouts, evaluation) is cut to the
  # smallest bucket >= its longest prompt (left padding dropped; data.prompt_len when none
  # holds it), one compiled program per bucket. () = always data.prompt_len.
  d.prompt_buckets = ()
  # A system prompt for every prompt: the chat template's system turn (model.hf_checkpoint's
  # tokenizer), or without a template, put before the prompt with a blank line. "" = none.
  # The task's own prompt text comes from task.options (prompt_template / prompt_preset).
  d.system_prompt = ""

  c.sampler = s = ml_collections.ConfigDict()
  # masked = the LLaDA-style sampler below (block_len, remasking, threshold, cache) | dream =
  # Dream's own diffusion_generate (one block; remasking = its alg: entropy, maskgit_plus,
  # topk_margin, origin; eps, top_p, top_k; dllm_rl/sampling/dream_rollout.py). A block model
  # (model.block_size > 0) always uses the block sampler.
  s.kind = "masked"
  s.steps = 8             # denoising steps over the whole completion (with threshold > 0
                          # a block runs until it is complete, up to block_len steps)
  s.block_len = 8         # semi-autoregressive block length
  # Not a decoding knob: validation and test decode greedily (0), pass@k samples at
  # eval.temperature, RL rollouts at rl.temperature; any other value is a config error.
  s.temperature = 0.0
  s.remasking = "low_confidence"  # a name in dllm_rl.sampling.remasking.REMASKING
  s.threshold = 0.0       # > 0: commit every token at or above this confidence (dynamic; its scale
                          # is the remasking policy's: probabilities for low_confidence)
  s.stop_at_eos = True    # fill after the first committed EOS, skip finished blocks
  # False (official LLaDA generate): propose and score over the whole vocabulary, mask token
  # included; True: the mask token's logit is -inf first (MDLM "SUBS", renormalised confidences).
  s.exclude_mask = False
  # Masked (LLaDA) sampler: none = exact forward every step | prefix | dual (Fast-dLLM caches,
  # refreshed at each block start; dllm_rl/sampling/open_block.py).
  s.cache = "none"
  s.cache_refresh = 0     # prefix/dual: also refresh the cache every N steps inside a block
                          # (0 = only at block starts, as Fast-dLLM)
  s.eps = 1e-3            # kind=dream: the schedule's end, linspace(1, eps, steps + 1)
  s.top_p = 1.0           # kind=dream: nucleus filtering of sampled proposals (1.0 = off;
                          # greedy decoding, at temperature 0, is not filtered)
  s.top_k = 0             # kind=dream: top-k filtering (0 = off), at every temperature: at 0
                          # it changes the confidences only (configs/dream_tpu.py: 50)

  c.sft = f = ml_collections.ConfigDict()
  f.steps = 1000
  f.lr = 1e-3
  f.schedule = "cosine"   # constant | cosine | linear (decay after warm-up)
  f.min_lr_ratio = 0.0    # cosine / linear decay to this fraction of lr (HF min_lr_rate)
  f.warmup_steps = 50
  f.weight_decay = 0.0
  f.b1 = 0.9
  f.b2 = 0.999
  f.grad_clip = 1.0       # global-norm clipping; 0 = off
  f.t_eps = 1e-3          # masking rate t ~ U(t_eps, 1]
  f.log_every = 20
  f.eval_every = 200      # validation greedy accuracy every N steps; 0 = none (the test split
                          # is scored at the end either way)
  f.target_accuracy = 0.0  # > 0: stop SFT once validation accuracy reaches it

  c.rl = r = ml_collections.ConfigDict()
  r.steps = 300           # rollout batches (each followed by inner_steps updates)
  r.batch_prompts = 8     # B prompts per rollout batch
  r.group_size = 16       # G completions per prompt
  r.inner_steps = 2       # μ policy updates per rollout batch, fresh estimator masks each
  r.temperature = 1.0     # rollout sampling temperature
  r.malformed_reward = 0.0  # reward of a rollout the verifier cannot parse (the verifiers give
                            # 0, as for a wrong answer); < 0 penalises losing the format
  r.loss = "stabledrl"    # a name in dllm_rl.rl.losses.LOSSES
  r.advantage = "centered"  # a name in dllm_rl.rl.advantages.ADVANTAGES
  r.clip = "upper"        # stabledrl: upper = min(ρ, C) | symmetric = clip(ρ, 1 − ε, 1 + ε)
                          # | none = ρ (self-normalisation only; ablation)
  r.self_normalize = True  # stabledrl: w = c(ρ)/Σ_group c(ρ); False: c(ρ)/G (clip-only ablation)
  r.clip_C = 5.0
  r.eps = 0.2
  r.beta = 1.0            # risk_sensitive β
  r.beta_start = 0.0      # steprs: β at the first (most masked) denoising state
  r.beta_end = 2.0        # steprs: β at the last state
  r.beta_schedule = "linear"  # linear | cosine | step
  r.control_per_state = False  # steprs_*_matched: one scale per denoising state (else per batch)
  r.kl_coef = 0.0         # KL to the starting policy; 0 = off
  r.kl_estimator = "k3"   # k1 | k2 | k3
  r.kl_level = "sequence"  # sequence: the estimator on ℓ̂ per sequence | token: per action
                           # token, mean over the batch's tokens (TRL / DiffuCoder; needs
                           # per-token sums: estimator.reduction=sum)
  r.ref_sync_every = 0    # > 0: every N optimizer updates the reference moves toward the
                          # policy, π_ref ← α·π_θ + (1 − α)·π_ref (TRL sync_ref_model); 0 = the
                          # starting policy throughout
  r.ref_sync_alpha = 0.6  # α of that update (TRL's ref_model_mixup_alpha)
  r.lr = 1e-4
  r.schedule = "constant"
  r.min_lr_ratio = 0.0    # cosine / linear decay to this fraction of rl.lr (HF min_lr_rate)
  r.warmup_steps = 0
  r.weight_decay = 0.0
  r.b1 = 0.9
  r.b2 = 0.99
  r.grad_clip = 1.0
  r.log_every = 10
  r.eval_every = 100      # validation greedy accuracy every N rollout batches (and at the
                          # start); 0 = at the start only (the test split is scored at the end)
  # Gradient accumulation: sequences per forward/backward pass, one estimator draw at a
  # time, after a no-grad pass that fixes the loss's weights (exactly the full-batch
  # gradient; dllm_rl/rl/micro.py). 0 = the whole batch and all draws in one pass.
  r.micro_batch = 0

  c.estimator = x = ml_collections.ConfigDict()
  x.name = "elbo"         # a name in dllm_rl.diffusion.estimators.ESTIMATORS
  x.num_samples = 1       # K Monte-Carlo draws
  x.antithetic = False    # True: θ and θ_old share masks (noise cancels in the ratio);
                          # False: independent masks, as the official StableDRL code
  x.coupled = False       # elbo: complementary mask pairs (t ~ U[t_eps, 1 − t_eps])
  x.full_mask_term = False  # elbo: + ½ log p(o_i | whole completion masked) per token
                            # (DiffuCoder's coupled-GRPO; configs/coupled_grpo.py)
  x.stratified = False    # elbo: stratified t
  x.prompt_mask_prob = 0.0
  x.t_eps = 1e-3
  x.reduction = "mean"    # mean_field, elbo, trajectory: sum (an estimate of log π) |
                          # mean (/ length)
  x.spg_beta = 1.5
  x.spg_omega = 0.5
  x.spg_block_len = 32
  x.trajectory_shrink = 1  # trajectory: distinct denoising steps per forward pass (TraceRL shrink)
  x.attention_impl = "auto"  # block_elbo staircase attention: auto | pallas | mosaic_gpu |
                             # interpret | reference

  c.eval = e = ml_collections.ConfigDict()
  e.batch_size = 128
  e.num_samples = 8       # n samples per test prompt for pass@k
  e.pass_k = (1, 4, 8)    # k values (each <= num_samples)
  e.temperature = 1.0     # sampling temperature for pass@k
  # mode=eval: which weights (dllm_rl/train/eval_mode.py). auto = the newest phase with a
  # checkpoint in --workdir (rl, else sft), else model.hf_checkpoint's own weights (base);
  # sft | rl = that phase's checkpoints; base = model.hf_checkpoint, ignoring checkpoints.
  e.phase = "auto"        # one of dllm_rl.config.choices.EVAL_PHASES
  e.checkpoint_step = -1  # the step to evaluate (SFT steps; RL rollout batches); -1 = newest

  c.mesh = h = ml_collections.ConfigDict()
  h.data = -1             # data-parallel axis; -1 = fill with the remaining devices
  h.fsdp = 1              # parameters (model width) and batch sharded over this axis
  h.expert = 1            # expert parallelism (MoE models): experts split over this axis and
                          # tokens sent to them by all-to-all; also a batch axis. Must divide
                          # the model's n_experts; 1 = off (experts gathered, FSDP-style)
  h.tensor = 1            # heads / MLP / vocabulary sharded over this axis
  # Without -1, a single process may use a prefix of its devices (debugging, tests).

  c.distributed = z = ml_collections.ConfigDict()
  z.initialize = "auto"   # auto (multi-host env detected) | never | explicit
  z.coordinator_address = ""  # explicit: host:port ("" = $DLLM_COORDINATOR_ADDRESS)
  z.num_processes = 0     # explicit: 0 = $DLLM_NUM_PROCESSES
  z.process_id = -1       # explicit: -1 = $DLLM_PROCESS_ID
  z.local_device_ids = ""  # e.g. "0,1"; "" = all local devices

  c.checkpoint = k = ml_collections.ConfigDict()
  k.save_every = 200
  k.keep = 3
  k.async_save = True

  c.log = g = ml_collections.ConfigDict()
  g.tensorboard = True
  g.progress = True
  # Sample completions every N steps (0 = off) into workdir/samples.jsonl and TensorBoard text
  # (W&B: a table): prompt, completion, reward, correct. RL: the first completion of the first
  # log.num_samples prompts of that step's rollout batch (no extra sampling); SFT: greedy
  # completions of the first log.num_samples validation prompts (those of the validation pass
  # when one runs at that step, else one greedy batch). dllm_rl/infra/samples.py. A phase of
  # fewer steps writes none.
  g.samples_every = 100
  g.num_samples = 4
  # Weights & Biases (optional `pip install "dllm-rl[wandb]"`): "" = off. The metrics.jsonl
  # records, the samples, the resolved config and the summary, from the primary process;
  # a resumed run continues the same W&B run (its id is kept in workdir/wandb_run_id).
  g.wandb_project = ""
  g.wandb_entity = ""     # team / user ("" = your default entity)
  g.wandb_name = ""       # run name ("" = the workdir's last component)
  # --- observability (issue 10): metrics lines carry tokens_per_second, step/rollout/update
  # seconds, memory and mfu (dllm_rl/train/throughput.py). Peak bf16 TFLOP/s per device for
  # mfu; 0 = from the device kind (TPU v4/v5e/v5p/v6e, NVIDIA H100/H200/A100; else no mfu).
  g.peak_tflops = 0.0
  c.profile = o = ml_collections.ConfigDict()
  o.steps = ""            # "a:b": jax.profiler trace of RL steps a..b (1-based, b > a) into
                          # workdir/profile (primary process; gs:// copied there); "" = off

  # --- scale (issue 10): persistent XLA compilation cache, shared by runs on this machine
  # (or bucket): a restarted 8B run skips minutes of compilation. "" = off.
  c.compilation_cache = DEFAULT_COMPILATION_CACHE  # a cache set through JAX (its env) wins
  # --- preemption and faults (dllm_rl/train/resilience.py) ---
  k.save_every_seconds = 0.0   # > 0: also save when this long has passed since the last save
  c.train = n = ml_collections.ConfigDict()
  n.max_consecutive_nonfinite = 10  # stop after this many skipped (non-finite) updates in a row
  # --- end preemption and faults ---
  return c


def load_config_file(path: str) -> ml_collections.ConfigDict:
  """``get_config()`` of a config file given by path (as ``--config=PATH`` does), e.g.
  for a config that extends another one. ``PATH:ARG`` (ml_collections' convention) calls
  ``get_config("ARG")``, e.g. ``configs/wd1.py:tiny``."""
  import importlib.util
  import os

  args = ()
  if not os.path.exists(path) and ":" in path:
    path, arg = path.rsplit(":", 1)
    args = (arg,)
  if os.path.isdir(path):
    raise IsADirectoryError(f"{path} is a folder: name a config file (e.g. configs/tiny_cpu.py)")
  if not os.path.isfile(path):
    raise FileNotFoundError(missing_config(path, args))
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(f"dllm_rl_config_{name}", path)
  if spec is None or spec.loader is None:
    raise ImportError(f"{path} is not a Python file (a config file is a .py with get_config())")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not callable(getattr(module, "get_config", None)):
    raise AttributeError(f"{path} defines no get_config()")
  if args and not _takes_an_argument(module.get_config):
    raise TypeError(f"{path}'s get_config() takes no argument, so ':{args[0]}' names no"
                    f" variant of it: pass --config={path}")
  config = module.get_config(*args)
  if not isinstance(config, ml_collections.ConfigDict):
    raise TypeError(f"get_config() returned {type(config).__name__}, not an"
                    " ml_collections.ConfigDict (a missing `return`? start it from"
                    " dllm_rl.config.base_config())")
  return with_defaults(config)


def _takes_an_argument(fn) -> bool:
  """Whether ``fn`` (a config file's get_config) accepts one positional argument."""
  import inspect
  try:
    inspect.signature(fn).bind("x")
  except TypeError:
    return False
  except ValueError:  # no signature to read: let the call say
    return True
  return True


def missing_config(path: str, args: tuple = (), *, cwd: str | None = None,
                   checkout: str | None = None) -> str:
  """Why ``--config=PATH`` names no file, and where it is when this package's source
  checkout (``checkout``: the folder above ``dllm_rl/``) has it: a relative path is read
  from the current folder (``cwd``), so ``configs/llada_tpu.py`` given outside the
  checkout is not found; an install without the checkout (a wheel) has no ``configs/``."""
  import os
  cwd = os.getcwd() if cwd is None else cwd
  if checkout is None:
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  msg = f"{path}: no such file"
  if os.path.isabs(path):
    return msg
  msg += f" (relative paths are read from the current folder, {cwd})"
  there = os.path.join(checkout, path)
  if os.path.isfile(there):
    suffix = "".join(":" + a for a in args)
    return msg + f"; this install's checkout has it: --config={there}{suffix}"
  if not os.path.isdir(os.path.join(checkout, "configs")):
    msg += ("; the configs/ files come with the source checkout (README: Set-up), not with"
            " an installed wheel; without --config the embedded default runs")
  return msg


def with_defaults(config: ml_collections.ConfigDict,
                  defaults: ml_collections.ConfigDict | None = None) -> ml_collections.ConfigDict:
  """``config`` with every key of ``defaults`` (:func:`base_config`) that it lacks added at
  its default, section by section (``task.options`` is the task's own: left as it is). A
  config file that builds only some sections runs with the defaults of the others, as
  validation already checks it; without them the run failed on the first missing one."""
  was_locked = config.is_locked
  config.unlock()  # (not ``unlocked()``: leaving it relocks task.options too)
  _fill(config, base_config() if defaults is None else defaults)
  return locked(config) if was_locked else config


def _fill(config: ml_collections.ConfigDict, defaults: ml_collections.ConfigDict) -> None:
  for key in defaults.keys():
    want = defaults[key]
    if key not in config:
      config[key] = want
    elif (isinstance(want, ml_collections.ConfigDict) and key != "options"
          and isinstance(config[key], ml_collections.ConfigDict)):
      _fill(config[key], want)


def locked(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Lock every level except free-form option dicts (validated elsewhere)."""
  config.lock()
  config.task.options.unlock()
  return config
