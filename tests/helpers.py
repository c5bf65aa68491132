"""Shared builders for the tests (a plain module: ``from tests.helpers import ...``; the
repository root is on sys.path via tests/conftest.py).

* :func:`tiny_model` / :func:`small_model`: ``ModelConfig``s of the unit tests;
* :data:`TINY_RUN` / :func:`tiny_run_config` / :func:`cli_flags`: the embedded default
  config (``dllm_rl.config.defaults.get_config``) shrunk for end-to-end runs;
* :func:`rl_step_config`: an ``RLStepConfig`` with the defaults the tests share;
* :func:`random_rollout_batch`: a random ``RolloutBatch``;
* :func:`staircase_inputs` / :func:`left_pad_valid`: staircase-attention q, k, v, cotangent
  and key validity (the kernel tests);
* :func:`assert_test_figures`: a finished run's test figures against its metrics.jsonl;
* :func:`hf_fixture_with_tokenizer`: a parity fixture with a character-level HF tokenizer;
* :func:`scratch_run_checkpoints`: checkpoints of a run trained from scratch (fixture-sized).

Every builder takes the values a test changes as arguments; nothing here is random
beyond the key / seed it is given, so a test's expected values do not depend on it.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp

MASK, EOS = 2, 1  # the mask / EOS ids of the unit tests' toy vocabularies
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


# ------------------------------------------------------------------------------ models


def tiny_model(*, vocab_size: int = 12, d_model: int = 16, n_layers: int = 1, n_heads: int = 2,
               n_kv_heads: int = 2, head_dim: int = 8, mlp_hidden: int = 32, **options):
  """The smallest model of the estimator / RL-step tests (one layer, d_model 16);
  ``options`` are further ``ModelConfig`` fields (qk_norm, init_std, ...)."""
  from dllm_rl.models.transformer import ModelConfig
  return ModelConfig(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                     n_kv_heads=n_kv_heads, head_dim=head_dim, mlp_hidden=mlp_hidden, **options)


def small_model(*, vocab_size: int = 24, d_model: int = 32, n_layers: int = 2, n_heads: int = 4,
                n_kv_heads: int = 2, head_dim: int = 8, mlp_hidden: int = 48,
                init_std: float = 0.3, **options):
  """The sampler tests' model: two GQA layers, d_model 32, and weights large enough
  (init_std 0.3) that its logits are far from uniform (confidences differ)."""
  return tiny_model(vocab_size=vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                    n_kv_heads=n_kv_heads, head_dim=head_dim, mlp_hidden=mlp_hidden,
                    init_std=init_std, **options)


# ------------------------------------------------------------------------ run configs

# The embedded default (3-digit addition) at a size that runs in seconds on 2 CPU cores:
# a 1-layer d_model-32 model, small task splits, RL groups of 2 × 4, pass@{1,4} from 4
# samples, no progress bar, a 2-device data-parallel mesh (of the 8 simulated devices).
TINY_MODEL = {"model.d_model": 32, "model.n_layers": 1, "model.mlp_hidden": 64}
TINY_RUN = {**TINY_MODEL,
            "task.train_size": 256, "task.val_size": 32, "task.test_size": 32,
            "sft.warmup_steps": 0, "rl.warmup_steps": 0, "rl.batch_prompts": 2, "rl.group_size": 4,
            "eval.num_samples": 4, "eval.pass_k": (1, 4), "log.progress": False,
            "mesh.data": 2}


def set_dotted(config, overrides: Mapping[str, Any]):
  """``config[section][...][key] = value`` for each ``{"section.key": value}``; returns it."""
  for dotted, value in overrides.items():
    *path, key = dotted.split(".")
    node = config
    for part in path:
      node = node[part]
    node[key] = value
  return config


def tiny_run_config(mode: str = "sft", overrides: Mapping[str, Any] | None = None):
  """``get_config()`` (the embedded default) with :data:`TINY_RUN`, then ``overrides``
  (``{"section.key": value}``), and ``mode``."""
  from dllm_rl.config.defaults import get_config
  c = set_dotted(get_config(), {**TINY_RUN, **(overrides or {})})
  c.mode = mode
  return c


def cli_flags(overrides: Mapping[str, Any]) -> list[str]:
  """``--config.key=value`` flags for ``python -m dllm_rl.main`` (tuples as "a,b",
  booleans in lower case)."""
  def text(v):
    if isinstance(v, bool):
      return str(v).lower()
    if isinstance(v, tuple):
      return ",".join(str(x) for x in v)
    return str(v)
  return [f"--config.{k}={text(v)}" for k, v in overrides.items()]


# --------------------------------------------------------------------------- HF folders


def hf_fixture_with_tokenizer(tmp_path, fixture: str = "llada_tiny"):
  """A copy of a parity fixture (tests/fixtures/<fixture>: config.json + safetensors) in
  ``tmp_path/<fixture>`` plus a character-level HF tokenizer (printable characters, ids
  < 125; EOS ``<|eot_id|>`` 125, mask 126) and a one-turn chat template."""
  import json
  import os
  import shutil
  import string

  import tokenizers
  d = tmp_path / fixture
  d.mkdir(parents=True)
  for f in ("config.json", "model.safetensors"):
    shutil.copy(os.path.join(ROOT, "tests", "fixtures", fixture, f), d / f)
  chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
  vocab = {c: i for i, c in enumerate(chars)}
  vocab.update({f"<|reserved_{i}|>": i for i in range(len(chars), 125)})
  vocab.update({"<|eot_id|>": 125, "<|mdm_mask|>": 126, "<|unk|>": 127})
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[], unk_token="<|unk|>"))
  tok.decoder = tokenizers.decoders.Fuse()
  tok.add_special_tokens(["<|eot_id|>", "<|mdm_mask|>"])
  tok.save(str(d / "tokenizer.json"))
  (d / "tokenizer_config.json").write_text(json.dumps({
      "eos_token": "<|eot_id|>",
      "chat_template": "{% for m in messages %}Q: {{ m['content'] }}{% endfor %}"
                       "{% if add_generation_prompt %}\nA: {% endif %}"}))
  return d


# The llada_tiny fixture's architecture as a config without model.hf_checkpoint (a run
# "trained from scratch": the character tokenizer's vocabulary, the fixture's first rows).
LLADA_TINY_MODEL = {"model.d_model": 64, "model.n_layers": 2, "model.n_heads": 4,
                    "model.mlp_hidden": 176}


def scratch_run_checkpoints(workdir, steps: Mapping[str, Any], overrides=None):
  """A run trained from scratch at the llada_tiny fixture's size (:data:`LLADA_TINY_MODEL`
  on the shrunk embedded default, then ``overrides``) with a checkpoint at each step of
  ``steps`` ({phase: [step, ...]}), named and saved as the phase loops do (meta with the
  config): the fixture's weights times 1 + step / 10, a distinct policy per step that needs
  no init to compile; params only, as eval and export read them. Returns (config,
  {label: params})."""
  import os

  import numpy as np

  from dllm_rl.infra.checkpoint import Checkpointer
  from dllm_rl.models import hf
  from dllm_rl.tasks.tokenizer import CharTokenizer
  config = tiny_run_config("rl", {**LLADA_TINY_MODEL, **(overrides or {})})
  fixture = hf.load_checkpoint(os.path.join(ROOT, "tests", "fixtures", "llada_tiny")).params
  v = CharTokenizer().vocab_size
  fixture = jax.tree_util.tree_map_with_path(  # the vocabulary axes: the first v rows
      lambda path, x: np.asarray(x)[:v] if "embed" in jax.tree_util.keystr(path)
      else np.asarray(x)[..., :v] if "lm_head" in jax.tree_util.keystr(path) else np.asarray(x),
      fixture)
  out = {}
  for phase, saved in steps.items():
    with Checkpointer(os.path.join(str(workdir), "checkpoints", phase), keep=10,
                      async_save=False) as ckpt:
      for step in saved:
        params = jax.tree.map(lambda x: x * np.float32(1 + step / 10), fixture)
        ckpt.save(step, {"params": params}, {"phase": phase, "config": config.to_json()})
        out[f"{phase}{step}"] = params
  return config, out


# --------------------------------------------------------------------------------- RL


def rl_step_config(loss: str = "stabledrl", advantage: str = "centered", estimator: str = "elbo",
                   estimator_cfg=None, *, inner_steps: int = 2, num_states: int = 4, **options):
  """``RLStepConfig`` with default loss / advantage options and the toy MASK / EOS ids;
  ``options`` are further fields (kl_coef, micro_batch, advantage_cfg, ...)."""
  from dllm_rl.diffusion.estimators import EstimatorConfig
  from dllm_rl.rl.advantages import AdvantageConfig
  from dllm_rl.rl.losses import LossConfig
  from dllm_rl.rl.step import RLStepConfig
  fields = dict(loss_cfg=LossConfig(), advantage_cfg=AdvantageConfig(), mask_id=MASK,
                eos_id=EOS)
  fields.update(options)
  return RLStepConfig(loss=loss, advantage=advantage, estimator=estimator,
                      estimator_cfg=estimator_cfg if estimator_cfg is not None
                      else EstimatorConfig(),
                      inner_steps=inner_steps, num_states=num_states, **fields)


def trajectory_rl_step_grads(model_cfg, rollout, estimator_cfg, loss: str, advantage: str,
                             micro_batch: int):
  """One jitted RL step on the ``trajectory`` estimator (4 states, 2 inner steps, lr 1e-2)
  from ``model_cfg``'s key-0 initialisation, with an optimizer whose state captures the last
  gradients: (those gradients, the step's metrics), on the host."""
  import optax
  from dllm_rl.models import transformer as T
  from dllm_rl.parallel.shard import init_train_state
  from dllm_rl.rl.advantages import AdvantageConfig
  from dllm_rl.rl.step import make_rl_step
  cfg = rl_step_config(loss, advantage, "trajectory", estimator_cfg, inner_steps=2,
                       num_states=4, advantage_cfg=AdvantageConfig(num_states=4),
                       micro_batch=micro_batch)
  graphdef, params = T.init_model(model_cfg, jax.random.key(0))
  capture = optax.GradientTransformation(
      init=lambda p: jax.tree.map(jnp.zeros_like, p),
      update=lambda g, state, params=None: (jax.tree.map(jnp.zeros_like, g), g))
  state = init_train_state(params, capture, jax.random.key(1))
  state, metrics = make_rl_step(graphdef, capture, lambda s: 1e-2, cfg)(state, rollout,
                                                                        jax.random.key(3))
  return jax.device_get(state.opt_state), jax.device_get(metrics)


def assert_rl_step_runs_and_micro_batches_agree(step, loss: str, advantage: str,
                                               reduction: str) -> None:
  """``step(loss, advantage, micro_batch, reduction)`` → (gradients, metrics) of one jitted
  RL step at θ = θ_old (:func:`trajectory_rl_step_grads`): |log ρ̂| at the first inner step
  is float rounding between the no-grad program of ℓ̂_old and the differentiated one of ℓ̂_θ,
  the loss is finite and the gradients are not 0; for ``stabledrl``, 4 micro-batches give the
  loss and gradients of one batch."""
  import numpy as np
  grads, metrics = step(loss, advantage, 0, reduction)
  assert metrics["abs_log_ratio_max_first"] < 1e-4
  leaves = jax.tree_util.tree_leaves(grads)
  scale = max(float(np.abs(x).max()) for x in leaves)
  assert np.isfinite(metrics["loss"]) and scale > 1e-4
  if loss != "stabledrl":
    return
  micro_grads, micro_metrics = step(loss, advantage, 2, reduction)  # 4 micro-batches
  np.testing.assert_allclose(micro_metrics["loss"], metrics["loss"], rtol=1e-5, atol=1e-7)
  for a, b in zip(jax.tree_util.tree_leaves(micro_grads), leaves):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * scale)


def random_rollout_batch(seed: int, b: int, g: int, p: int, l: int, vocab_size: int,
                         unmask_period: int):
  """A rollout batch of b prompts × g completions: tokens uniform in [3, vocab_size) (no
  mask / EOS), all prompt tokens valid, unmask step of position i = i mod
  ``unmask_period``, Bernoulli(½) 0/1 rewards (correct = reward > 0)."""
  from dllm_rl.rl.step import RolloutBatch
  k = jax.random.split(jax.random.key(seed), 3)
  rewards = jax.random.bernoulli(k[0], 0.5, (b, g)).astype(jnp.float32)
  return RolloutBatch(
      prompt_BP=jax.random.randint(k[1], (b, p), 3, vocab_size),
      prompt_valid_BP=jnp.ones((b, p), bool),
      completion_BGL=jax.random.randint(k[2], (b, g, l), 3, vocab_size),
      unmask_step_BGL=jnp.broadcast_to(jnp.arange(l) % unmask_period, (b, g, l)),
      rewards_BG=rewards, correct_BG=rewards > 0)


# ----------------------------------------------------------------------- run outputs


def staircase_inputs(b: int, p: int, l: int, h: int, kh: int, qd: int = 16,
                     dtype=jnp.float32, seed: int = 0):
  """(q [B, N, H, Q], k, v [B, N, K, Q] in ``dtype``, a float32 cotangent like q) of a
  staircase layout with N = p + 2l, from ``seed``."""
  n = p + 2 * l
  ks = jax.random.split(jax.random.key(seed), 4)
  q, k, v = (jax.random.normal(key, (b, n, heads, qd), jnp.float32).astype(dtype)
             for key, heads in zip(ks[:3], (h, kh, kh)))
  return q, k, v, jax.random.normal(ks[3], (b, n, h, qd), jnp.float32)


def left_pad_valid(n: int, pads):
  """bool [B, n] key validity: row b's first ``pads[b]`` keys are padding."""
  return jnp.arange(n)[None, :] >= jnp.asarray(pads)[:, None]


def assert_test_figures(summary: Mapping[str, Any], workdir, phase: str, test_size: int = 32):
  """Exact relations between a finished phase's summary and what it wrote: its test
  accuracies are those of the phase's (last) test line of metrics.jsonl; the greedy
  accuracy counts whole prompts (a multiple of 1 / test_size); pass@1 is the mean sample
  accuracy (the unbiased pass@k at k = 1 is c / n) and pass@k grows with k."""
  from dllm_rl.infra.observability import read_metrics
  line = [r for r in read_metrics(str(workdir), phase=phase) if "test_accuracy" in r][-1]
  accuracy = summary[f"{phase}_accuracy"]
  assert accuracy == line["test_accuracy"]
  assert summary[f"{phase}_sample_accuracy"] == line["test_sample_accuracy"]
  assert accuracy * test_size == round(accuracy * test_size)
  pass_at_k = summary[f"{phase}_pass_at_k"]
  assert abs(pass_at_k["1"] - summary[f"{phase}_sample_accuracy"]) <= 1e-12
  ks = sorted(pass_at_k, key=int)
  assert all(pass_at_k[a] <= pass_at_k[b] for a, b in zip(ks, ks[1:]))


def malformed_table_rows(markdown: str) -> list[str]:
  """The rows of ``markdown``'s tables whose cell count differs from their delimiter row's:
  an unescaped ``|`` inside a cell splits it, and GitHub then does not render the table."""
  import re
  cells = lambda line: len(re.split(r"(?<!\\)\|", line.strip()))
  lines, bad, i = markdown.split("\n"), [], 0
  while i < len(lines):
    if (lines[i].startswith("|") and i + 1 < len(lines)
        and re.fullmatch(r"\|( *:?-+:? *\|)+ *", lines[i + 1])):
      n, j = cells(lines[i + 1]), i
      while j < len(lines) and lines[j].startswith("|"):
        if cells(lines[j]) != n:
          bad.append(lines[j])
        j += 1
      i = j
    else:
      i += 1
  return bad


def fresh_jax_env(**extra: str) -> dict:
  """This process's environment for a fresh Python process: every JAX_* / XLA_* variable
  dropped (the 8 simulated CPU devices, the compilation cache), the repository importable,
  then ``extra`` (e.g. JAX_PLATFORMS="cpu")."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
  return {**env, "PYTHONPATH": ROOT, **extra}
