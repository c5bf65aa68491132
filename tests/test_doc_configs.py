"""What the docs say about configs, beyond what ``tests/test_readme_commands.py`` parses.

* A whole ``dllm_rl.main`` or ``dllm_rl.plan`` command of README.md, launch/README.md or
  docs/*.md (its config named, or the embedded default; not a run of ``--config`` words alone;
  no placeholder value; a launch line's overrides after ``--`` with its config) that parses is
  validated as the run validates it before anything compiles
  (``dllm_rl.planning.planner.validated``: every rule, the task's name and options, no data
  file read). A config file's ``REQUIRED`` value that the command leaves to ``...`` is not a
  problem here. Parsing alone passed a documented command that a rule added later refuses
  (``--config.rl.steps=4`` once the RL warm-up counted 50 optimizer updates).
* Every config key the prose names in inline code (``sft.target_accuracy``,
  ``config.rl.beta_end``, ``task.options.prompt_preset``) is a key of ``base_config()`` (a
  ``task.options`` one: an option some registered task takes), so a renamed key cannot live
  on in the guides. `NOT_KEYS` lists the spans that look like keys and are not.

Nothing is run; nothing here imports a flag-defining CLI module.
"""

from __future__ import annotations

import importlib
import os
import re

import pytest

from dllm_rl.config.overrides import value_at
from dllm_rl.config.schema import base_config as schema
from tests import test_readme_commands as docs

# Inline code that reads as a config key and is something else, each with what it is.
NOT_KEYS = {
    "rl.nosuch": "docs/operations.md's example of an unknown key",
    "rl.lerning_rate": "docs/operations.md's example of another framework's key name",
    "model.transformer.wte.weight": "an HF tensor name, in a quoted error",
}


def as_run(cmd: docs.Command) -> docs.Command | None:
  """The ``dllm_rl.main`` / ``dllm_rl.plan`` command that ``cmd`` runs (a launch line: its
  config and the overrides after ``--``), or None: another module, or no overrides to run."""
  if cmd.module.startswith("launch/"):
    _, rest = docs.launch_problems(cmd.module, cmd.args, cmd.env)
    if not rest:
      return None
    with open(os.path.join(docs.ROOT, cmd.module)) as f:
      default = re.search(r"^CONFIG=\$\{\w+:-(configs/\S+\.py)\}", f.read(), re.M)
    head = cmd.args[:len(cmd.args) - len(rest)]
    config = (head[head.index("--config") + 1] if "--config" in head[:-1]
              else default.group(1) if default else None)
    return docs.Command(cmd.line, "dllm_rl.main",
                        ([f"--config={config}"] if config else []) + rest, {})
  if cmd.module in ("dllm_rl.main", "dllm_rl.plan") and not cmd.bare:
    return cmd
  return None


def validation_problems(cmd: docs.Command) -> list[str] | None:
  """What validation says of the whole config of ``cmd`` (a parsed ``as_run`` command), less
  ``REQUIRED`` values; None when a placeholder leaves the config unknown."""
  from dllm_rl.errors import ConfigError
  from dllm_rl.planning.planner import validated
  overrides = [tuple(a[len("--config."):].split("=", 1)) for a in cmd.args
               if a.startswith("--config.") and "=" in a]
  if any(docs._is_placeholder(v) or any(re.fullmatch(r"[A-Z_]+|.", p) for p in k.split("."))
         for k, v in overrides):  # a placeholder value, or key (KEY, a.b)
    return None
  flags = docs.absl_problems(cmd.module, [a for a in cmd.args if not a.startswith("--config.")])[1]
  config = docs.base_config(cmd.module, flags)
  if isinstance(config, str) or docs.override_problems(config, overrides):
    return None  # test_readme_commands names it
  try:
    validated(config)
  except ConfigError as err:
    return [str(e) for e in getattr(err, "errors", [err])
            if "required value not set" not in str(e)]
  return []


def _validated(doc: str) -> tuple[int, list[str]]:
  """(how many commands of ``doc`` were validated, ``line: command`` and its problems)."""
  count, bad = 0, []
  for cmd in docs._commands(doc):
    run = as_run(cmd)
    found = None if run is None or docs.problems(run) else validation_problems(run)
    count += found is not None
    if found:
      bad.append(f"{doc}:{cmd.line}: {' '.join([cmd.module, *cmd.args])}\n  " + "\n  ".join(found))
  return count, bad


@pytest.mark.parametrize("doc", docs.DOCS)
def test_every_whole_doc_command_passes_validation(doc):
  assert not _validated(doc)[1], "\n".join(_validated(doc)[1])


def test_the_docs_have_whole_commands_to_validate():
  """The quick start, the guides' runs and plans and the launch lines are checked."""
  counts = {doc: _validated(doc)[0] for doc in docs.DOCS}
  assert sum(counts.values()) > 40, counts
  assert min(counts["README.md"], counts["launch/README.md"], counts["docs/models.md"],
             counts["docs/scale.md"]) >= 3, counts


@pytest.mark.parametrize("text, expected", [
    ("python -m dllm_rl.main --workdir=D --config.rl.steps=4",
     "config.rl.warmup_steps: must be in [0, rl.steps * rl.inner_steps]"),
    ("python -m dllm_rl.plan --config=configs/tiny_cpu.py --topology=cpu:1 --config.rl.loss=spg",
     "config.rl.loss: spg needs estimator.name=spg_block"),
    ("launch/slurm_gpu.sh --config configs/llada_gpu.py --workdir /s --"
     " --config.rl.loss=grpo_token",
     "config.rl.loss: grpo_token (d1 per-token ratios) needs per-token sums"),
    ("python -m dllm_rl.main --config=configs/llada_tpu.py --workdir=D --config.rl.steps=5 ...",
     None),  # its REQUIRED model and data left to "..."
    ("python -m dllm_rl.main --workdir=D --config.rl.steps=N", None),  # a placeholder
    ("--config.rl.steps=4", None),  # a run of --config words: no config to validate
])
def test_a_command_validation_refuses_is_named(text, expected):
  (cmd,) = docs.doc_commands(f"```bash\n{text}\n```\n")
  run = as_run(cmd)
  found = None if run is None else validation_problems(run)
  if expected is None:
    assert not found, found
  else:
    assert found and any(expected in p for p in found), found


# -- keys in the prose -----------------------------------------------------------------------

_SECTIONS = sorted(k for k, v in schema().items() if hasattr(v, "keys"))
_KEY = re.compile(rf"(?<![\w./-])(?:config\.)?((?:{'|'.join(_SECTIONS)})(?:\.\w+)+)(?![\w(/-])")


def named_keys(text: str) -> list[tuple[int, str]]:
  """(line, key) of each config key named in inline code or a fenced block; a file name
  (``model.safetensors``), a module attribute (``rl.losses.CLIP_MODES``,
  ``dllm_rl.models.lora``'s functions) and ``load_pretrained``'s ``model.*`` are not keys."""
  from dllm_rl.zoo.pretrained import Pretrained
  found = []
  for line, code in docs.code_texts(text):
    for key in _KEY.findall(code):
      head, *rest = key.split(".")
      if (rest[-1] in ("safetensors", "json", "jsonl", "py", "md", "png")
          or (head == "model" and (rest[0] in Pretrained.__dataclass_fields__
                                   or hasattr(Pretrained, rest[0])))
          or _module_attribute(key)):
        continue
      found.append((line, key))
  return found


def _module_attribute(dotted: str) -> bool:
  """Whether ``dotted`` is ``<module>.<attribute>`` of a dllm_rl module, named from the
  package (``rl.losses.CLIP_MODES``) or from its layer (``lora.LoraParam``: models/lora.py)."""
  module, _, attr = dotted.rpartition(".")
  for package in ("", *(f"{p}." for p in _LAYERS)):
    try:
      if hasattr(importlib.import_module(f"dllm_rl.{package}{module}"), attr):
        return True
    except ImportError:
      pass
  return False


_LAYERS = sorted(n for n in os.listdir(os.path.join(docs.ROOT, "dllm_rl"))
                 if os.path.isfile(os.path.join(docs.ROOT, "dllm_rl", n, "__init__.py")))


def key_problem(key: str) -> str | None:
  """Why ``key`` is no config key (None: it is one, or `NOT_KEYS` says what it is)."""
  if key in NOT_KEYS:
    return None
  if key.startswith("task.options."):
    option = key.split(".")[2]
    return None if docs._some_task_takes({option: 0}) else f"{key}: no task takes {option!r}"
  try:
    value_at(schema(), key)
    return None
  except (KeyError, AttributeError, TypeError):
    return f"{key}: no such config key"


@pytest.mark.parametrize("doc", docs.DOCS)
def test_every_config_key_the_docs_name_exists(doc):
  with open(os.path.join(docs.ROOT, doc)) as f:
    keys = named_keys(f.read())
  bad = [f"{doc}:{line}: {p}" for line, key in keys if (p := key_problem(key))]
  assert not bad, "\n".join(bad)


def test_the_key_check_names_a_renamed_key_and_knows_the_others():
  text = ("Set `sft.target_acuracy` and `task.options.prompt_presett`; `rl.lr`, "
          "`config.rl.beta_end=4.0`, `task.options.train_file`, `rl.losses.CLIP_MODES`, "
          "`model.tokenizer`, `model.safetensors` and `lora.freeze_base` are fine.")
  assert [key_problem(k) for _, k in named_keys(text) if key_problem(k)] == [
      "sft.target_acuracy: no such config key",
      "task.options.prompt_presett: no task takes 'prompt_presett'"]
  assert sum(len(named_keys(open(os.path.join(docs.ROOT, d)).read())) for d in docs.DOCS) > 1000
