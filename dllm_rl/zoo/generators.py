"""Each family's official generator, called with its own keyword names and meanings.

A :class:`Generator` names the official function, lists its keywords with the
official defaults, and maps a call onto the framework's jitted samplers, so a
user can paste the official call: ``Pretrained.generate(prompt, **kwargs)``.
An unknown keyword raises ``TypeError`` listing the accepted ones; a value the
port does not support raises ``ValueError`` naming the keyword.

* ``llada`` — ML-GSAI/LLaDA ``generate.generate`` (steps, gen_length,
  block_length, temperature, cfg_scale, remasking, mask_id) →
  :func:`dllm_rl.sampling.sampler.sample`; returns [B, P + gen_length], token
  exact at temperature 0 (tests/sampling/test_official_parity.py) up to the
  first EOS (positions after it are returned as EOS; the official code keeps
  decoding them).
* ``sdar`` — JetAstra/SDAR ``generate.block_diffusion_generate`` (mask_id,
  gen_length, block_length, denoising_steps, temperature, top_k, top_p,
  remasking_strategy, confidence_threshold, stopping_criteria_idx) →
  :func:`dllm_rl.sampling.aligned_block.generate`; returns the whole canvas
  [B, ceil((P + gen_length) / block_length) · block_length] as the official
  code does. ``temperature=0`` means argmax (the official code would divide by 0).
* ``dream`` — Dream ``diffusion_generate`` (max_length, max_new_tokens, steps, eps, alg,
  alg_temp, temperature, top_p, top_k, mask_token_id; plus DARE / Fast-dLLM's block
  variant: block_length, dual_cache, threshold) → :func:`dllm_rl.sampling.dream.dream_generate`;
  returns [B, P + max_new_tokens]; as there, max_length counts the prompt, and with neither
  length given 20 tokens are generated (capped at max_position_embeddings); token-exact with
  the fixture's runs (tests/sampling/test_dream_sampler.py). ``block_length=None`` is the
  plain sampler. Omitted temperature / top_p / top_k are 1.0 / 1.0 / 50, as the official call
  takes them from config.json under transformers 4.46 (:data:`_DREAM_SAMPLING`), not greedy.
* ``llada2.0`` — inclusionAI LLaDA2.0 ``LLaDA2MoeModelLM.generate`` (temperature,
  block_length, steps, gen_length, top_p, top_k, eos_early_stop, minimal_topk,
  threshold, eos_id, mask_id) → the same aligned block generator; returns
  [B, P + gen_length] (the official code returns the generated tokens up to
  and including the first EOS: here the prompt is kept and positions after the
  first EOS are EOS). The 2.0 file samples even at ``temperature=0``; 2.1's
  argmax fix is what runs (as in the parity fixture). ``eos_early_stop`` gives
  the same tokens up to the first EOS (it only returns sooner; every block here
  stops after the block holding an EOS, as the 2.0 default does).
* ``llada2.1`` — LLaDA2.1 ``generate``: 2.0's keywords plus editing_threshold,
  max_post_steps, num_to_transfer (``steps`` is unused there) →
  :func:`dllm_rl.sampling.aligned_block.generate_editing`, which reproduces its
  0/1 additive attention mask; same return convention.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from dllm_rl.sampling import aligned_block, dream, sampler
from dllm_rl.sampling.remasking import REMASKING


@dataclasses.dataclass(frozen=True)
class Generator:
  """An official generator: its name, keywords (→ official default) and the port."""

  official: str
  defaults: dict[str, Any]
  run: Callable[..., jax.Array]  # (pretrained, prompt_BP, valid_BP, key, **kwargs) → ids

  def bind(self, family: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The official defaults updated with ``kwargs``; unknown names → TypeError; a count
    below 1 (:data:`COUNTS`) or a negative temperature → ValueError naming the keyword, before
    anything compiles (a 0 divided deep in a port, or sampled from a flipped distribution)."""
    unknown = sorted(set(kwargs) - set(self.defaults))
    if unknown:
      raise TypeError(f"{family} generate ({self.official}) got unknown keyword(s) "
                      f"{', '.join(unknown)}; accepted: {', '.join(self.defaults)}")
    bound = {**self.defaults, **kwargs}
    for name in COUNTS:
      value = bound.get(name)
      if value is not None and (isinstance(value, bool)
                                or not isinstance(value, numbers.Integral) or value < 1):
        raise ValueError(f"{family} generate: {name} must be a positive integer, got {value!r}")
    if bound.get("temperature") is not None and not bound["temperature"] >= 0:
      raise ValueError(f"{family} generate: temperature must be >= 0 (0: greedy), got"
                       f" {bound['temperature']!r}")
    return bound


# The generators' keywords that count tokens or steps (each must be a positive integer).
COUNTS = ("steps", "gen_length", "block_length", "denoising_steps", "max_new_tokens",
          "max_length", "minimal_topk", "num_to_transfer")


def _fill_after_eos(x_BN, start: int, eos_id: int | None):
  """Positions after the first EOS at or after ``start`` become EOS."""
  if eos_id is None:
    return x_BN
  is_eos_BN = (x_BN == eos_id) & (jnp.arange(x_BN.shape[1]) >= start)
  after_BN = jnp.cumsum(is_eos_BN, axis=1) - is_eos_BN > 0
  return jnp.where(after_BN, eos_id, x_BN)


def _require_unpadded(family: str, valid_BP) -> None:
  if not bool(jnp.all(valid_BP)):
    raise ValueError(f"{family} generate: the official generator takes one unpadded prompt "
                     "(its blocks are aligned to position 0, so padding would move them); "
                     "pass prompts of one length without attention_mask zeros, or call "
                     "generate once per prompt")


def _refuse_prompt_masks(family: str, prompt_BP, valid_BP, mask_id: int) -> None:
  """LLaDA's ``generate`` decodes every mask id of the canvas, the prompt's too (infilling:
  they compete for each step's slots); the port decodes the completion only, so a prompt
  holding the mask id would silently give other tokens: refuse it."""
  hits = np.argwhere((np.asarray(prompt_BP) == mask_id) & np.asarray(valid_BP))
  if hits.size:
    raise ValueError(f"{family} generate: the prompt holds mask_id={mask_id} at (row, position)"
                     f" {[tuple(int(v) for v in h) for h in hits[:4]]}; the official generate"
                     " would decode those prompt positions too (infilling), which this port"
                     " does not (it decodes the completion only)")


@functools.partial(jax.jit, static_argnums=0, static_argnames=("cfg", "mask_id", "eos_id"))
def _llada_sample(graphdef, params, prompt_BP, valid_BP, key, *, cfg, mask_id, eos_id):
  return sampler.sample(graphdef, params, prompt_BP, valid_BP, key, cfg=cfg, mask_id=mask_id,
                        eos_id=eos_id).completion_BL


@functools.partial(jax.jit, static_argnums=0, static_argnames=("cfg", "mask_id"))
def _aligned(graphdef, params, prompt_BP, key, *, cfg, mask_id):
  return aligned_block.generate(graphdef, params, prompt_BP, key, cfg=cfg, mask_id=mask_id)[0]


def _run_llada(pre, prompt_BP, valid_BP, key, *, steps, gen_length, block_length, temperature,
               cfg_scale, remasking, mask_id):
  if cfg_scale != 0:
    raise ValueError(f"llada generate: cfg_scale={cfg_scale} (classifier-free guidance) is not "
                     "supported by this port; use cfg_scale=0")
  if remasking not in REMASKING:  # the official two, and this framework's other policies
    raise ValueError(f"llada generate: remasking={remasking!r}; supported: "
                     f"{', '.join(REMASKING.names())}")
  cfg = sampler.SamplerConfig(completion_len=int(gen_length), steps=int(steps),
                              block_len=int(block_length), temperature=float(temperature),
                              remasking=remasking, stop_at_eos=False)
  if gen_length % block_length or steps % (gen_length // block_length):  # generate's asserts
    raise ValueError(f"llada generate: gen_length={gen_length} must be a multiple of"
                     f" block_length={block_length}, and steps={steps} a multiple of their"
                     f" number of blocks ({gen_length / block_length:g}), as in LLaDA's generate")
  sampler.block_schedule(cfg)  # a named error for a bad shape, before compiling
  mask_id = pre.token_ids.mask_id if mask_id is None else int(mask_id)
  _refuse_prompt_masks("llada", prompt_BP, valid_BP, mask_id)
  eos_id = pre.token_ids.eos_id if pre.token_ids.eos_id is not None else -1
  completion_BL = _llada_sample(pre.graphdef, pre.params, prompt_BP, valid_BP, key, cfg=cfg,
                                mask_id=mask_id, eos_id=eos_id)
  return jnp.concatenate([prompt_BP, completion_BL], axis=1)


_SDAR_STRATEGIES = ("low_confidence_dynamic", "low_confidence_static", "sequential")


def _run_sdar(pre, prompt_BP, valid_BP, key, *, mask_id, gen_length, block_length,
              denoising_steps, temperature, top_k, top_p, remasking_strategy,
              confidence_threshold, stopping_criteria_idx):
  if remasking_strategy not in _SDAR_STRATEGIES:
    raise ValueError(f"sdar generate: remasking_strategy={remasking_strategy!r}; "
                     f"supported: {', '.join(_SDAR_STRATEGIES)}")
  _require_unpadded("sdar", valid_BP)
  stops = stopping_criteria_idx
  stops = () if stops is None else (int(stops),) if isinstance(stops, int) else tuple(
      int(s) for s in stops)
  cfg = aligned_block.AlignedBlockConfig(
      gen_length=int(gen_length), block_length=int(block_length), steps=int(denoising_steps),
      temperature=float(temperature), top_k=int(top_k or 0),
      top_p=1.0 if top_p is None else float(top_p),
      threshold=(float(confidence_threshold) if remasking_strategy == "low_confidence_dynamic"
                 else None),
      sequential=remasking_strategy == "sequential", clamp_to_masked=False, stop_ids=stops)
  mask_id = pre.token_ids.mask_id if mask_id is None else int(mask_id)
  return _aligned(pre.graphdef, pre.params, prompt_BP, key, cfg=cfg, mask_id=mask_id)


def _run_llada2(pre, prompt_BP, valid_BP, key, *, temperature, block_length, steps, gen_length,
                top_p, top_k, eos_early_stop, minimal_topk, threshold, eos_id, mask_id):
  del eos_early_stop  # same tokens up to the first EOS: it only stops sooner (docstring)
  _require_unpadded("llada2", valid_BP)
  eos_id = pre.token_ids.eos_id if eos_id is None else int(eos_id)
  mask_id = pre.token_ids.mask_id if mask_id is None else int(mask_id)
  steps = min(int(steps), int(gen_length) // int(minimal_topk))
  if steps < 1:  # the official schedule is then empty: every block stays masks
    raise ValueError(f"llada2 generate: minimal_topk={minimal_topk} is larger than gen_length="
                     f"{gen_length}, which leaves steps = gen_length // minimal_topk = 0 per"
                     " block (nothing would be decoded); use minimal_topk <= gen_length")
  cfg = aligned_block.AlignedBlockConfig(
      gen_length=int(gen_length), block_length=int(block_length), steps=steps,
      temperature=float(temperature), top_k=int(top_k or 0),
      top_p=1.0 if top_p is None else float(top_p), threshold=float(threshold),
      clamp_to_masked=True, stop_ids=(eos_id,))
  p = prompt_BP.shape[1]
  x_BN = _aligned(pre.graphdef, pre.params, prompt_BP, key, cfg=cfg, mask_id=mask_id)
  return _fill_after_eos(x_BN[:, :p + int(gen_length)], p, eos_id)


@functools.partial(jax.jit, static_argnums=0, static_argnames=("cfg", "mask_id"))
def _editing(graphdef, params, prompt_BP, key, *, cfg, mask_id):
  return aligned_block.generate_editing(graphdef, params, prompt_BP, key, cfg=cfg,
                                        mask_id=mask_id)[0]


def _run_llada21(pre, prompt_BP, valid_BP, key, *, temperature, block_length, steps, gen_length,
                 top_p, top_k, eos_early_stop, minimal_topk, threshold, editing_threshold,
                 max_post_steps, eos_id, mask_id, num_to_transfer):
  del steps, minimal_topk, eos_early_stop  # unused by 2.1's loop / same tokens (docstring)
  _require_unpadded("llada2", valid_BP)
  eos_id = pre.token_ids.eos_id if eos_id is None else int(eos_id)
  mask_id = pre.token_ids.mask_id if mask_id is None else int(mask_id)
  cfg = aligned_block.EditingConfig(
      gen_length=int(gen_length), block_length=int(block_length),
      temperature=float(temperature), top_k=int(top_k or 0),
      top_p=1.0 if top_p is None else float(top_p), threshold=float(threshold),
      editing_threshold=float(editing_threshold), max_post_steps=int(max_post_steps),
      num_to_transfer=int(num_to_transfer), stop_ids=(eos_id,))
  p = prompt_BP.shape[1]
  x_BN = _editing(pre.graphdef, pre.params, prompt_BP, key, cfg=cfg, mask_id=mask_id)
  return _fill_after_eos(x_BN[:, :p + int(gen_length)], p, eos_id)


def _run_dream(pre, prompt_BP, valid_BP, key, *, max_length, max_new_tokens, steps, eps, alg,
               alg_temp, temperature, top_p, top_k, mask_token_id, block_length, dual_cache,
               threshold):
  p = prompt_BP.shape[1]
  if max_new_tokens is None:  # _prepare_generated_length: max_length counts the prompt ...
    if max_length is None:  # ... unless left at its default 20: then 20 new tokens, capped
      cap = pre.hf_config.get("max_position_embeddings")
      max_length = p + _DREAM_MAX_LENGTH if cap is None else min(p + _DREAM_MAX_LENGTH, int(cap))
    max_new_tokens = int(max_length) - p
    if max_new_tokens <= 0:
      raise ValueError(f"dream generate: max_length={max_length} leaves no room after the "
                       f"{p}-token prompt; pass max_new_tokens")
  mask_id = pre.token_ids.mask_id if mask_token_id is None else int(mask_token_id)
  return dream.dream_generate(
      pre.graphdef, pre.params, prompt_BP, attention_mask_BP=valid_BP.astype("int32"),
      mask_token_id=mask_id, max_new_tokens=int(max_new_tokens), steps=int(steps), eps=eps,
      alg=alg, alg_temp=alg_temp, temperature=temperature, top_p=top_p, top_k=top_k,
      block_length=block_length, dual_cache=dual_cache, threshold=threshold,
      key=key).sequences_BN


_DREAM_MAX_LENGTH = 20  # DreamGenerationConfig().max_length

# What an omitted temperature / top_p / top_k is in a diffusion_generate call: its config is
# DreamGenerationConfig.from_model_config(model.config), and under the transformers Dream pins
# (4.46) config.json's PretrainedConfig still carries the legacy generation attributes at
# their global defaults (temperature 1.0, top_k 50, top_p 1.0), which override the class's own
# (0.0, None, None). So a call without them samples at T = 1 from the top 50 (top_p 1.0 is a
# no-op); the folder's generation_config.json is not read. Pass temperature=0.0 for greedy.
_DREAM_SAMPLING = dict(temperature=1.0, top_p=1.0, top_k=50)

_LLADA2_KWARGS = dict(temperature=0.0, block_length=32, steps=32, gen_length=2048, top_p=None,
                      top_k=None, eos_early_stop=False, minimal_topk=1, threshold=0.95)

GENERATORS: dict[str, Generator] = {
    "llada": Generator("generate.generate (ML-GSAI/LLaDA)", dict(
        steps=128, gen_length=128, block_length=128, temperature=0.0, cfg_scale=0.0,
        remasking="low_confidence", mask_id=None), _run_llada),
    "sdar": Generator("generate.block_diffusion_generate (JetAstra/SDAR)", dict(
        mask_id=None, gen_length=128, block_length=8, denoising_steps=8, temperature=1.0,
        top_k=0, top_p=1.0, remasking_strategy="low_confidence_dynamic",
        confidence_threshold=0.85, stopping_criteria_idx=None), _run_sdar),
    "dream": Generator("DreamModel.diffusion_generate (Dream-org Dream-v0)", dict(
        max_length=None, max_new_tokens=None, steps=512, eps=1e-3, alg="origin", alg_temp=None,
        **_DREAM_SAMPLING, mask_token_id=None, block_length=None, dual_cache=False,
        threshold=0.9), _run_dream),
    "llada2.0": Generator("LLaDA2MoeModelLM.generate (inclusionAI LLaDA2.0)", dict(
        _LLADA2_KWARGS, eos_id=None, mask_id=None), _run_llada2),
    "llada2.1": Generator("LLaDA2MoeModelLM.generate (inclusionAI LLaDA2.1)", dict(
        _LLADA2_KWARGS, editing_threshold=0.9, max_post_steps=16, eos_id=None, mask_id=None,
        num_to_transfer=1), _run_llada21),
}

# The generator a family's checkpoint gets unless ``load_pretrained(generator=...)`` says
# otherwise (LLaDA2.0 and 2.1 share config.json: see :func:`default_generator`).
FAMILY_GENERATORS = {"llada": ("llada",), "sdar": ("sdar",), "dream": ("dream",),
                     "llada2": ("llada2.0", "llada2.1")}


def default_generator(family: str, folder_files: dict[str, str]) -> str:
  """The generator for a checkpoint of ``family``. LLaDA2.0 and 2.1 have byte-identical
  config.json files and differ only in ``generate``: 2.1's modeling file (shipped in the
  HF folder, ``trust_remote_code``) has ``editing_threshold``; without that file, 2.0.
  ``folder_files``: file name → text of the folder's ``modeling_*.py`` files."""
  names = FAMILY_GENERATORS.get(family)
  if names is None:
    raise ValueError(f"no generator for family {family!r}")
  if family == "llada2":
    text = folder_files.get("modeling_llada2_moe.py", "")
    return "llada2.1" if "editing_threshold" in text else "llada2.0"
  return names[0]
