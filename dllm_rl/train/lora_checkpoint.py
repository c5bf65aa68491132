"""Checkpoints of a LoRA run (``lora.rank`` > 0): the adapters only, plus a pointer to the base.

A LoRA run's checkpoint holds the :class:`~dllm_rl.models.lora.LoraParam` leaves, the
optimizer state (adapters only: ``train.optim.adapters_only``), the step and the RNG key. The
frozen base and a KL reference (the starting policy) are not written: the base is rebuilt from
its pointer, :func:`base_pointer` in the meta (``model.hf_checkpoint``, else the seed's init),
exactly as the run built it (:func:`base_params`). Full fine-tuning (rank 0) saves the whole
state as before; every function here is then the identity.

Limits: the base of RL is the run's base (HF checkpoint or seed), so RL with LoRA continues the
adapters of an SFT with LoRA in the same workdir; a full-fine-tuned SFT checkpoint cannot be
the base of a LoRA RL phase (its layout does not match: a LayoutMismatch names the step).
"""

from __future__ import annotations

import logging

import jax
from flax import nnx

from dllm_rl.errors import ConfigError
from dllm_rl.infra.checkpoint import Checkpointer, LayoutMismatch
from dllm_rl.models import lora, transformer
from dllm_rl.train import context as setup
from dllm_rl.train import layout_errors

_log = logging.getLogger(__name__)


def saved_state(state):
  """What a checkpoint of ``state`` holds: with adapters, params = the adapters alone and no
  reference policy; ``state`` itself otherwise (also the restore template)."""
  if not lora.has_adapters(state.params):
    return state
  return state.replace(params=lora.split_adapters(state.params)[0], ref_params=None)


def restored_state(template, saved):
  """The state ``saved`` (:func:`saved_state` layout) completed with the frozen base and the
  reference policy of ``template`` (a fresh state of the same run)."""
  if saved is template or not lora.has_adapters(template.params):
    return saved
  return saved.replace(params=nnx.merge_state(template.params, saved.params),
                       ref_params=template.ref_params)


def restore_checkpoint(ckpt, template, config=None):
  """``ckpt.restore`` of a state shaped like ``template`` (a fresh state): (state, meta). With
  the run's ``config``, a checkpoint it does not fit is a ConfigError naming the ``model`` /
  ``lora`` keys the checkpoint was trained with otherwise (dllm_rl.train.layout_errors), and
  so are LoRA adapters trained on another base (:func:`check_base`) and another
  ``model.param_dtype`` (``layout_errors.check_param_dtype``).

  A KL term turned on or off since the checkpoint (``rl.kl_coef``): a full-fine-tuning
  checkpoint holds the reference policy only when it was on. Turned on, the reference is the
  template's, the run's starting policy, as a fresh run with KL has it (a warning says so);
  turned off, the saved reference is dropped."""
  try:
    try:
      saved, meta = ckpt.restore(saved_state(template))
    except LayoutMismatch as err:
      saved, meta = _restore_toggling_kl(ckpt, template, err)
  except LayoutMismatch as err:
    if config is None:
      raise
    raise layout_errors.for_checkpoint(err, ckpt.directory, None, config) from err
  if config is not None:
    check_base(meta, config, ckpt.directory)
    layout_errors.check_param_dtype(meta, config, ckpt.directory)
  return restored_state(template, saved), meta


def _restore_toggling_kl(ckpt, template, err: LayoutMismatch):
  """(state, meta) of a checkpoint whose reference policy differs from ``template``'s only in
  being there (:func:`restore_checkpoint`); ``err``, the first restore's error, when that is
  not the difference."""
  if lora.has_adapters(template.params) or not hasattr(template, "ref_params"):
    raise err
  kl_now = template.ref_params is not None
  try:  # without the reference: none saved (KL was off), or one not to read (KL is off now)
    if kl_now:
      saved, meta = ckpt.restore(template.replace(ref_params=None))
    else:  # a partial read, which orbax serves from a checkpointer that has not saved
      with Checkpointer(ckpt.directory, read_only=True) as reader:
        saved, meta = reader.restore(template, leave_out=("ref_params",))
  except LayoutMismatch:
    raise err from None
  if kl_now:
    _log.warning("%s holds no reference policy (rl.kl_coef was 0): the KL term's reference is"
                 " the run's starting policy, as in a fresh run", ckpt.directory)
  return saved.replace(ref_params=template.ref_params), meta


_SEEDED = "init from seed "  # a base_pointer without an HF checkpoint: the seed's init


def base_pointer(config) -> dict:
  """The meta entry naming a LoRA run's base ({} without LoRA)."""
  if not config.lora.rank:
    return {}
  base = config.model.hf_checkpoint or f"{_SEEDED}{config.seed}"
  return {"lora_base": base, "lora": config.lora.to_dict()}


def check_base(meta, config, where: str) -> None:
  """The adapters of a LoRA checkpoint (``meta``: its meta, ``where``: its folder and step)
  belong on the base they were trained on, its :func:`base_pointer`; this run rebuilds its
  own. A seed's init that is not the one trained on (another ``seed``, or an HF checkpoint
  then or now but not both) is a ConfigError naming the key; two different HF paths are a
  warning (a folder moved or copied holds the same weights). Nothing to check without LoRA
  or without a pointer in ``meta``."""
  saved = meta.get("lora_base")
  if not config.lora.rank or saved is None:
    return
  ours = base_pointer(config)["lora_base"]
  if saved == ours:
    return
  if saved.startswith(_SEEDED) or ours.startswith(_SEEDED):
    key = "seed" if saved.startswith(_SEEDED) and ours.startswith(_SEEDED) else \
        "model.hf_checkpoint"
    raise ConfigError(key, f"{where}: its LoRA adapters were trained on the base {saved!r};"
                      f" this run's base would be {ours!r}, which they do not fit (set {key}"
                      " to the base they were trained on)")
  _log.warning("%s: its LoRA adapters were trained on the base %r; this run's base is %r"
               " (model.hf_checkpoint): right only if it holds the same weights", where,
               saved, ours)


def base_params(config, model_cfg, mesh) -> nnx.State:
  """The frozen base of a LoRA run (``model_cfg`` with adapters) rebuilt from its pointer: the
  HF checkpoint's weights, or the seed's init (with the run's key, so the same numbers)."""
  if config.model.hf_checkpoint:
    folder = setup.checkpoint_folder(config.model.hf_checkpoint)
    return setup.load_hf_params(folder, model_cfg, mesh)[1]
  key = jax.random.fold_in(jax.random.key(config.seed), 0)
  return lora.split_adapters(transformer.init_params_sharded(model_cfg, key, mesh)[1])[1]
