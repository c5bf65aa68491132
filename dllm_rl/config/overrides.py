"""Command-line overrides: ``--config.a.b=value``, each parsed as the type of the key."""

from __future__ import annotations

import difflib

import ml_collections

from dllm_rl.errors import ConfigError

def value_at(config: ml_collections.ConfigDict, dotted: str):
  """The value of the dotted key ``dotted`` (``"rl.lr"``) in ``config``."""
  node = config
  for part in dotted.split("."):
    node = node[part]
  return node


# Names other frameworks (TRL, verl, d1 / SPG scripts, the official generators) use for a key
# of ours: ``rl.learning_rate`` → ``rl.lr``. Read by :func:`did_you_mean`.
KEY_ALIASES = {
    "learning_rate": "lr", "lr_schedule": "schedule", "lr_scheduler_type": "schedule",
    "num_steps": "steps", "max_steps": "steps", "total_steps": "steps",
    "warmup": "warmup_steps", "num_warmup_steps": "warmup_steps",
    "max_grad_norm": "grad_clip", "gradient_clip": "grad_clip", "clip_grad_norm": "grad_clip",
    "num_generations": "group_size", "n_samples_per_prompt": "group_size",
    "num_iterations": "inner_steps", "ppo_epochs": "inner_steps", "epsilon": "eps",
    "clip_eps": "eps", "kl_beta": "kl_coef", "kl_loss_coef": "kl_coef",
    "max_completion_length": "completion_len", "gen_length": "completion_len",
    "max_new_tokens": "completion_len", "max_prompt_length": "prompt_len",
    "block_length": "block_len", "diffusion_steps": "steps", "denoising_steps": "steps",
    "remasking_strategy": "remasking", "mc_num": "num_samples", "num_mc_samples": "num_samples",
    "per_device_train_batch_size": "batch_size", "hidden_size": "d_model",
    "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads", "intermediate_size": "mlp_hidden",
}


# Other frameworks' names for a count of optimizer updates. rl.steps counts rollout batches,
# each followed by rl.inner_steps updates: TRL's max_steps and the SPG / StableDRL scripts'
# total_steps are rl.steps × rl.inner_steps (their num_iterations), so a suggestion of
# rl.steps for one of them says so.
UPDATE_COUNTS = ("max_steps", "total_steps", "num_steps")
_RL_STEPS_NOTE = (" (it counts rollout batches, each followed by rl.inner_steps optimizer"
                  " updates; TRL's max_steps and the SPG / StableDRL scripts' total_steps"
                  " count updates: rl.steps = theirs / rl.inner_steps)")


def did_you_mean(key: str, choices, prefix: str = "") -> str:
  """"; did you mean PREFIX.k?" for the closest of ``choices`` (spelling), else for the key
  that a known alias close to ``key`` stands for (``lerning_rate`` → ``lr``); "" if none.
  ``rl.steps`` suggested for an update count (:data:`UPDATE_COUNTS`) says what it counts."""
  choices = list(choices)
  note = ""
  if prefix == "rl." and difflib.get_close_matches(key, UPDATE_COUNTS, n=1, cutoff=0.75):
    note = _RL_STEPS_NOTE
  close = difflib.get_close_matches(key, choices, n=1)
  if close:
    return f"; did you mean {prefix}{close[0]}{note if close[0] == 'steps' else ''}?"
  aliases = {a: k for a, k in KEY_ALIASES.items() if k in choices}
  close = difflib.get_close_matches(key, list(aliases), n=1, cutoff=0.75)
  if close:
    target = aliases[close[0]]
    return (f"; did you mean {prefix}{target} (other frameworks' {close[0]!r})"
            f"{note if target == 'steps' else ''}?")
  return ""

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _parse_value(path: str, default, text: str):
  """``text`` as the type of ``default``; raises ConfigError naming ``path``."""
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
      return _parse_tuple(default, text)
  except (ValueError, SyntaxError):
    raise ConfigError(path, f"expected {type(default).__name__}, got {text!r}") from None
  return text


def _parse_tuple(default: tuple, text: str) -> tuple:
  """``text`` as a tuple: a Python literal ("1,2", "(1, 2)", "('q', 'v')"), or, for a tuple of
  strings (``lora.targets``), bare comma-separated words ("q,v", as the errors' fixes
  write it). Raises ValueError / SyntaxError otherwise."""
  import ast
  words = bool(default) and all(isinstance(x, str) for x in default)
  try:
    value = ast.literal_eval(text if text.strip().startswith(("(", "[")) else f"({text},)")
  except (ValueError, SyntaxError):
    if not words:
      raise
    value = [w.strip() for w in text.strip().strip("()[]").split(",") if w.strip()]
  if not isinstance(value, (tuple, list)):
    raise ValueError
  return tuple(value)


def _free_form(text: str):
  """A task option value: a Python literal when it parses as one, else the string."""
  import ast
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def _new_task_options(config: ml_collections.ConfigDict,
                      overrides: list[tuple[str, str]]) -> list[str]:
  """A ``task.name`` override naming another task empties ``task.options`` first (before
  any override is applied, so ``task.options.*`` given on the same command line stay): they
  are the config file's task's constructor arguments, which the new task rejects, and no
  flag can remove a key. Returns the note that says which were dropped ([] if none)."""
  names = [text for dotted, text in overrides if dotted == "task.name"]
  task = config.get("task")
  if not names or not isinstance(task, ml_collections.ConfigDict) or names[-1] == task.get(
      "name") or not isinstance(task.get("options"), ml_collections.ConfigDict):
    return []
  given = {dotted.removeprefix("task.options.") for dotted, _ in overrides}
  dropped = sorted(set(task.options.keys()) - given)  # not those given again beside it
  with task.unlocked():
    task.options = ml_collections.ConfigDict()
  if not dropped:
    return []
  return [f"--config.task.name={names[-1]} replaces the config's task {task.name!r}: its"
          f" task.options {dropped} are dropped (give the new task's with"
          " --config.task.options.KEY=VALUE)"]


def apply_overrides(config: ml_collections.ConfigDict,
                    overrides: list[tuple[str, str]],
                    notes: list[str] | None = None) -> list[ConfigError]:
  """Set ``(dotted key, text)`` pairs (from ``--config.KEY=TEXT``) on ``config``, each parsed
  as the type of the key's current value. Returns every problem (unknown key with a "did you
  mean", wrong type) instead of stopping at the first; good overrides are applied. What the
  overrides did beyond setting keys (another task's options dropped) is appended to
  ``notes``, for the CLI to say when the config is good."""
  errors = []
  dropped = _new_task_options(config, overrides)
  if notes is not None:
    notes += dropped
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
        try:
          node[leaf] = value
        except TypeError:  # a task option of the file's type (ml_collections keeps it)
          raise ConfigError(dotted, f"expected {type(node[leaf]).__name__} (the config's value"
                                    f" is {node[leaf]!r}), got {text!r}") from None
    except KeyError as e:
      bad = e.args[0]
      parent = config
      for part in bad.split(".")[:-1]:
        parent = parent[part]
      choices = list(parent.keys()) if isinstance(parent, ml_collections.ConfigDict) else []
      stem = bad.rsplit(".", 1)[0] + "." if "." in bad else ""
      errors.append(ConfigError(bad, "unknown key" + did_you_mean(bad.split(".")[-1], choices,
                                                                  stem)))
    except ConfigError as e:
      errors.append(e)
    except (TypeError, ValueError) as e:
      errors.append(ConfigError(dotted, str(e)))
  return errors
