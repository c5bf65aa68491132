"""Config values the run's own choices never read: set away from their defaults, they change
nothing, so the run says so before anything compiles (one warning per key on stderr).

An estimator reads only its own options (``coupled`` is the 1/t ELBO's, ``spg_beta`` SPG's
block estimator's), a loss only its own (``clip_C`` is StableDRL's), an advantage only its
own (``beta_end`` is StepRS's); with ``model.hf_checkpoint`` the model's size keys are its
config.json's (``model.d_model`` and the rest of :data:`HF_ARCHITECTURE`); a dense model reads
no MoE option (:data:`MOE_OPTIONS`), a training run no ``eval.phase``, a run without a W&B
project no ``log.wandb_entity``, one process (``distributed.initialize=never``) no process key
(:data:`DISTRIBUTED_PROCESS`). (A LoRA run stores its frozen base in ``lora.base_dtype``, yet
reads ``model.param_dtype``: ``convert export`` writes the merged weights in it.) A value the run
ignores is not an error (a sweep may set a key for every arm, or a config file for several
losses), but a user who set ``rl.beta_end=4`` with centered advantages must not believe
StepRS ran. ``dllm_rl.train.validate`` rejects the
settings that would mislead outright (``sampler.temperature``, read by no sampler; settings
that are read but degenerate, such as a threshold with entropy remasking).
"""

from __future__ import annotations

import itertools
import json
from typing import Callable

import ml_collections

from dllm_rl.config.schema import base_config
from dllm_rl.registry import SELECTED_BY

_STEPRS = ("steprs", "steprs_rms_matched", "steprs_mass_matched")
# The model keys an HF checkpoint's config.json replaces (dllm_rl.train.hf_source.hf_model_config
# keeps only the dtypes and hf_run_options: scan_layers, remat, moe_dispatch; block_size is
# checked against the checkpoint, prompt_block_causal (block models) and logits_chunk are read
# by the samplers and scorers).
HF_ARCHITECTURE = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                   "mlp_hidden", "rope_theta", "rms_norm_eps", "tie_embeddings", "qk_norm",
                   "qkv_bias", "logit_shift", "init_std", "n_experts", "experts_per_token",
                   "moe_hidden", "n_shared_experts", "n_expert_groups", "topk_groups",
                   "routed_scaling", "first_dense_layers", "rotary_dim")
# The MoE options a dense model (model.n_experts = 0) does not read (the expert axis of a dense
# model is an error: dllm_rl.train.validate).
MOE_OPTIONS = ("experts_per_token", "moe_hidden", "n_shared_experts", "n_expert_groups",
               "topk_groups", "routed_scaling", "first_dense_layers", "moe_dispatch")
# The process keys of config.distributed (dllm_rl.parallel.distributed.plan).
DISTRIBUTED_PROCESS = ("coordinator_address", "num_processes", "process_id", "local_device_ids")
# The keys that select a component the rules name (a registry's, dllm_rl.registry.SELECTED_BY).
COMPONENT_KEYS = ("rl.loss", "rl.advantage", "estimator.name")
# The modes that read a section or a key (a key's own entry first; others: every mode). The
# staircase attention also serves a block model's SFT (dllm_rl.train.sft_step.ESTIMATOR_KEYS).
_MODES = {"estimator": ("rl", "pipeline"), "rl": ("rl", "pipeline"),
          "sft": ("sft", "pipeline"), "estimator.attention_impl": ("sft", "rl", "pipeline")}

# (key, whether the run reads it, who does): a key is checked only where its value differs
# from the schema's default.
RULES: tuple[tuple[str, Callable[[ml_collections.ConfigDict], bool], str], ...] = (
    ("estimator.num_samples", lambda c: c.estimator.name in ("elbo", "block_elbo", "spg_block"),
     "the estimators elbo, block_elbo and spg_block draw K samples"),
    ("estimator.coupled", lambda c: c.estimator.name == "elbo", "an option of estimator.name=elbo"),
    ("estimator.stratified", lambda c: c.estimator.name == "elbo",
     "an option of estimator.name=elbo"),
    ("estimator.t_eps", lambda c: c.estimator.name in ("elbo", "block_elbo"),
     "the estimators elbo and block_elbo draw t in [t_eps, 1]"),
    ("estimator.reduction", lambda c: c.estimator.name in ("mean_field", "elbo", "trajectory"),
     "block_elbo and spg_block are always length-normalised"),
    ("estimator.prompt_mask_prob", lambda c: c.estimator.name != "trajectory",
     "the trajectory estimator scores the rollout's own states"),
    ("estimator.spg_beta", lambda c: c.estimator.name == "spg_block",
     "an option of estimator.name=spg_block"),
    ("estimator.spg_block_len", lambda c: c.estimator.name == "spg_block",
     "an option of estimator.name=spg_block"),
    ("estimator.spg_omega",
     lambda c: c.estimator.name == "spg_block" and c.rl.loss in ("stabledrl", "spg"),
     "the EUBO weight of rl.loss=stabledrl or spg with estimator.name=spg_block"),
    ("estimator.antithetic",
     lambda c: c.rl.loss not in ("wd1", "spg") and c.estimator.name != "trajectory",
     "shared masks for ℓ̂_old and ℓ̂_θ: the wd1 and spg losses use no ℓ̂_old (only the"
     " logged ratio metrics follow it), and the trajectory estimator draws no masks"),
    ("rl.beta", lambda c: c.rl.advantage == "risk_sensitive",
     "the risk coefficient of rl.advantage=risk_sensitive (StepRS: rl.beta_start / beta_end)"),
    ("rl.beta_start", lambda c: c.rl.advantage in _STEPRS, "the steprs advantages' schedule"),
    ("rl.beta_end", lambda c: c.rl.advantage in _STEPRS, "the steprs advantages' schedule"),
    ("rl.beta_schedule", lambda c: c.rl.advantage in _STEPRS, "the steprs advantages' schedule"),
    ("rl.control_per_state",
     lambda c: c.rl.advantage in ("steprs_rms_matched", "steprs_mass_matched"),
     "an option of the steprs_*_matched controls"),
    ("rl.clip", lambda c: c.rl.loss == "stabledrl", "an option of rl.loss=stabledrl"),
    ("rl.clip_C", lambda c: c.rl.loss == "stabledrl" and c.rl.clip == "upper",
     "the bound of rl.loss=stabledrl with rl.clip=upper"),
    ("rl.self_normalize", lambda c: c.rl.loss == "stabledrl", "an option of rl.loss=stabledrl"),
    ("rl.eps", lambda c: c.rl.loss in ("grpo", "grpo_token", "espo")
     or (c.rl.loss == "stabledrl" and c.rl.clip == "symmetric"),
     "the clip range of rl.loss=grpo, grpo_token, espo and of stabledrl with rl.clip=symmetric"
     " (this loss reads it only for the logged bypass_fraction)"),
    ("rl.kl_estimator", lambda c: c.rl.kl_coef > 0, "read only with rl.kl_coef > 0"),
    ("rl.kl_level", lambda c: c.rl.kl_coef > 0, "read only with rl.kl_coef > 0"),
    ("rl.ref_sync_every", lambda c: c.rl.kl_coef > 0,
     "the reference of the KL term: read only with rl.kl_coef > 0"),
    ("rl.ref_sync_alpha", lambda c: c.rl.kl_coef > 0 and c.rl.ref_sync_every > 0,
     "read only with rl.kl_coef > 0 and rl.ref_sync_every > 0"),
    ("sft.target_accuracy", lambda c: 0 < c.sft.eval_every <= c.sft.steps,
     "checked at each SFT validation, and none runs within sft.steps (sft.eval_every is 0 or"
     " above it): SFT runs all its steps"),
    ("profile.steps", lambda c: c.mode in ("rl", "pipeline"),
     "a trace of RL steps: an SFT or eval run writes none"),
    ("rl.min_lr_ratio", lambda c: c.rl.schedule != "constant",
     "the floor of a decaying rl.schedule (cosine / linear)"),
    ("sft.min_lr_ratio", lambda c: c.sft.schedule != "constant",
     "the floor of a decaying sft.schedule (cosine / linear)"),
    ("sampler.eps", lambda c: c.sampler.kind == "dream" and not c.model.block_size,
     "the schedule of Dream's sampler (sampler.kind=dream)"),
    ("sampler.stop_at_eos", lambda c: c.sampler.kind != "dream" or c.model.block_size,
     "the masked and block samplers' early stop: Dream's sampler (sampler.kind=dream) runs"
     " all its steps, as officially"),
    ("sampler.steps", lambda c: c.sampler.threshold == 0
     or c.sampler.steps == c.data.completion_len,
     "with sampler.threshold > 0 a block runs until it is complete, up to sampler.block_len"
     " steps (as sampler.steps = data.completion_len says)"),
    ("model.prompt_block_causal", lambda c: c.model.block_size > 0,
     "how a block-diffusion model's prompt attends (model.block_size > 0)"),
    ("estimator.attention_impl", lambda c: c.model.block_size > 0,
     "the staircase attention of a block-diffusion model (model.block_size > 0)"),
    ("lora.alpha", lambda c: c.lora.rank > 0, "read only with lora.rank > 0"),
    ("lora.targets", lambda c: c.lora.rank > 0, "read only with lora.rank > 0"),
    ("lora.base_dtype", lambda c: c.lora.rank > 0, "read only with lora.rank > 0"),
    ("estimator.trajectory_shrink", lambda c: c.estimator.name == "trajectory",
     "an option of estimator.name=trajectory"),
    ("model.mlp_hidden", lambda c: c.model.n_experts == 0 or c.model.first_dense_layers > 0
     or bool(c.model.hf_checkpoint),
     "the dense SwiGLU's width: with model.n_experts > 0 and model.first_dense_layers = 0 every"
     " layer's MLP is routed experts (model.moe_hidden)"),
) + tuple((f"model.{name}", lambda c: c.model.n_experts > 0 or bool(c.model.hf_checkpoint),
           "an option of a mixture-of-experts model (model.n_experts > 0): this model is dense")
          for name in MOE_OPTIONS) + (
    ("eval.phase", lambda c: c.mode == "eval",
     "which weights mode=eval scores: a training run evaluates the weights it trains"),
    ("eval.checkpoint_step", lambda c: c.mode == "eval",
     "which weights mode=eval scores: a training run evaluates the weights it trains"),
    ("log.num_samples", lambda c: c.log.samples_every > 0,
     "the completions logged every log.samples_every steps, and log.samples_every is 0 (off)"),
    ("log.wandb_entity", lambda c: bool(c.log.wandb_project),
     "read only with log.wandb_project set (\"\" = no W&B run)"),
    ("log.wandb_name", lambda c: bool(c.log.wandb_project),
     "read only with log.wandb_project set (\"\" = no W&B run)"),
) + tuple((f"distributed.{name}", lambda c: c.distributed.initialize != "never",
           "distributed.initialize=never runs one process, on every local device")
          for name in DISTRIBUTED_PROCESS) + tuple(
    (f"model.{name}", lambda c: not c.model.hf_checkpoint,
     "with model.hf_checkpoint the architecture comes from its config.json")
    for name in HF_ARCHITECTURE)


def _value(config: ml_collections.ConfigDict, key: str):
  section, name = key.split(".")
  return json.loads(json.dumps(config[section][name]))  # tuples as lists, as the schema's


def set_keys(config: ml_collections.ConfigDict) -> set[str]:
  """The keys of :data:`RULES` that ``config`` sets away from the schema's defaults; a model
  size key (:data:`HF_ARCHITECTURE`) also away from the embedded default's (its 0.1M model's
  ``rope_theta`` is not the user's setting, and with ``model.hf_checkpoint`` would be said
  on every run of the embedded default)."""
  from dllm_rl.config.defaults import get_config as embedded
  defaults, tiny = base_config(), embedded()
  hf_keys = {f"model.{name}" for name in HF_ARCHITECTURE}
  return {key for key, _, _ in RULES if _value(config, key) != _value(defaults, key)
          and not (key in hf_keys and _value(config, key) == _value(tiny, key))}


def _in_mode(config: ml_collections.ConfigDict, key: str) -> bool:
  """Whether ``config.mode`` reads ``key``'s section (:data:`_MODES`; others: every mode)."""
  return config.mode in _MODES.get(key, _MODES.get(key.split(".")[0], (config.mode,)))


def _rules_read(config: ml_collections.ConfigDict, key: str) -> bool:
  return _in_mode(config, key) and all(reads(config) for k, reads, _ in RULES if k == key)


def _out_of_tree(config: ml_collections.ConfigDict) -> dict[str, list[str]]:
  """{component key: dllm_rl's own names} for each of :data:`COMPONENT_KEYS` whose name in
  ``config`` was registered outside dllm_rl (README "Out-of-tree components"): the rules
  name dllm_rl's components only. A registry not imported, or a name not registered, is
  judged as the rules say (validation reports an unknown name)."""
  out = {}
  for key in COMPONENT_KEYS:
    registry = SELECTED_BY.get(key)
    name = _value(config, key)
    if registry is not None and name in registry and not registry.in_tree(name):
      out[key] = [n for n in registry.names() if registry.in_tree(n)]
  return out


def is_read(config: ml_collections.ConfigDict, key: str) -> bool:
  """Whether ``config``'s choices read ``key`` (a key of :data:`RULES`): its mode reads the
  key's section (``estimator`` and ``rl`` the modes that train with RL, ``sft`` those that
  train SFT, ``estimator.attention_impl`` those that train) and each of its rules says so (a
  key may have several: ``model.experts_per_token`` is an MoE option and a size key).
  ``dllm_rl.train.validate`` checks a value against another only where it is read (an odd
  ``estimator.num_samples`` with ``estimator.coupled`` only for the 1/t ELBO).

  A loss, advantage or estimator registered outside dllm_rl is in no rule: ``key`` is read
  when it is with that component replaced by any of dllm_rl's own (it may read what they
  do: ``rl.eps`` for a loss, never ``rl.beta_end`` with a built-in advantage that ignores it)."""
  outside = _out_of_tree(config)
  if not outside:
    return _rules_read(config, key)
  swapped = ml_collections.ConfigDict(config.to_dict())
  for names in itertools.product(*outside.values()):
    for component, name in zip(outside, names):
      section, field = component.split(".")
      swapped[section][field] = name
    if _rules_read(swapped, key):
      return True
  return False


def unread_settings(config: ml_collections.ConfigDict, quiet=()) -> list[str]:
  """One line per rule of :data:`RULES` whose key ``config`` sets away from its default and
  its choices do not read (:func:`is_read`): ``config.KEY=VALUE is not read: WHO reads it``.
  The ``estimator`` and ``rl`` keys are judged in the modes that train with RL only
  (``estimator.attention_impl`` in those that train), the ``sft`` keys in those that train SFT
  (a run of another mode reads none of them). ``quiet``: keys not to report (a study's
  testbed sets some for the arms that read them)."""
  judged = set_keys(config) - set(quiet)
  return [f"config.{key}={_value(config, key)!r} is not read: {who}"
          for key, reads, who in RULES
          if key in judged and _in_mode(config, key) and not reads(config)
          and not is_read(config, key)]
