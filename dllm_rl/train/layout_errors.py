"""A checkpoint whose layout the run's config does not fit, told as a config problem.

Every checkpoint's meta holds the config it was trained with (``train.phases``). When a
restore finds the saved leaves differ from the template the current config builds
(:class:`~dllm_rl.infra.checkpoint.LayoutMismatch`: another size, another LoRA rank, a missing
layer), the likely cause is a config that leaves out the training run's overrides. The
:class:`~dllm_rl.errors.ConfigError` raised here names the ``model`` / ``lora`` keys that
differ, with the values the checkpoint was trained with, so the user can pass them again.
"""

from __future__ import annotations

import json
from typing import Any

import ml_collections

from dllm_rl.config.schema import base_config
from dllm_rl.errors import ConfigError
from dllm_rl.infra.checkpoint import Checkpointer, LayoutMismatch

# The keys that shape the saved parameters (names, shapes): other keys (dtypes, remat, RoPE,
# init, block size, the MoE router's top-k) change numbers or programs, not the layout.
LAYOUT_KEYS = {
    "model": ("hf_checkpoint", "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
              "head_dim", "mlp_hidden", "tie_embeddings", "qk_norm", "qkv_bias", "n_experts",
              "moe_hidden", "n_shared_experts", "first_dense_layers"),
    "lora": ("rank", "targets"),
}


def _plain(section) -> dict[str, Any]:
  """A config section as JSON values (tuples as lists), {} when absent."""
  if section is None:
    return {}
  as_dict = section.to_dict() if isinstance(section, ml_collections.ConfigDict) else section
  return json.loads(json.dumps(as_dict))


def config_changes(trained, config) -> list[tuple[str, Any, Any]]:
  """``(key, value trained with, value now)`` for each layout key (:data:`LAYOUT_KEYS`) whose
  value in ``config`` differs from the training config ``trained`` (keys either lacks, from
  another version, are skipped)."""
  out = []
  for section, keys in LAYOUT_KEYS.items():
    was, now = _plain(trained.get(section)), _plain(config.get(section))
    out += [(f"{section}.{k}", was[k], now[k]) for k in keys
            if k in was and k in now and now[k] != was[k]]
  return out


def saved_config(directory: str, step: int | None = None) -> ml_collections.ConfigDict | None:
  """The training config in the meta of checkpoint ``step`` of ``directory`` (default: the
  newest), None when unreadable."""
  try:
    with Checkpointer(directory, read_only=True) as ckpt:
      meta = ckpt.meta(ckpt.latest_step() if step is None else step)
    return ml_collections.ConfigDict(json.loads(meta["config"]))
  except Exception:  # noqa: BLE001 (a damaged or old meta: the layout message alone)
    return None


def for_checkpoint(err: LayoutMismatch, directory: str, step: int | None,
                   config) -> ConfigError:
  """:func:`layout_error` of the checkpoint ``step`` (None: the newest) in ``directory``."""
  return layout_error(err, saved_config(directory, step), config)


def layout_error(err: LayoutMismatch, trained, config) -> ConfigError:
  """The ConfigError for restore error ``err``: the first changed key (``config_changes``), the
  values the checkpoint was trained with and the overrides that restore them; without a
  training config or a changed key, ``err``'s own message under the key ``model``."""
  changes = config_changes(trained, config) if trained is not None else []
  if not changes:
    return ConfigError("model", f"this config's model does not fit the checkpoint: {err}")
  said = ", ".join(f"{k}={was!r} (this config: {now!r})" for k, was, now in changes)
  fix = " ".join(f"--config.{k}={flag_text(was)}" for k, was, _ in changes)
  note = ""
  if any(k == "lora.rank" and was == 0 for k, was, _ in changes):
    note = (" A LoRA phase continues the LoRA adapters of its workdir: a full-fine-tuned"
            " checkpoint cannot be its base (docs/models.md, \"LoRA\").")
  elif any(k == "lora.rank" and was and not now for k, was, now in changes):
    note = (" A LoRA checkpoint holds its adapters only, not the whole model a run without"
            " LoRA reads: to fully fine-tune (or evaluate without LoRA) the policy it learned,"
            " export it merged (python -m dllm_rl.convert export --workdir RUN --hf_dir OUT)"
            " and point model.hf_checkpoint at OUT in a new --workdir (docs/models.md,"
            " \"LoRA\").")
  return ConfigError(changes[0][0], f"the checkpoint was trained with {said}: pass {fix} (or the"
                     f" --config file it was trained with).{note} ({err})")


def flag_text(value: Any) -> str:
  """``value`` as a --config override's text."""
  if isinstance(value, list):
    return ",".join(str(v) for v in value)
  return str(value)


def check_param_dtype(meta: dict, config, where: str) -> None:
  """A resume whose ``model.param_dtype`` differs from the one its checkpoint (``meta``, read
  from ``where``) was trained with: a ConfigError naming it. The restore would cast the saved
  parameters and Adam moments to the new dtype without a word (float32 master weights to
  bfloat16 loses their low bits for good); not a layout change, so no LayoutMismatch says
  it. A meta without a config (older checkpoints) is not checked, nor a LoRA run
  (``lora.rank`` > 0), which reads no ``model.param_dtype``: its adapters and their moments
  are float32 and its base, rebuilt in ``lora.base_dtype``, is not in the checkpoint."""
  if config.get("lora") is not None and config.lora.rank:
    return
  try:
    trained = json.loads(meta["config"])["model"]["param_dtype"]
  except (KeyError, TypeError, ValueError):
    return
  now = config.model.param_dtype
  if trained != now:
    raise ConfigError("model.param_dtype", f"{where} was trained with model.param_dtype ="
                      f" {trained} (this config: {now}); a resume would cast its parameters"
                      f" and optimizer state to {now}: pass --config.model.param_dtype={trained}"
                      " (or start a new --workdir)")


def flat(tree, prefix: str = "") -> dict[str, Any]:
  """``{"a.b": value}`` of a nested dict (a config as JSON); an empty section is a value."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict) and value:
      out.update(flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def changed_settings(meta: dict, config, ignore=("mode",),
                     only=None) -> list[tuple[str, Any, Any]]:
  """``(key, value saved, value now)`` for each config key that differs between the config
  saved in a checkpoint's ``meta`` and the run's ``config`` (``ignore``d keys, and their
  subkeys, aside; with ``only``, those keys and their subkeys alone; a key either side
  lacks, as from another version, counts with None, except a key added since that the run
  leaves at its default, :func:`dllm_rl.config.base_config`'s: the saved run ran as that
  default does). [] when the meta holds no config. A resume goes on with the new values,
  which may be meant (more steps, another lr); said so that an unmeant one is seen."""
  try:
    saved = flat(json.loads(meta["config"]))
  except (KeyError, TypeError, ValueError):
    return []
  now = flat(_plain(config))
  defaults = flat(_plain(base_config()))
  under = lambda key, keys: any(key == k or key.startswith(k + ".") for k in keys)
  added_at_default = lambda k: k not in saved and k in defaults and now.get(k) == defaults[k]
  return [(k, saved.get(k), now.get(k)) for k in sorted(set(saved) | set(now))
          if not under(k, ignore) and (only is None or under(k, only))
          and saved.get(k) != now.get(k) and not added_at_default(k)]


def said_changes(changes: list[tuple[str, Any, Any]], limit: int | None = None) -> str:
  """``"k: was → now; ..."`` of :func:`changed_settings`'s result (at most ``limit``, then
  how many more)."""
  shown = changes if limit is None else changes[:limit]
  said = "; ".join(f"{k}: {was!r} → {now!r}" for k, was, now in shown)
  return said + (f"; and {len(changes) - limit} more" if len(changes) > len(shown) else "")


def trained_with_other(meta: dict, config, keys, what: str, whose: str,
                       purpose: str) -> list[str]:
  """One line when the checkpoint's ``meta`` was saved with other values of ``keys`` than
  ``config``'s: "``what`` (k: was → now; ...): pass the ``whose`` values (e.g.
  --config.k=was) to ``purpose``"; [] when they agree or the meta holds no config."""
  changes = changed_settings(meta, config, only=keys)
  if not changes:
    return []
  key, was, _ = changes[0]
  return [f"{what} ({said_changes(changes)}): pass the {whose} values"
          f" (e.g. --config.{key}={flag_text(was)}) to {purpose}"]
