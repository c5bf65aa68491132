"""Validation of a whole config before anything compiles, at the composition root.

Unknown keys, wrong types, impossible combinations and unknown registry names fail with a
:class:`~dllm_rl.errors.ConfigError` naming the key; every problem is reported at once
(:class:`~dllm_rl.errors.ConfigErrors`). It lives in ``train/`` because it reads the
components' registries and allowed-value lists (``dllm_rl.config`` sits below every
component and imports none of them).
"""

from __future__ import annotations

import math

import ml_collections

from dllm_rl import tasks
from dllm_rl.config.choices import EVAL_PHASES, LR_SCHEDULES, RL_MODES, RUN_MODES, SFT_MODES
from dllm_rl.config.schema import base_config
from dllm_rl.config.unread import is_read
from dllm_rl.diffusion import estimators
from dllm_rl.config.overrides import did_you_mean
from dllm_rl.errors import ConfigError, raise_all
from dllm_rl.infra import writers
from dllm_rl.kernels import grouped_matmul
from dllm_rl.kernels.staircase import ATTENTION_IMPLS
from dllm_rl.models import lora, transformer
from dllm_rl.models.scan import REMAT_POLICIES
from dllm_rl.parallel import distributed
from dllm_rl.paths import BackendMissing
from dllm_rl.registry import unknown_message
from dllm_rl.rl import advantages, losses
from dllm_rl.sampling import configs as sampler_configs
from dllm_rl.sampling import dream_rollout, open_block, remasking
from dllm_rl.train import flops
from dllm_rl.train.context import expert_axis_problem, task_options
from dllm_rl.train.throughput import parse_steps
from dllm_rl.types import DTYPES


def _walk(schema, config, prefix, errors):
  """Type-check ``config`` against ``schema`` (errors appended); return a copy of ``config``
  in which every unknown or mistyped key is replaced by its schema default, so that the value
  checks can still run and report their own errors."""
  clean = ml_collections.ConfigDict()
  for key in config.keys():
    path = f"{prefix}{key}"
    if key not in schema:
      errors.append(ConfigError(path, "unknown key" + did_you_mean(key, schema.keys(), prefix)))
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
    elif isinstance(want, float) and not math.isfinite(got):  # nan passes every > / < check
      errors.append(ConfigError(path, f"must be finite, got {got}"))
      ok = False
    clean[key] = got if ok else want
  return clean


def _names(config, check: "_Checks") -> None:
  """Registry names: mode, task (its contract, its options), remasking policy."""
  check(config.mode in RUN_MODES, "mode", unknown_message("mode", config.mode, RUN_MODES))
  known = config.task.name in tasks.TASKS
  check(known, "task.name", tasks.TASKS.unknown_message(config.task.name))
  problem = tasks.contract_problem(config.task.name) if known else None
  check(problem is None, "task.name", problem or "")  # not building it: not its options' fault
  options = task_options(config)  # mode=eval: no train file beside a test file
  placeholder = any(isinstance(v, str) and v.startswith(REQUIRED_PREFIX) for v in options.values())
  try:
    if known and problem is None and not placeholder:  # placeholders: _required says so
      task = tasks.make_task(config.task.name, **options)
      check(config.mode == "eval" or task.has_split("train"), "task.options.train_file",
            f"task {config.task.name!r} has no train split (only a test file): mode="
            f"{config.mode} trains on it; give a train file, or use mode=eval")
  except (TypeError, ValueError, OSError, BackendMissing) as err:
    check.error(ConfigError("task.options", str(err)))
  if config.sampler.kind != "dream":  # Dream's algs: _dream_sampler
    check(config.sampler.remasking in remasking.REMASKING, "sampler.remasking",
           remasking.REMASKING.unknown_message(config.sampler.remasking))


def _model(config, check: "_Checks") -> None:
  """``model``: sizes, heads, dtypes, remat, logits chunk."""
  m = config.model
  for key in ("d_model", "n_layers", "n_heads", "mlp_hidden"):
    check(m[key] > 0, f"model.{key}", f"must be positive, got {m[key]}")
  for key in ("vocab_size", "n_kv_heads", "head_dim"):
    check(m[key] >= 0, f"model.{key}", f"must be >= 0 (0 = derived), got {m[key]}")
  if m.n_heads > 0 and m.n_kv_heads >= 0 and m.d_model > 0 and m.head_dim >= 0:
    n_kv = m.n_kv_heads or m.n_heads
    check(m.n_heads % n_kv == 0, "model.n_kv_heads",
           f"n_heads={m.n_heads} must be a multiple of n_kv_heads={n_kv}")
    head_dim = m.head_dim or m.d_model // m.n_heads
    check(m.head_dim or m.d_model % m.n_heads == 0, "model.head_dim",
           f"0 (derived) needs d_model={m.d_model} divisible by n_heads={m.n_heads}")
    check(head_dim % 2 == 0, "model.head_dim", f"must be even for RoPE, got {head_dim}")
  for key in ("dtype", "param_dtype"):
    check(m[key] in DTYPES, f"model.{key}", f"must be one of {tuple(DTYPES)}, got {m[key]!r}")
  check(m.remat in REMAT_POLICIES, "model.remat",
         f"must be one of {sorted(REMAT_POLICIES)}, got {m.remat!r}")
  check(m.logits_chunk >= 0, "model.logits_chunk", f"must be >= 0, got {m.logits_chunk}")
  check(m.moe_dispatch in grouped_matmul.DISPATCHES, "model.moe_dispatch",
         f"must be one of {grouped_matmul.DISPATCHES}, got {m.moe_dispatch!r}")
  check(m.moe_dispatch != "mosaic_gpu" or m.dtype == "bfloat16", "model.moe_dispatch",
        f"'mosaic_gpu' multiplies bfloat16 operands (wgmma); model.dtype is {m.dtype!r}")
  for key in ("rope_theta", "rms_norm_eps", "init_std"):
    check(m[key] > 0, f"model.{key}", f"must be positive, got {m[key]}")
  if m.n_heads > 0 and m.head_dim >= 0 and m.d_model > 0:
    for field, msg in transformer.moe_problems(m, m.head_dim or m.d_model // m.n_heads):
      check(False, f"model.{field}", msg)


def _lora(config, check: "_Checks") -> None:
  """``lora``: rank, alpha, targets, the frozen base's dtype."""
  a = config.lora
  check(a.rank >= 0, "lora.rank", f"must be >= 0 (0 = off), got {a.rank}")
  check(a.alpha > 0, "lora.alpha", f"must be positive, got {a.alpha}")
  unknown = [t for t in a.targets if t not in lora.TARGETS]
  check(not unknown, "lora.targets", f"unknown {unknown}; choose from {tuple(lora.TARGETS)}")
  check(a.rank == 0 or len(a.targets) > 0, "lora.targets", "empty: name at least one projection")
  repeated = sorted({t for t in a.targets if list(a.targets).count(t) > 1})
  check(not repeated, "lora.targets", f"{repeated} named more than once")
  check(a.base_dtype in DTYPES, "lora.base_dtype",
        f"must be one of {tuple(DTYPES)}, got {a.base_dtype!r}")


def _data(config, check: "_Checks") -> None:
  """``data`` and the task sizes."""
  d = config.data
  for key in ("prompt_len", "completion_len", "batch_size"):
    check(d[key] > 0, f"data.{key}", f"must be positive, got {d[key]}")
  buckets = tuple(d.prompt_buckets)
  increasing = (all(isinstance(w, int) and w > 0 for w in buckets)
                and list(buckets) == sorted(set(buckets)))
  message = f"must be increasing positive ints <= data.prompt_len={d.prompt_len}, got {buckets}"
  check(increasing, "data.prompt_buckets", message)
  check(not increasing or all(w <= d.prompt_len for w in buckets), "data.prompt_buckets",
        message, given=("data.prompt_len",))
  # data.batch_size is the SFT batch: rl and eval never read it (rl.batch_prompts: _rl)
  trains = config.mode in SFT_MODES or config.mode in RL_MODES
  check(not trains or config.task.train_size > 0, "task.train_size",
        f"must be positive when the run trains (mode={config.mode}), got"
        f" {config.task.train_size}")
  check(config.mode not in SFT_MODES or config.task.train_size >= d.batch_size,
        "task.train_size", f"{config.task.train_size} is smaller than data.batch_size ="
        f" {d.batch_size}, the SFT batch (mode={config.mode})",
        given=("task.train_size", "data.batch_size"))
  check(config.task.test_size > 0, "task.test_size", "must be positive")
  check(config.task.val_size > 0, "task.val_size", "must be positive")


# Unmasking orders drawn at random (LLaDA's random remasking, Dream's origin): samples differ
# at temperature 0.
_RANDOM_ORDER = ("random", "origin")


def _sampler(config, check: "_Checks") -> None:
  """``sampler``: blocks, steps, temperature, threshold, cache."""
  s, d = config.sampler, config.data
  check(s.block_len > 0, "sampler.block_len", "must be positive")
  num_blocks = max(d.completion_len // s.block_len, 1) if s.block_len > 0 else 0
  if s.block_len > 0 and d.completion_len > 0:
    check(d.completion_len % s.block_len == 0, "sampler.block_len",
           f"data.completion_len={d.completion_len} is not a multiple of"
           f" sampler.block_len={s.block_len}")
    # threshold mode reads the steps nowhere else (dllm_rl.config.unread): the value to give
    unread = (f"; with sampler.threshold > 0 nothing else reads it (a block runs until it is"
              f" complete): set it to data.completion_len = {d.completion_len}"
              if s.threshold > 0 else "")
    multiple = (f"{s.steps} must be a positive multiple of the number of blocks ({num_blocks})"
                + unread)
    check(s.steps > 0, "sampler.steps", multiple)
    check(s.steps <= 0 or s.steps % num_blocks == 0, "sampler.steps", multiple,
          given=("sampler.block_len",))  # the number of blocks of a valid block length
    check(s.steps // num_blocks <= s.block_len or s.kind == "dream", "sampler.steps",
           f"{s.steps // num_blocks} steps per block exceed sampler.block_len={s.block_len}"
           " (some steps would commit nothing)" + unread,  # Dream's own sampler allows it
           given=("sampler.block_len",))
  check(s.temperature == 0, "sampler.temperature", f"is not read, got {s.temperature}:"
        " validation and test decode greedily, pass@k samples at eval.temperature and RL"
        " rollouts at rl.temperature: set those")
  check(0 <= s.threshold < 1, "sampler.threshold", "must be in [0, 1)")
  check(s.threshold == 0 or s.remasking != "entropy" or s.kind == "dream", "sampler.threshold",
        f"{s.threshold} with sampler.remasking=entropy commits one token per step: the entropy"
        " confidence (-H) is never above 0, so no token passes the threshold",
        given=("sampler.threshold",))
  check(s.cache in open_block.CACHES, "sampler.cache", open_block.CACHES.unknown_message(s.cache))
  check(s.cache_refresh >= 0, "sampler.cache_refresh", "must be >= 0 (0 = block starts only)")
  check(s.cache_refresh == 0 or s.cache != "none", "sampler.cache_refresh",
        f"{s.cache_refresh} refreshes a cache, and sampler.cache is 'none'")
  if s.cache_refresh > 0 and s.cache != "none" and num_blocks and s.steps > 0:
    per_block, what = ((s.block_len, "sampler.block_len in threshold mode") if s.threshold > 0
                       else (s.steps // num_blocks, "sampler.steps / blocks"))
    check(s.cache_refresh < per_block, "sampler.cache_refresh",
          f"{s.cache_refresh} refreshes nothing: a block runs at most {per_block} steps ({what}),"
          " numbered from 0, and step 0 already runs on a fresh cache: the same as 0; set it"
          f" below {per_block}", given=("sampler.steps", "sampler.block_len", "sampler.threshold"))
  check(s.cache == "none" or not config.model.block_size, "sampler.cache",
         "a block-diffusion model (model.block_size > 0) decodes with its own KV cache:"
         " leave sampler.cache = 'none'", given=("model.block_size",))
  check(s.kind in sampler_configs.KINDS, "sampler.kind",
        unknown_message("sampler kind", s.kind, sampler_configs.KINDS))
  if s.kind == "dream":
    _dream_sampler(config, check)
  else:
    for key, off in (("top_p", 1.0), ("top_k", 0)):
      check(s[key] == off, f"sampler.{key}", f"{s[key]}: only Dream's sampler filters its"
            " proposals (sampler.kind=dream); the masked sampler draws from the whole"
            f" distribution: leave it at {off}", given=("sampler.kind",))


def _dream_sampler(config, check: "_Checks") -> None:
  """``sampler.kind = "dream"`` (dllm_rl.sampling.dream_rollout): one block, Dream's algs,
  none of the masked sampler's threshold / cache / exclude_mask."""
  s, d = config.sampler, config.data
  check(not config.model.block_size, "sampler.kind", "'dream' decodes a model without blocks;"
        " a block model (model.block_size > 0) decodes with the block sampler: leave"
        " sampler.kind = 'masked'")
  check(s.block_len == d.completion_len, "sampler.block_len",
        f"{s.block_len}: Dream's sampler decodes the whole completion as one block (sampler."
        f"kind=dream): set it to data.completion_len = {d.completion_len}",
        given=("data.completion_len",))
  algs = dream_rollout.DREAM_ALGS
  name = dream_rollout.DREAM_NAME_OF.get(s.remasking)
  check(s.remasking in algs, "sampler.remasking",
        f"{s.remasking!r} is not one of Dream's algs {algs} (sampler.kind=dream)"
        + (f"; Dream's name for it is {name!r}" if name and name != s.remasking else ""))
  check(s.threshold == 0, "sampler.threshold", f"{s.threshold}: a masked-sampler setting;"
        " Dream's confidence_threshold decodes one prompt at a time, officially, so"
        " sampler.kind=dream does not offer it: leave it at 0")
  check(s.cache == "none", "sampler.cache", f"{s.cache!r}: the masked sampler's caches;"
        " Dream's sampler runs its full forwards (sampler.kind=dream): leave it 'none'")
  check(not s.exclude_mask, "sampler.exclude_mask", "Dream's sampler proposes over the whole"
        " vocabulary, as officially (sampler.kind=dream): leave it False")
  check(0 < s.eps < 1, "sampler.eps", f"must be in (0, 1), got {s.eps}")
  check(0 < s.top_p <= 1, "sampler.top_p", f"must be in (0, 1] (1 = off), got {s.top_p}")
  check(s.top_k >= 0, "sampler.top_k", f"must be >= 0 (0 = off), got {s.top_k}")


def _sft(config, check: "_Checks") -> None:
  """``sft``: steps, learning rate and schedule, masking rate, logging."""
  f = config.sft
  check(f.steps >= 0, "sft.steps", "must be >= 0")
  check(f.schedule in LR_SCHEDULES, "sft.schedule",
         f"must be one of {LR_SCHEDULES}, got {f.schedule!r}")
  check(0 <= f.min_lr_ratio <= 1, "sft.min_lr_ratio", f"must be in [0, 1], got {f.min_lr_ratio}")
  message = (f"must be in [0, sft.steps] = [0, {max(f.steps, 0)}], got {f.warmup_steps} (for a"
             " run this short set sft.warmup_steps=0)")
  check(f.warmup_steps >= 0, "sft.warmup_steps", message)
  check(f.warmup_steps < 0 or f.warmup_steps <= f.steps, "sft.warmup_steps", message,
        given=("sft.steps",))
  check(0 < f.t_eps < 1, "sft.t_eps", "must be in (0, 1)")
  check(f.log_every > 0, "sft.log_every", "must be positive")
  check(f.eval_every >= 0, "sft.eval_every", "must be >= 0")
  check(0 <= f.target_accuracy <= 1, "sft.target_accuracy", "must be in [0, 1]")


def _optimizer(config, check: "_Checks") -> None:
  """The AdamW settings of ``sft`` and ``rl`` (dllm_rl.train.optim): lr, β1, β2, weight
  decay, gradient clip. A zero or negative lr trains nothing or ascends the loss."""
  for name in ("sft", "rl"):
    o = config[name]
    check(o.lr > 0, f"{name}.lr", f"must be positive, got {o.lr}")
    for key in ("b1", "b2"):
      check(0 <= o[key] < 1, f"{name}.{key}", f"Adam's decay rate must be in [0, 1), got {o[key]}")
    check(o.weight_decay >= 0, f"{name}.weight_decay", f"must be >= 0, got {o.weight_decay}")
    check(o.grad_clip >= 0, f"{name}.grad_clip", f"must be >= 0 (0 = off), got {o.grad_clip}")


def _rl(config, check: "_Checks") -> None:
  """``rl``: registry names, sizes, clipping, β schedule, KL, schedule, micro-batches."""
  r = config.rl
  check(r.loss in losses.LOSSES, "rl.loss", losses.LOSSES.unknown_message(r.loss))
  check(r.advantage in advantages.ADVANTAGES, "rl.advantage",
         advantages.ADVANTAGES.unknown_message(r.advantage))
  check(config.estimator.name in estimators.ESTIMATORS, "estimator.name",
         estimators.ESTIMATORS.unknown_message(config.estimator.name))
  for key in ("steps", "batch_prompts", "inner_steps", "log_every"):
    check(r[key] > 0, f"rl.{key}", f"must be positive, got {r[key]}")
  check(r.group_size >= 2, "rl.group_size", "group advantages need at least 2 completions")
  check(r.clip in losses.CLIP_MODES, "rl.clip", f"must be one of {losses.CLIP_MODES}")
  check(r.clip_C > 1, "rl.clip_C", "must be > 1")
  check(r.self_normalize or r.clip != "none", "rl.self_normalize",
         "False with rl.clip=none leaves the StableDRL weight ρ̂/G unbounded; keep one of the two")
  check(0 < r.eps < 1, "rl.eps", "must be in (0, 1)")
  check(r.beta_schedule in advantages.BETA_SCHEDULES, "rl.beta_schedule",
         f"must be one of {advantages.BETA_SCHEDULES}")
  check(r.kl_estimator in losses.KL_ESTIMATORS, "rl.kl_estimator",
         f"must be one of {losses.KL_ESTIMATORS}")
  check(r.kl_coef >= 0, "rl.kl_coef", "must be >= 0")
  check(r.kl_level in losses.KL_LEVELS, "rl.kl_level",
        unknown_message("KL level", r.kl_level, losses.KL_LEVELS))
  check(r.ref_sync_every >= 0, "rl.ref_sync_every", f"must be >= 0 (0 = a fixed reference),"
        f" got {r.ref_sync_every}")
  check(0 < r.ref_sync_alpha <= 1, "rl.ref_sync_alpha", f"must be in (0, 1], got"
        f" {r.ref_sync_alpha}")
  check(not (r.ref_sync_every and config.lora.rank), "rl.ref_sync_every", "a synced reference"
        " with LoRA (lora.rank > 0): a LoRA run's checkpoints keep the adapters only, and its"
        " reference is rebuilt from the base on resume, so a synced one would be lost; leave"
        " rl.ref_sync_every at 0 (as TRL refuses sync_ref_model with PEFT)")
  check(r.schedule in LR_SCHEDULES, "rl.schedule", f"must be one of {LR_SCHEDULES}")
  check(0 <= r.min_lr_ratio <= 1, "rl.min_lr_ratio", f"must be in [0, 1], got {r.min_lr_ratio}")
  updates = r.steps * r.inner_steps
  message = (f"must be in [0, rl.steps * rl.inner_steps] = [0, {updates}] (it counts optimizer"
             " updates; for a run this short set rl.warmup_steps=0)")
  check(r.warmup_steps >= 0, "rl.warmup_steps", message)
  check(r.warmup_steps < 0 or r.warmup_steps <= updates, "rl.warmup_steps", message,
        given=("rl.steps", "rl.inner_steps"))
  check(r.temperature >= 0, "rl.temperature", f"must be >= 0, got {r.temperature}: a negative"
        " temperature samples from softmax(−logits / |T|): it favours the least likely tokens")
  check(r.temperature != 0 or config.sampler.remasking in _RANDOM_ORDER, "rl.temperature",
        f"must be positive, got {r.temperature}: at 0 the rollouts are greedy, so with"
        f" sampler.remasking={config.sampler.remasking!r} every completion of a group is the"
        " same, its group-relative advantages are 0 and RL learns nothing",
        given=("sampler.remasking",))
  check(r.eval_every >= 0, "rl.eval_every", "must be >= 0")
  check(config.mode not in ("rl", "pipeline") or r.batch_prompts <= config.task.train_size,
        "rl.batch_prompts", f"{r.batch_prompts} is larger than task.train_size ="
        f" {config.task.train_size}: a rollout batch draws that many distinct training prompts",
        given=("task.train_size",))
  n_seq = r.batch_prompts * r.group_size
  message = (f"must be 0 (off) or divide rl.batch_prompts × rl.group_size = {n_seq}, got"
             f" {r.micro_batch}")
  check(r.micro_batch >= 0, "rl.micro_batch", message)
  check(r.micro_batch <= 0 or n_seq % r.micro_batch == 0, "rl.micro_batch", message,
        given=("rl.batch_prompts", "rl.group_size"))


def _estimator(config, check: "_Checks") -> None:
  """``estimator`` and the combinations it must make with the model and the loss."""
  x, r, s = config.estimator, config.rl, config.sampler
  check(x.num_samples > 0, "estimator.num_samples", "must be positive")
  # only where the run reads estimator.coupled (the 1/t ELBO, in RL): elsewhere it is unread,
  # which dllm_rl.config.unread says, and num_samples is not drawn in pairs
  check(not x.coupled or x.num_samples % 2 == 0 or not is_read(config, "estimator.coupled"),
        "estimator.num_samples",
        f"coupled masks come in pairs: needs an even number, got {x.num_samples}",
        given=("estimator.num_samples",))
  check(0 <= x.prompt_mask_prob < 1, "estimator.prompt_mask_prob", "must be in [0, 1)")
  check(0 < x.t_eps < 1, "estimator.t_eps", "must be in (0, 1)")
  check(x.reduction in estimators.REDUCTIONS, "estimator.reduction",
         f"must be one of {estimators.REDUCTIONS}")
  per_token_sum = x.name in estimators.REDUCIBLE and x.reduction == "sum"
  check(r.loss != "grpo_token" or per_token_sum, "rl.loss",
         "grpo_token (d1 per-token ratios) needs per-token sums: estimator.name=mean_field"
         " (d1), elbo (DiffuCoder) or trajectory (TraceRL) with estimator.reduction=sum",
         given=("estimator.name", "estimator.reduction"))
  check(r.loss != "grpo_token" or x.name != "elbo" or x.antithetic, "estimator.antithetic",
        "must be True with rl.loss=grpo_token on estimator.name=elbo: the loss compares each"
        " token's log-prob under θ and θ_old, and with independent masks a token masked in one"
        " draw and not the other has a ratio exp(±w·log p) of mask noise alone (DiffuCoder's"
        " coupled-GRPO shares the masks: configs/coupled_grpo.py)")
  check(r.loss != "espo" or per_token_sum, "rl.loss",
         "espo divides the sequence ELBO by the generated length itself (its per-token"
         " ratio normalisation): needs estimator.name=elbo (or mean_field, trajectory) with"
         " estimator.reduction=sum", given=("estimator.name", "estimator.reduction"))
  check(r.kl_level != "token" or r.kl_coef == 0 or per_token_sum, "rl.kl_level",
        "token: a KL per action token needs per-token log-probabilities: estimator.name="
        "mean_field, elbo or trajectory with estimator.reduction=sum",
        given=("estimator.name", "estimator.reduction"))
  check(not x.full_mask_term or x.name == "elbo", "estimator.full_mask_term",
         f"is an option of estimator.name=elbo, not {x.name!r}", given=("estimator.name",))
  check(x.spg_block_len > 0, "estimator.spg_block_len", "must be positive")
  check(x.spg_beta > 0, "estimator.spg_beta", f"must be > 0, got {x.spg_beta}: the EUBO is"
        " (1/β)·log mean_k p^β / t_k (0 divides by zero: every loss NaN, every update skipped)")
  check(0 <= x.spg_omega <= 1, "estimator.spg_omega", f"must be in [0, 1], got {x.spg_omega}:"
        " the weight of the EUBO in the mixture ω·EUBO + (1 − ω)·ELBO for A ≤ 0")
  shrink = x.trajectory_shrink
  check(shrink >= 1, "estimator.trajectory_shrink",
        f"must be an integer >= 1 (distinct denoising steps per forward pass), got {shrink!r}")
  bs = config.model.block_size
  scores = config.mode in ("rl", "pipeline")  # only RL scores with the estimator (not sft, eval)
  check(bs >= 0, "model.block_size", "must be >= 0 (0 = bidirectional masked diffusion)")
  if bs > 0:
    check(config.data.completion_len % bs == 0, "model.block_size",
           f"data.completion_len={config.data.completion_len} is not a multiple of {bs}",
           given=("data.completion_len",))
    check(s.block_len == bs, "sampler.block_len",
           f"a block-diffusion model decodes its own blocks: must equal model.block_size={bs}")
    check(not scores or x.name in ("block_elbo", "trajectory"), "estimator.name",
           "a block-diffusion model (model.block_size > 0) is scored with block_elbo or"
           " trajectory")
  check(not scores or x.name != "block_elbo" or bs > 0, "estimator.name",
         "block_elbo needs a block-diffusion model (model.block_size > 0)")
  check(not (config.model.logit_shift and bs > 0), "model.logit_shift",
         "the logit shift (Dream) needs a bidirectional model (model.block_size = 0): in the"
         " block-diffusion layouts a noisy block's first row would read a clean row")
  check(x.attention_impl in ATTENTION_IMPLS, "estimator.attention_impl",
         f"must be one of {ATTENTION_IMPLS}, got {x.attention_impl!r}")
  check(r.loss != "spg" or x.name == "spg_block", "rl.loss",
         "spg needs estimator.name=spg_block (it uses the EUBO)", given=("estimator.name",))
  # a registered estimator the FLOP count leaves out: otherwise a ValueError after SFT, at
  # the first RL step's metrics (an unregistered name is reported by _rl)
  check(not scores or x.name not in estimators.ESTIMATORS or flops.counted(x.name),
        "estimator.name", flops.no_flop_count(x.name))


def _eval(config, check: "_Checks") -> None:
  """``eval``: batch, samples, pass@k, which weights mode=eval reads."""
  e = config.eval
  check(e.batch_size > 0, "eval.batch_size", "must be positive")
  check(e.num_samples > 0, "eval.num_samples", "must be positive")
  ks = tuple(e.pass_k)
  message = f"every k must be in [1, eval.num_samples={e.num_samples}], got {ks}"
  positive = len(ks) > 0 and all(isinstance(k, int) and k > 0 for k in ks)
  check(positive, "eval.pass_k", message)
  check(not positive or all(k <= e.num_samples for k in ks), "eval.pass_k", message,
        given=("eval.num_samples",))
  check(e.temperature >= 0, "eval.temperature", f"must be >= 0, got {e.temperature}")
  check(e.temperature != 0 or e.num_samples == 1 or config.sampler.remasking in _RANDOM_ORDER,
        "eval.temperature", f"0 with eval.num_samples={e.num_samples} draws identical samples"
        " (greedy, and the unmasking order is not random): pass@k would equal pass@1 and the"
        " diversity 1; set a temperature > 0, or eval.num_samples=1 with eval.pass_k=1",
        given=("eval.num_samples", "sampler.remasking"))
  check(e.phase in EVAL_PHASES, "eval.phase", unknown_message("eval phase", e.phase, EVAL_PHASES))
  check(e.checkpoint_step >= -1, "eval.checkpoint_step",
        f"must be a saved step or -1 (the newest), got {e.checkpoint_step}")
  if config.mode == "eval" and e.phase == "base":
    check(bool(config.model.hf_checkpoint), "eval.phase",
          "base evaluates the weights of model.hf_checkpoint: set it (or use auto | sft | rl)")
    check(e.checkpoint_step == -1, "eval.checkpoint_step",
          f"base (model.hf_checkpoint) has no steps: leave -1, got {e.checkpoint_step}")


def _runtime(config, check: "_Checks") -> None:
  """``mesh``, ``distributed``, ``checkpoint``, ``log``, ``profile``, ``train``, ``seed``."""
  for key in ("data", "fsdp", "tensor"):
    check(config.mesh[key] == -1 or config.mesh[key] > 0, f"mesh.{key}",
           f"must be positive or -1 (fill), got {config.mesh[key]}")
  check([config.mesh[k] for k in ("data", "fsdp", "tensor")].count(-1) <= 1, "mesh",
         "at most one axis may be -1")
  problem = expert_axis_problem(config.mesh.expert, config.model.n_experts,
                                known=not config.model.hf_checkpoint)
  check(problem is None, "mesh.expert", problem or "")
  for err in distributed.config_problems(config.distributed):  # the env's values: initialize
    check.error(err)
  check(config.checkpoint.save_every > 0, "checkpoint.save_every", "must be positive")
  check(config.checkpoint.keep > 0, "checkpoint.keep", "must be positive")
  check(config.log.peak_tflops >= 0, "log.peak_tflops", "must be >= 0 (0 = from the device kind)")
  check(config.log.samples_every >= 0, "log.samples_every", "must be >= 0 (0 = off)")
  check(config.log.num_samples > 0, "log.num_samples", "must be positive")
  missing = config.log.wandb_project and writers.wandb_missing()
  check(not missing, "log.wandb_project", missing or "")
  try:
    window = parse_steps(config.profile.steps)
  except ValueError as err:
    check.error(ConfigError("profile.steps", str(err)))
  else:
    check(window is None or config.mode not in ("rl", "pipeline")
          or window[0] <= config.rl.steps, "profile.steps",
          f"{config.profile.steps!r} starts past rl.steps={config.rl.steps}: no trace would be"
          " written", given=("rl.steps",))
  # --- preemption and faults ---
  check(config.checkpoint.save_every_seconds >= 0, "checkpoint.save_every_seconds",
         "must be >= 0 (0 = step-based saving only)")
  check(config.train.max_consecutive_nonfinite > 0, "train.max_consecutive_nonfinite",
         "must be positive")
  check(0 <= config.seed < 2**31, "seed", f"must be in [0, 2**31), got {config.seed}")


class _Checks:
  """Collects problems: ``check(cond, key, message)`` records one when ``cond`` is False.
  ``given``: the other keys a check derives its bound from (``rl.warmup_steps`` is bounded by
  ``rl.steps * rl.inner_steps``); where one of them is itself reported, the derived problem
  is dropped (:meth:`kept`): it restates that key's problem under another key (once:
  ``rl.steps=-1`` also said ``rl.warmup_steps: must be in [0, -2]``)."""

  def __init__(self, errors: list[ConfigError]):
    self.errors = errors
    self.given: dict[int, tuple[str, ...]] = {}  # id of a derived problem -> its given keys

  def __call__(self, cond: bool, key: str, message: str, *, given: tuple[str, ...] = ()) -> None:
    if not cond:
      self.errors.append(err := ConfigError(key, message))
      if given:
        self.given[id(err)] = given

  def error(self, err: ConfigError) -> None:
    self.errors.append(err)

  def kept(self) -> list[ConfigError]:
    """The problems, in order, without the derived ones whose given keys are reported (by a
    check of their own: a derived problem does not silence another)."""
    reported = {e.key for e in self.errors if id(e) not in self.given}
    return [e for e in self.errors if not reported.intersection(self.given.get(id(e), ()))]


REQUIRED_PREFIX = "REQUIRED:"  # a config file's placeholder for a value the user must give


def _required(config, check: "_Checks", prefix: str = "", mode: str = "",
              unread: frozenset = frozenset()) -> None:
  """Every placeholder ``"REQUIRED: what"`` still in the config, each its own error (a
  production config lists several: checkpoint, train file, test file). A task option the run
  never reads (:func:`task_options`: mode=eval's train file beside a test file) is no error;
  mode=eval's train file read without a test file says how to leave it out."""
  if not prefix:
    mode = config.get("mode", "")
    options = config.task.options if "task" in config and "options" in config.task else {}
    unread = frozenset(f"task.options.{key}" for key in options
                       if key not in task_options(config))
  for key in config.keys():
    value, name = config[key], f"{prefix}{key}"
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      _required(value, check, f"{name}.", mode, unread)
    elif isinstance(value, str) and value.startswith(REQUIRED_PREFIX) and name not in unread:
      what = value[len(REQUIRED_PREFIX):].strip()
      hint = (" (mode=eval reads it only without a test file: --config.task.options.test_file"
              "=... leaves it out)" if mode == "eval" and name == "task.options.train_file"
              else "")
      check(False, name, f"required value not set ({what}): pass --config.{name}=...{hint}")


_SECTIONS = (_required, _names, _model, _lora, _data, _sampler, _sft, _optimizer, _rl, _estimator,
             _eval, _runtime)


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Raise ConfigError (ConfigErrors when several) listing every problem found; return the
  config otherwise. Unknown or mistyped keys are reported and their defaults are used for the
  remaining value checks, so one run lists everything."""
  errors: list[ConfigError] = []
  clean = _walk(base_config(), config, "", errors)
  check = _Checks(errors)
  for section in _SECTIONS:
    section(clean, check)
  raise_all(check.kept())
  return config
