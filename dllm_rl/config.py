"""The configuration schema (one ConfigDict with every key) and its validation.

Experiment files in ``configs/`` start from :func:`base_config` and change
values; the returned dict is locked, so a typo in a key fails where it is
written. :func:`validate` runs before anything compiles: unknown keys, wrong
types and impossible combinations fail with a :class:`ConfigError` naming the
key.
"""

from __future__ import annotations

import difflib
from typing import Any

import ml_collections

DTYPES = ("float32", "bfloat16")
SCHEDULES = ("constant", "cosine", "linear")


class ConfigError(ValueError):
  """A config problem; the message starts with the offending key."""

  def __init__(self, key: str, message: str):
    self.key = key
    super().__init__(f"config.{key}: {message}")


def base_config() -> ml_collections.ConfigDict:
  """Every key the framework reads, with documented defaults."""
  c = ml_collections.ConfigDict()
  c.mode = "sft"  # a name in dllm_rl.run.MODES
  c.seed = 0

  c.model = m = ml_collections.ConfigDict()
  # A Hugging Face checkpoint directory (config.json + safetensors + tokenizer files) of a
  # supported family (LLaDA; SDAR with model.block_size = its block size), or its
  # `python -m dllm_rl.convert import` output. When set, the
  # architecture, the weights, the token ids (mask, EOS, pad) and the tokenizer come from it
  # and the size keys below are ignored.
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

  c.sampler = s = ml_collections.ConfigDict()
  s.steps = 8             # denoising steps over the whole completion
  s.block_len = 8         # semi-autoregressive block length
  s.temperature = 0.0     # 0 = greedy; > 0 = Gumbel-max sampling
  s.remasking = "low_confidence"  # a name in dllm_rl.sampling.remasking.REMASKING
  s.threshold = 0.0       # > 0: commit every token above this confidence (dynamic)
  s.stop_at_eos = True    # fill after the first committed EOS, skip finished blocks
  # False (official LLaDA generate): propose and score over the whole vocabulary, mask token
  # included; True: the mask token's logit is -inf first (MDLM "SUBS", renormalised confidences).
  s.exclude_mask = False
  # Masked (LLaDA) sampler: none = exact forward every step | prefix | dual (Fast-dLLM caches,
  # refreshed at each block start; dllm_rl/sampling/open_block.py).
  s.cache = "none"
  s.cache_refresh = 0     # prefix/dual: also refresh the cache every N steps inside a block
                          # (0 = only at block starts, as Fast-dLLM)

  c.sft = f = ml_collections.ConfigDict()
  f.steps = 1000
  f.lr = 1e-3
  f.schedule = "cosine"   # constant | cosine | linear (decay after warm-up)
  f.warmup_steps = 50
  f.weight_decay = 0.0
  f.b1 = 0.9
  f.b2 = 0.999
  f.grad_clip = 1.0       # global-norm clipping; 0 = off
  f.t_eps = 1e-3          # masking rate t ~ U(t_eps, 1]
  f.log_every = 20
  f.eval_every = 200      # validation greedy accuracy every N steps; 0 = only at the end
  f.target_accuracy = 0.0  # > 0: stop SFT once validation accuracy reaches it

  c.rl = r = ml_collections.ConfigDict()
  r.steps = 300           # rollout batches (each followed by inner_steps updates)
  r.batch_prompts = 8     # B prompts per rollout batch
  r.group_size = 16       # G completions per prompt
  r.inner_steps = 2       # μ policy updates per rollout batch, fresh estimator masks each
  r.temperature = 1.0     # rollout sampling temperature
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
  r.lr = 1e-4
  r.schedule = "constant"
  r.warmup_steps = 0
  r.weight_decay = 0.0
  r.b1 = 0.9
  r.b2 = 0.99
  r.grad_clip = 1.0
  r.log_every = 10
  r.eval_every = 100      # validation greedy accuracy every N rollout batches; 0 = end only
  # Gradient accumulation: sequences per forward/backward pass, one estimator draw at a
  # time, after a no-grad pass that fixes the loss's weights (exactly the full-batch
  # gradient; dllm_rl/rl/micro.py). 0 = the whole batch and all draws in one pass.
  r.micro_batch = 0

  c.estimator = x = ml_collections.ConfigDict()
  x.name = "elbo"         # a name in dllm_rl.diffusion.estimators.ESTIMATORS
  x.num_samples = 1       # K Monte-Carlo draws
  x.antithetic = False    # True: θ and θ_old share masks (noise cancels in the ratio);
                          # False: independent masks, as the official StableDRL code
  x.coupled = False       # elbo: complementary mask pairs
  x.stratified = False    # elbo: stratified t
  x.prompt_mask_prob = 0.0
  x.t_eps = 1e-3
  x.reduction = "mean"    # mean_field: sum | mean
  x.spg_beta = 1.5
  x.spg_omega = 0.5
  x.spg_block_len = 32
  x.attention_impl = "auto"  # block_elbo staircase attention: auto | pallas | interpret | reference

  c.eval = e = ml_collections.ConfigDict()
  e.batch_size = 128
  e.num_samples = 8       # n samples per test prompt for pass@k
  e.pass_k = (1, 4, 8)    # k values (each <= num_samples)
  e.temperature = 1.0     # sampling temperature for pass@k

  c.mesh = h = ml_collections.ConfigDict()
  h.data = -1             # data-parallel axis; -1 = fill with the remaining devices
  h.fsdp = 1              # parameters (model width) and batch sharded over this axis
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
  # --- observability (issue 10): metrics lines carry tokens_per_second, step/rollout/update
  # seconds, memory and mfu (dllm_rl/train/throughput.py). Peak bf16 TFLOP/s per device for
  # mfu; 0 = from the device kind (TPU v4/v5e/v5p/v6e, NVIDIA H100/H200/A100; else no mfu).
  g.peak_tflops = 0.0
  c.profile = o = ml_collections.ConfigDict()
  o.steps = ""            # "a:b": jax.profiler trace of RL steps a..b (1-based, b > a) into
                          # workdir/profile (primary process; gs:// copied there); "" = off

  # --- scale (issue 10): persistent XLA compilation cache, shared by runs on this machine
  # (or bucket): a restarted 8B run skips minutes of compilation. "" = off.
  c.compilation_cache = "~/.cache/dllm_rl/xla"
  # --- preemption and faults (dllm_rl/train/resilience.py) ---
  k.save_every_seconds = 0.0   # > 0: also save when this long has passed since the last save
  c.train = n = ml_collections.ConfigDict()
  n.max_consecutive_nonfinite = 10  # stop after this many skipped (non-finite) updates in a row
  # --- end preemption and faults ---
  return c


def load_config_file(path: str) -> ml_collections.ConfigDict:
  """``get_config()`` of a config file given by path (as ``--config=PATH`` does), e.g.
  for a config that extends another one."""
  import importlib.util
  import os

  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(f"dllm_rl_config_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def locked(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Lock every level except free-form option dicts (validated elsewhere)."""
  config.lock()
  config.task.options.unlock()
  return config


def _walk(schema, config, prefix, errors):
  """Type-check ``config`` against ``schema`` (errors appended); return a copy of ``config``
  in which every unknown or mistyped key is replaced by its schema default, so that the value
  checks can still run and report their own errors."""
  clean = ml_collections.ConfigDict()
  for key in config.keys():
    path = f"{prefix}{key}"
    if key not in schema:
      close = difflib.get_close_matches(key, list(schema.keys()), n=1)
      hint = f"; did you mean {prefix}{close[0]}?" if close else ""
      errors.append(ConfigError(path, f"unknown key{hint}"))
  for key in schema.keys():
    path = f"{prefix}{key}"
    want = schema[key]
    if key not in config:
      clean[key] = want
      continue
    got = config[key]
    if isinstance(want, ml_collections.ConfigDict):
      if not isinstance(got, ml_collections.ConfigDict):
        errors.append(ConfigError(path, f"expected a section, got {type(got).__name__}"))
        clean[key] = want
      elif path == "task.options":
        clean[key] = got
      else:
        clean[key] = _walk(want, got, path + ".", errors)
      continue
    if isinstance(want, bool) != isinstance(got, bool):
      ok = False
    elif isinstance(want, float) and isinstance(got, (int, float)):
      ok, got = True, float(got)
    elif isinstance(want, tuple) and isinstance(got, (tuple, list)):
      ok = True
    else:
      ok = isinstance(got, type(want))
    if not ok:
      errors.append(ConfigError(path, f"expected {type(want).__name__}, got {got!r}"))
    clean[key] = got if ok else want
  return clean


class ConfigErrors(ConfigError):
  """Several config problems at once; ``errors`` lists them, ``key`` is the first one's."""

  def __init__(self, errors: list[ConfigError]):
    self.errors = list(errors)
    self.key = errors[0].key
    ValueError.__init__(self, "\n".join(str(e) for e in errors))


def raise_all(errors: list[ConfigError]) -> None:
  """Raise the one error, or a ConfigErrors listing them all; nothing when empty."""
  if len(errors) == 1:
    raise errors[0]
  if errors:
    raise ConfigErrors(errors)


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Raise ConfigError (ConfigErrors when several) listing every problem found; return the
  config otherwise. Unknown or mistyped keys are reported and their defaults are used for the
  remaining value checks, so one run lists everything."""
  errors: list[ConfigError] = []
  given = config
  config = _walk(base_config(), config, "", errors)

  def _check(cond: bool, key: str, message: str):
    if not cond:
      errors.append(ConfigError(key, message))

  # Registry names (imported here: validation must not depend on import order).
  from dllm_rl import run
  from dllm_rl import tasks
  from dllm_rl.sampling import remasking

  _check(config.mode in run.MODES, "mode", run.MODES.unknown_message(config.mode))
  _check(config.task.name in tasks.TASKS, "task.name", tasks.TASKS.unknown_message(config.task.name))
  try:
    if config.task.name in tasks.TASKS:
      tasks.make_task(config.task.name, **config.task.options.to_dict())
  except (TypeError, ValueError, OSError) as err:
    errors.append(ConfigError("task.options", str(err)))
  _check(config.sampler.remasking in remasking.REMASKING, "sampler.remasking",
         remasking.REMASKING.unknown_message(config.sampler.remasking))

  m = config.model
  for key in ("d_model", "n_layers", "n_heads", "mlp_hidden"):
    _check(m[key] > 0, f"model.{key}", f"must be positive, got {m[key]}")
  for key in ("vocab_size", "n_kv_heads", "head_dim"):
    _check(m[key] >= 0, f"model.{key}", f"must be >= 0 (0 = derived), got {m[key]}")
  if m.n_heads > 0 and m.n_kv_heads >= 0 and m.d_model > 0 and m.head_dim >= 0:
    n_kv = m.n_kv_heads or m.n_heads
    _check(m.n_heads % n_kv == 0, "model.n_kv_heads",
           f"n_heads={m.n_heads} must be a multiple of n_kv_heads={n_kv}")
    head_dim = m.head_dim or m.d_model // m.n_heads
    _check(m.head_dim or m.d_model % m.n_heads == 0, "model.head_dim",
           f"0 (derived) needs d_model={m.d_model} divisible by n_heads={m.n_heads}")
    _check(head_dim % 2 == 0, "model.head_dim", f"must be even for RoPE, got {head_dim}")
  _check(m.dtype in DTYPES, "model.dtype", f"must be one of {DTYPES}, got {m.dtype!r}")
  _check(m.param_dtype in DTYPES, "model.param_dtype", f"must be one of {DTYPES}, got {m.param_dtype!r}")
  from dllm_rl.models.scan import REMAT_POLICIES
  _check(m.remat in REMAT_POLICIES, "model.remat",
         f"must be one of {sorted(REMAT_POLICIES)}, got {m.remat!r}")
  _check(m.logits_chunk >= 0, "model.logits_chunk", f"must be >= 0, got {m.logits_chunk}")

  d = config.data
  for key in ("prompt_len", "completion_len", "batch_size"):
    _check(d[key] > 0, f"data.{key}", f"must be positive, got {d[key]}")
  buckets = tuple(d.prompt_buckets)
  _check(all(isinstance(w, int) and 0 < w <= d.prompt_len for w in buckets)
         and list(buckets) == sorted(set(buckets)), "data.prompt_buckets",
         f"must be increasing positive ints <= data.prompt_len={d.prompt_len}, got {buckets}")
  _check(config.task.train_size >= d.batch_size, "task.train_size",
         f"{config.task.train_size} is smaller than data.batch_size={d.batch_size}")
  _check(config.task.test_size > 0, "task.test_size", "must be positive")
  _check(config.task.val_size > 0, "task.val_size", "must be positive")

  s = config.sampler
  _check(s.block_len > 0, "sampler.block_len", "must be positive")
  if s.block_len > 0 and d.completion_len > 0:
    _check(d.completion_len % s.block_len == 0, "sampler.block_len",
           f"data.completion_len={d.completion_len} is not a multiple of sampler.block_len={s.block_len}")
    num_blocks = max(d.completion_len // s.block_len, 1)
    _check(s.steps > 0 and s.steps % num_blocks == 0, "sampler.steps",
           f"{s.steps} must be a positive multiple of the number of blocks ({num_blocks})")
    _check(s.steps // num_blocks <= s.block_len, "sampler.steps",
           f"{s.steps // num_blocks} steps per block exceed sampler.block_len={s.block_len}"
           " (some steps would commit nothing)")
  _check(s.temperature >= 0, "sampler.temperature", "must be >= 0")
  _check(0 <= s.threshold < 1, "sampler.threshold", "must be in [0, 1)")
  from dllm_rl.sampling import open_block
  _check(s.cache in open_block.CACHES, "sampler.cache", open_block.CACHES.unknown_message(s.cache))
  _check(s.cache_refresh >= 0, "sampler.cache_refresh", "must be >= 0 (0 = block starts only)")
  _check(s.cache == "none" or not config.model.block_size, "sampler.cache",
         "a block-diffusion model (model.block_size > 0) decodes with its own KV cache:"
         " leave sampler.cache = 'none'")

  f = config.sft
  _check(f.steps >= 0, "sft.steps", "must be >= 0")
  _check(f.lr > 0, "sft.lr", "must be positive")
  _check(f.schedule in SCHEDULES, "sft.schedule", f"must be one of {SCHEDULES}, got {f.schedule!r}")
  _check(0 <= f.warmup_steps <= max(f.steps, 0), "sft.warmup_steps", "must be in [0, sft.steps]")
  _check(0 < f.t_eps < 1, "sft.t_eps", "must be in (0, 1)")
  _check(f.log_every > 0, "sft.log_every", "must be positive")
  _check(f.eval_every >= 0, "sft.eval_every", "must be >= 0")
  _check(0 <= f.target_accuracy <= 1, "sft.target_accuracy", "must be in [0, 1]")
  _check(f.grad_clip >= 0, "sft.grad_clip", "must be >= 0")

  r = config.rl
  from dllm_rl.diffusion import estimators
  from dllm_rl.rl import advantages, losses
  _check(r.loss in losses.LOSSES, "rl.loss", losses.LOSSES.unknown_message(r.loss))
  _check(r.advantage in advantages.ADVANTAGES, "rl.advantage",
         advantages.ADVANTAGES.unknown_message(r.advantage))
  _check(config.estimator.name in estimators.ESTIMATORS, "estimator.name",
         estimators.ESTIMATORS.unknown_message(config.estimator.name))
  for key in ("steps", "batch_prompts", "inner_steps", "log_every"):
    _check(r[key] > 0, f"rl.{key}", f"must be positive, got {r[key]}")
  _check(r.group_size >= 2, "rl.group_size", "group advantages need at least 2 completions")
  _check(r.clip in losses.CLIP_MODES, "rl.clip", f"must be one of {losses.CLIP_MODES}")
  _check(r.clip_C > 1, "rl.clip_C", "must be > 1")
  _check(r.self_normalize or r.clip != "none", "rl.self_normalize",
         "False with rl.clip=none leaves the StableDRL weight ρ̂/G unbounded; keep one of the two")
  _check(0 < r.eps < 1, "rl.eps", "must be in (0, 1)")
  _check(r.beta_schedule in advantages.SCHEDULES, "rl.beta_schedule",
         f"must be one of {advantages.SCHEDULES}")
  _check(r.kl_estimator in ("k1", "k2", "k3"), "rl.kl_estimator", "must be k1, k2 or k3")
  _check(r.kl_coef >= 0, "rl.kl_coef", "must be >= 0")
  _check(r.schedule in SCHEDULES, "rl.schedule", f"must be one of {SCHEDULES}")
  _check(0 <= r.warmup_steps <= r.steps * r.inner_steps, "rl.warmup_steps",
         "must be in [0, rl.steps * rl.inner_steps]")
  _check(r.temperature >= 0, "rl.temperature", "must be >= 0")
  _check(r.eval_every >= 0, "rl.eval_every", "must be >= 0")
  n_seq = r.batch_prompts * r.group_size
  _check(r.micro_batch >= 0 and (r.micro_batch == 0 or n_seq % r.micro_batch == 0),
         "rl.micro_batch", f"must be 0 (off) or divide rl.batch_prompts × rl.group_size ="
         f" {n_seq}, got {r.micro_batch}")
  x = config.estimator
  _check(x.num_samples > 0, "estimator.num_samples", "must be positive")
  _check(not x.coupled or x.num_samples % 2 == 0, "estimator.num_samples",
         f"coupled masks come in pairs: needs an even number, got {x.num_samples}")
  _check(0 <= x.prompt_mask_prob < 1, "estimator.prompt_mask_prob", "must be in [0, 1)")
  _check(0 < x.t_eps < 1, "estimator.t_eps", "must be in (0, 1)")
  _check(x.reduction in ("sum", "mean"), "estimator.reduction", "must be sum or mean")
  _check(r.loss != "grpo_token" or (x.name == "mean_field" and x.reduction == "sum"),
         "rl.loss", "grpo_token (d1 per-token ratios) needs estimator.name=mean_field with"
         " estimator.reduction=sum")
  _check(x.spg_block_len > 0, "estimator.spg_block_len", "must be positive")
  bs = config.model.block_size
  _check(bs >= 0, "model.block_size", "must be >= 0 (0 = bidirectional masked diffusion)")
  if bs > 0:
    _check(config.data.completion_len % bs == 0, "model.block_size",
           f"data.completion_len={config.data.completion_len} is not a multiple of {bs}")
    _check(s.block_len == bs, "sampler.block_len",
           f"a block-diffusion model decodes its own blocks: must equal model.block_size={bs}")
    _check(x.name == "block_elbo", "estimator.name",
           "a block-diffusion model (model.block_size > 0) is scored with block_elbo")
  _check(x.name != "block_elbo" or bs > 0, "estimator.name",
         "block_elbo needs a block-diffusion model (model.block_size > 0)")
  _check(x.attention_impl in ("auto", "pallas", "interpret", "reference"),
         "estimator.attention_impl", "must be auto, pallas, interpret or reference")
  _check(r.loss != "spg" or x.name == "spg_block", "rl.loss",
         "spg needs estimator.name=spg_block (it uses the EUBO)")

  e = config.eval
  _check(e.batch_size > 0, "eval.batch_size", "must be positive")
  _check(e.num_samples > 0, "eval.num_samples", "must be positive")
  _check(len(e.pass_k) > 0 and all(isinstance(k, int) and 0 < k <= e.num_samples
                                   for k in e.pass_k), "eval.pass_k",
         f"every k must be in [1, eval.num_samples={e.num_samples}], got {tuple(e.pass_k)}")
  _check(e.temperature >= 0, "eval.temperature", "must be >= 0")
  for key in ("data", "fsdp", "tensor"):
    _check(config.mesh[key] == -1 or config.mesh[key] > 0, f"mesh.{key}",
           f"must be positive or -1 (fill), got {config.mesh[key]}")
  _check([config.mesh[k] for k in ("data", "fsdp", "tensor")].count(-1) <= 1, "mesh",
         "at most one axis may be -1")
  _check(config.distributed.initialize in ("auto", "never", "explicit"), "distributed.initialize",
         f"must be auto, never or explicit, got {config.distributed.initialize!r}")
  _check(config.checkpoint.save_every > 0, "checkpoint.save_every", "must be positive")
  _check(config.checkpoint.keep > 0, "checkpoint.keep", "must be positive")
  _check(config.log.peak_tflops >= 0, "log.peak_tflops", "must be >= 0 (0 = from the device kind)")
  from dllm_rl.train.throughput import parse_steps
  try:
    parse_steps(config.profile.steps)
  except ValueError as err:
    errors.append(ConfigError("profile.steps", str(err)))
  # --- preemption and faults ---
  _check(config.checkpoint.save_every_seconds >= 0, "checkpoint.save_every_seconds",
         "must be >= 0 (0 = step-based saving only)")
  _check(config.train.max_consecutive_nonfinite > 0, "train.max_consecutive_nonfinite",
         "must be positive")
  _check(0 <= config.seed < 2**31, "seed", f"must be in [0, 2**31), got {config.seed}")
  raise_all(errors)
  return given


# --- command-line overrides (--config.a.b=value) ---

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _parse_value(path: str, default, text: str):
  """``text`` as the type of ``default``; raises ConfigError naming ``path``."""
  import ast
  if isinstance(default, ml_collections.ConfigDict):
    raise ConfigError(path, "is a section: set one of its keys, e.g. "
                      f"--config.{path}.{next(iter(default.keys()), 'KEY')}=...")
  try:
    if isinstance(default, bool):
      if text.lower() not in _TRUE + _FALSE:
        raise ValueError
      return text.lower() in _TRUE
    if isinstance(default, int):
      return int(text)
    if isinstance(default, float):
      return float(text)
    if isinstance(default, tuple):
      value = ast.literal_eval(text if text.strip().startswith(("(", "[")) else f"({text},)")
      if not isinstance(value, (tuple, list)):
        raise ValueError
      return tuple(value)
  except (ValueError, SyntaxError):
    raise ConfigError(path, f"expected {type(default).__name__}, got {text!r}") from None
  return text


def _free_form(text: str):
  """A task option value: a Python literal when it parses as one, else the string."""
  import ast
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def apply_overrides(config: ml_collections.ConfigDict,
                    overrides: list[tuple[str, str]]) -> list[ConfigError]:
  """Set ``(dotted key, text)`` pairs (from ``--config.KEY=TEXT``) on ``config``, each parsed
  as the type of the key's current value. Returns every problem (unknown key with a "did you
  mean", wrong type) instead of stopping at the first; good overrides are applied."""
  errors = []
  for dotted, text in overrides:
    *parents, leaf = dotted.split(".")
    node, prefix = config, ""
    try:
      for part in parents:
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
          raise KeyError(prefix + part)
        node, prefix = node[part], prefix + part + "."
      if not isinstance(node, ml_collections.ConfigDict):
        raise KeyError(prefix.rstrip("."))
      if prefix == "task.options." and leaf not in node:
        with node.unlocked():
          node[leaf] = _free_form(text)
        continue
      if leaf not in node:
        raise KeyError(dotted)
      value = (_free_form(text) if prefix == "task.options."
               else _parse_value(dotted, node[leaf], text))
      with node.unlocked():
        node[leaf] = value
    except KeyError as e:
      bad = e.args[0]
      parent = config
      for part in bad.split(".")[:-1]:
        parent = parent[part]
      choices = list(parent.keys()) if isinstance(parent, ml_collections.ConfigDict) else []
      close = difflib.get_close_matches(bad.split(".")[-1], choices, n=1)
      stem = bad.rsplit(".", 1)[0] + "." if "." in bad else ""
      hint = f"; did you mean {stem}{close[0]}?" if close else ""
      errors.append(ConfigError(bad, f"unknown key{hint}"))
    except ConfigError as e:
      errors.append(e)
    except (TypeError, ValueError) as e:
      errors.append(ConfigError(dotted, str(e)))
  return errors
