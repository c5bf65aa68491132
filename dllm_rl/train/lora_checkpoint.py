"""Checkpoints of a LoRA run (``lora.rank`` > 0): the adapters only, plus a pointer to the base.

A LoRA run's checkpoint holds the :class:`~dllm_rl.models.lora.LoraParam` leaves, the
optimizer state (adapters only: ``train.optim.adapters_only``), the step and the RNG key. The
frozen base and a KL reference (the starting policy) are not written: the base is rebuilt from
its pointer, :func:`base_pointer` in the meta (``model.hf_checkpoint``, else the seed's init),
exactly as the run built it (:func:`base_params`). An HF base's weights are fingerprinted
(:mod:`dllm_rl.models.hf_fingerprint`) into the meta too, so that adapters are never put on
other weights found at the same path (:func:`check_base`). Full fine-tuning (rank 0) saves
the whole state as before; every function here is then the identity.

Limits: the base of RL is the run's base (HF checkpoint or seed), so RL with LoRA continues the
adapters of an SFT with LoRA in the same workdir; a full-fine-tuned SFT checkpoint cannot be
the base of a LoRA RL phase (its layout does not match: a LayoutMismatch names the step).
"""

from __future__ import annotations

import logging

import jax
import numpy as np
from flax import nnx

from dllm_rl.errors import ConfigError
from dllm_rl.infra.checkpoint import Checkpointer, LayoutMismatch
from dllm_rl.models import convert, hf_fingerprint, lora, transformer
from dllm_rl.parallel.distributed import agree_any
from dllm_rl.train import hf_source
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
FINGERPRINT = "lora_base_fingerprint"  # the meta key of an HF base's weights' fingerprint


def base_fingerprint(folder: str) -> dict | None:
  """The content fingerprint (:mod:`dllm_rl.models.hf_fingerprint`) of the HF base in local
  folder ``folder``: None for a ``convert import`` folder (Orbax, no safetensors) or weights
  that cannot be read (their load says why)."""
  try:
    if convert.is_imported(folder):
      return None
    return hf_fingerprint.fingerprint(folder)
  except (OSError, ValueError, KeyError, TypeError):  # unreadable (not the folder's weights)
    return None


def base_pointer(config, folder: str | None = None) -> dict:
  """The meta entry naming a LoRA run's base ({} without LoRA); with ``folder``, the local
  folder its ``model.hf_checkpoint`` resolved to, the fingerprint of its weights too
  (:func:`base_fingerprint`; compute it once per run, not per save)."""
  if not config.lora.rank:
    return {}
  base = config.model.hf_checkpoint or f"{_SEEDED}{config.seed}"
  pointer = {"lora_base": base, "lora": config.lora.to_dict()}
  if folder and config.model.hf_checkpoint:
    found = base_fingerprint(folder)
    if found is not None:
      pointer[FINGERPRINT] = found
  return pointer


def check_base(meta, config, where: str, *, key: str = "model.hf_checkpoint") -> None:
  """The adapters of a LoRA checkpoint (``meta``: its meta, ``where``: its folder and step)
  belong on the base they were trained on, its :func:`base_pointer`; this run rebuilds its
  own. A seed's init that is not the one trained on (another ``seed``, or an HF checkpoint
  then or now but not both) is a ConfigError naming the key. An HF base is compared by its
  weights where the meta holds their fingerprint (:func:`_check_weights`: other weights are
  a ConfigError naming ``key``, the option that points at the base); otherwise two different
  HF paths are a warning (a folder moved or copied holds the same weights). Nothing to check
  without LoRA or without a pointer in ``meta``. Every process calls it at the same point
  (the fingerprint's verdict is agreed between them)."""
  saved = meta.get("lora_base")
  if not config.lora.rank or saved is None:
    return
  ours = base_pointer(config)["lora_base"]
  if saved.startswith(_SEEDED) or ours.startswith(_SEEDED):
    if saved == ours:
      return
    key = "seed" if saved.startswith(_SEEDED) and ours.startswith(_SEEDED) else \
        "model.hf_checkpoint"
    raise ConfigError(key, f"{where}: its LoRA adapters were trained on the base {saved!r};"
                      f" this run's base would be {ours!r}, which they do not fit (set {key}"
                      " to the base they were trained on)")
  if FINGERPRINT in meta and _check_weights(meta[FINGERPRINT], saved, ours, where, key):
    return
  if saved != ours:
    _log.warning("%s: its LoRA adapters were trained on the base %r; this run's base is %r"
                 " (%s): right only if it holds the same weights", where, saved, ours, key)


def same_base(meta: dict, folder: str | None) -> bool:
  """Whether the HF base in local ``folder`` holds the very weights the adapters of a LoRA
  checkpoint (``meta``) were trained on, by the fingerprint saved there (the folder moved or
  copied since, as :func:`check_base` lets pass without a word). False without a saved
  fingerprint, without ``folder`` or where they differ or cannot be compared."""
  recorded = meta.get(FINGERPRINT)
  if not recorded or not folder:
    return False
  now = base_fingerprint(folder)
  return now is not None and hf_fingerprint.compare(recorded, now) == hf_fingerprint.SAME


def _verdict(recorded: dict, spec: str) -> tuple[str, dict | None, str]:
  """(hf_fingerprint.compare of ``recorded`` with the weights ``spec`` resolves to here, their
  fingerprint, that folder); UNKNOWN where they cannot be fingerprinted (their load says
  why)."""
  try:
    folder = hf_source.checkpoint_folder(spec)
  except (ConfigError, OSError, ValueError):  # unavailable here: every process still agrees
    return hf_fingerprint.UNKNOWN, None, spec
  now = base_fingerprint(folder)
  if now is None:
    return hf_fingerprint.UNKNOWN, None, folder
  return hf_fingerprint.compare(recorded, now), now, folder


def _check_weights(recorded: dict, saved: str, ours: str, where: str, key: str) -> bool:
  """The base's weights against the fingerprint ``recorded`` when the adapters were saved
  (on ``saved``; ``ours``: this run's ``model.hf_checkpoint``). Other weights (other tensors,
  or the same tensors and dtypes with other sampled bytes) are a ConfigError naming ``key``;
  other dtypes (a re-save: bytes cannot be compared) a warning. True when the weights were
  compared (the same, or warned of), False when they cannot be (the path rule applies).

  Every process fingerprints its own copy (a gs:// base staged per host, a hub cache per
  host) and the verdicts are agreed (distributed.agree_any): one process with other weights
  stops every process, so none is left waiting in a collective."""
  verdict, now, folder = _verdict(recorded, ours)
  changed, dtypes, unknown = agree_any(np.array([
      verdict in (hf_fingerprint.TENSORS, hf_fingerprint.BYTES),
      verdict == hf_fingerprint.DTYPES, verdict == hf_fingerprint.UNKNOWN]))
  at = ours if folder == ours else f"{ours} ({folder})"
  if changed:
    if verdict not in (hf_fingerprint.TENSORS, hf_fingerprint.BYTES):
      raise ConfigError(key, f"{where}: another process found the weights of its LoRA base"
                        f" {ours!r} changed since the adapters were trained (its error says"
                        " how); nothing was restored")
    what = ("other tensors (names or shapes)" if verdict == hf_fingerprint.TENSORS else
            "the same tensors with other values (their sampled bytes differ)")
    raise ConfigError(key, f"{where}: the weights of its LoRA base {saved!r} changed since the"
                      " adapters were trained (their fingerprint, saved with the adapters,"
                      f" differs): {at} now holds {what} (replaced in place, re-downloaded, a"
                      f" newer hub revision?). Point {key} at the weights they were trained on"
                      " (a hub id pinned as org/name@REVISION)")
  if dtypes:
    then = "/".join(recorded.get("dtype_names", ["?"]))
    held = (f"{at} holds the same tensors in {'/'.join(now['dtype_names'])}"
            if verdict == hf_fingerprint.DTYPES else "another process's copy of it holds the"
            " same tensors in another dtype")
    _log.warning("%s: its LoRA adapters were trained on the base %r in %s; %s (a re-save in"
                 " another dtype?), whose bytes cannot be compared: right only if it holds the"
                 " same weights (%s)", where, saved, then, held, key)
    return True
  return not unknown


def base_params(config, model_cfg, mesh) -> nnx.State:
  """The frozen base of a LoRA run (``model_cfg`` with adapters) rebuilt from its pointer: the
  HF checkpoint's weights, or the seed's init (with the run's key, so the same numbers)."""
  if config.model.hf_checkpoint:
    folder = hf_source.checkpoint_folder(config.model.hf_checkpoint)
    return hf_source.load_hf_params(folder, model_cfg, mesh)[1]
  key = jax.random.fold_in(jax.random.key(config.seed), 0)
  return lora.split_adapters(transformer.init_params_sharded(model_cfg, key, mesh)[1])[1]
