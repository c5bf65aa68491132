"""Testbeds of the study: the base config every arm and the SFT start are built from.

``python -m dllm_rl.study NAME --testbed=T`` (``--scale=gpu`` is ``--testbed=gpu``). Each
testbed is a :class:`Testbed`: a ``get_config()`` of a whole pipeline run (SFT warm-up → RL →
held-out evaluation, like the embedded default) and the study's run lengths on it (RL steps
per arm, validation interval and seeds of the full study; the quick study's), registered by
name in :data:`TESTBEDS`. Nothing here knows the study's arms: they override RL keys only.

* ``arithmetic`` — the embedded default (``dllm_rl/config/defaults.py``): 0.1M parameters,
  3-digit addition, 8-token completions in one block. One correct answer per prompt.
* ``countdown`` — :func:`countdown`: the first harder CPU testbed of issue 18 (≥ 32-token
  completions in ≥ 2 blocks, ~1M parameters, many correct answers per prompt); its SFT
  warm-up has not been shown to reach its target.
* ``chain`` — :func:`chain`: the harder CPU testbed the study runs on (chain addition with a
  scratchpad, 48-token completions in 3 blocks, ~1M parameters, many correct orders), with
  one SFT start shared by the seeds.
* ``chain_orders`` — :func:`chain_orders`: ``chain`` with SFT answers in a rotation of the
  prompt's order, meant for StepRS (several correct answers per prompt from the start); its
  warm-up is not shown to reach its target.
* ``sum_split`` — :func:`sum_split`: the embedded default's model and sizes on a task with
  up to 100 correct answers per prompt whose SFT start writes several (StepRS's testbed).
* ``gpu`` — :func:`gpu`: ``chain``'s task at ~85M parameters, 128-token
  completions in blocks of 32, the official StableDRL estimator; for one H200 (not runnable
  on CPU at size).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import ml_collections

from dllm_rl.config import defaults, recipes
from dllm_rl.config.schema import locked
from dllm_rl.registry import Registry


@dataclasses.dataclass(frozen=True)
class Testbed:
  """A base config, what it runs in a few words (the report's header), and the study's run
  lengths on it: (rl_steps, eval_every, seeds) of the full study and of ``--quick``.
  ``shared_sft``: every seed's arms start from one SFT checkpoint (seed 0's), for a testbed
  whose warm-up is too long to repeat per seed; the seeds then vary the RL randomness only
  (rollouts, masks, evaluation samples), and the report says so."""

  get_config: Callable[[], ml_collections.ConfigDict]
  description: str
  full: tuple[int, int, int]
  quick: tuple[int, int, int]
  shared_sft: bool = False


TESTBEDS: Registry = Registry("testbed")
DEFAULT = "arithmetic"


def _countdown_task(c: ml_collections.ConfigDict) -> None:
  """Countdown with 4 numbers in [1, 10] and a target in [1, 100]: the reference answer is
  7–14 characters in seeds 0-4's splits (mean 8.7; at most 15: four 10s, 3 ops and
  2 pairs of parentheses), so with EOS it spans two 8-token blocks; many expressions hit
  a target (``distinct_correct`` counts them per prompt)."""
  c.task.name = "countdown"
  c.task.options = ml_collections.ConfigDict({"num_numbers": 4, "max_number": 10,
                                              "max_target": 100})
  c.data.prompt_len = 16         # the longest, "10,10,10,10>100=", is 16 characters


def countdown() -> ml_collections.ConfigDict:
  """The harder CPU testbed: Countdown (4 numbers), a 1.1M-parameter model (d 128, 5 layers),
  32-token completions sampled in 4 blocks of 8 (16 denoising steps, 2 tokens a step; the
  answer itself takes two blocks), SFT stopped at validation accuracy 0.25 (RL headroom;
  not yet shown reachable: one seed was still at 0 at step 1300, docs/study.md "Testbeds"),
  then the embedded default's RL (StableDRL, centered, lr 2e-4 with its cosine decay but no
  warm-up, μ = 2) on 4 prompts × 8 completions a rollout batch. Evaluation sizes are small
  (64 validation / 64 test prompts, pass@k from 8 samples) because sampling dominates an
  arm's time on 2 CPU cores. Sizing and measured times: docs/study.md "Testbeds"."""
  c = defaults.get_config()
  c.unlock()
  _countdown_task(c)
  c.model.d_model = 128
  c.model.n_layers = 5
  c.model.n_heads = 4
  c.model.mlp_hidden = 384
  c.data.completion_len = 32
  c.sampler.block_len = 8
  c.sampler.steps = 16
  c.estimator.spg_block_len = 8  # spg_block (the study's official estimator): sampler blocks
  c.task.val_size = 64
  c.task.test_size = 64
  c.sft.steps = 3000
  c.sft.eval_every = 100
  c.sft.target_accuracy = 0.25
  c.rl.batch_prompts = 4
  c.rl.group_size = 8
  c.rl.eval_every = 20
  c.rl.warmup_steps = 0  # study arms run 10–50 RL steps: no room for the default's warm-up
  c.eval.num_samples = 8
  c.checkpoint.save_every = 500
  return locked(c)


def chain() -> ml_collections.ConfigDict:
  """The harder CPU testbed: chain addition with a scratchpad (``dllm_rl/tasks/chain.py``:
  6 one-digit numbers added one at a time, every partial sum written, digits reversed; a
  38-character answer, so ≥ 32 scored tokens, and up to 6! = 720 correct orders per prompt),
  a 1.1M-parameter model (d 128, 5 layers, MLP 384), 48-token completions sampled in 3
  blocks of 16 (24 denoising steps, 2 tokens a step), SFT stopped at validation accuracy
  0.25 (RL headroom), then the embedded default's RL at lr 2e-5 (not 2e-4) on 4 prompts ×
  8 completions a rollout batch. Six one-digit numbers have 5,005 distinct multisets, so the
  training set is 4,000 of the 4,509 outside the test split. The warm-up escapes its
  plateau only after ~1,500 steps (docs/study.md "Testbeds"), too long to repeat per seed: the
  study shares seed 0's SFT start across seeds (``shared_sft``). Evaluation sizes are small
  (64 validation / 64 test prompts, pass@k from 8 samples) because sampling dominates an
  arm's time on 2 CPU cores.
  (Three-digit operands, the first version, never left the plateau in 900 steps.)"""
  c = countdown()  # its model, evaluation sizes, SFT stop and RL batch
  c.unlock()
  c.task.name = "chain"
  c.task.options = ml_collections.ConfigDict({"num_numbers": 6, "num_digits": 1})
  c.task.train_size = 4000       # of the 4,509 training multisets (5,005 in all)
  c.data.prompt_len = 16         # "8+6+5+2+3+0=" is 12 characters
  c.data.completion_len = 48     # the 38-character scratchpad + EOS fill
  c.sampler.block_len = 16
  c.sampler.steps = 24
  c.estimator.spg_block_len = 16  # spg_block (the study's official estimator): sampler blocks
  c.rl.eval_every = 10
  # From this start, StableDRL with centered advantages at lr 6e-5 fell to validation 0.000
  # within 10 RL steps; at 2e-5 it held 0.30–0.39 (one probe each, docs/study.md "Testbeds").
  c.rl.lr = 2e-5
  return locked(c)


def chain_orders() -> ml_collections.ConfigDict:
  """:func:`chain` with SFT answers that add the operands in a rotation of the prompt's order
  drawn per example (``task.options.answer_order="rotation"``: start at any of the 6
  operands, then follow the prompt cyclically): the SFT start then writes several correct
  orders of one prompt, so a policy's distinct correct answers per prompt could exceed one
  and StepRS's exploration claim (more distinct correct answers, higher pass@k) would be
  measurable (on :func:`chain` every policy found at most one order per prompt,
  ``docs/results_chain_steprs.md``). **Its warm-up is not shown to reach its target**: it
  was at validation 0.000 through all 3000 SFT steps, as a random order per example was at
  step 2580 (docs/study.md "Testbeds"). Everything else is :func:`chain`'s."""
  c = chain()
  c.unlock()
  c.task.options.answer_order = "rotation"
  return locked(c)


def sum_split() -> ml_collections.ConfigDict:
  """The embedded default with its task swapped for sum split (``dllm_rl/tasks/sum_split.py``:
  write a 3-digit target as the sum of two 2-digit numbers, digits least-significant first,
  SFT answers a uniformly drawn split per example): the same 0.1M-parameter model, 8-token
  prompts and completions in one block, SFT stop at validation accuracy 0.3 and RL. A target
  has up to 100 correct answers and the SFT start writes several of them (seed 0's: 7.8
  distinct answers in 8 samples, pass@1 0.26, pass@8 0.86), so StepRS's exploration measures
  (distinct correct answers per prompt, pass@k) can move, as they cannot on addition's one
  answer. The warm-up is slower than addition's: y's digits depend on x's inside the answer,
  and seed 0 reached the target at step 3950 (6000 allowed; 2-digit addends: with 3 digits
  validation was 0.008 after 2000 steps). The study shares seed 0's SFT start across seeds
  (``shared_sft``) to fit its arms in one session on 2 cores. Targets 0–198 give 10,000
  (target, x) pairs, 9,092 of them training-split: 6,000 are trained on."""
  c = defaults.get_config()
  c.unlock()
  c.task.name = "sum_split"
  c.task.options = ml_collections.ConfigDict({"num_digits": 2})
  c.task.train_size = 6000
  c.data.prompt_len = 8          # "864=" is 4 characters
  c.data.completion_len = 8      # "21+54" is 5 characters, + EOS
  c.sft.steps = 6000
  c.sft.eval_every = 50
  return locked(c)


def gpu() -> ml_collections.ConfigDict:
  """The GPU profile (``--scale=gpu``): the ``chain`` testbed's task (6 one-digit numbers added
  one at a time, a 38-character scratchpad whose scored action spans two of the four 32-token
  blocks, up to 720 correct orders) at ~85M parameters (d 768, 12 layers, 12 heads, MLP 2048,
  bfloat16 compute, scanned layers), 128-token completions sampled in 4 blocks of 32 (64
  steps), the official StableDRL estimator (``spg_block``, K = 2, prompt masking 0.15; the
  study's arms set it too), 8 prompts × 16 completions, μ = 2, one SFT start shared by the
  seeds (as ``chain``): the CPU testbed's claims at 80× the parameters and 2.7× the completion.

  Countdown, the profile's first task, was run on an H200 (docs/gpu.md): its SFT start
  never learned it (validation ≤ 1/128 at every evaluation, test 0.031 after all 1500 steps),
  so no arm had anything to learn. ``chain``'s warm-up reached validation 0.44 at step 1900 at
  1.1M parameters on CPU; a 9-number chain (62-character answers) was still at 0.06 after 3000
  steps there and a 7-number one at 0.000 after 2500 (the plateau's escape is erratic at
  1.1M), so the profile keeps 6 numbers. At 85M on the H200 the warm-up stopped at its
  target at step 1400 (validation 0.297, test 0.320; 50.4 ms a step, 173 s in all), and the
  7 main arms at the default lr took 35–59 s each: 8.25 min for the lot
  (``docs/results_gpu_chain_quick/``). It runs on CPU only at tiny override sizes (tests)."""
  c = chain()
  c.unlock()
  c.model.d_model = 768
  c.model.n_layers = 12
  c.model.n_heads = 12
  c.model.mlp_hidden = 2048
  c.model.dtype = "bfloat16"
  c.model.scan_layers = True
  c.data.completion_len = 128
  c.sampler.block_len = 32
  c.sampler.steps = 64
  c.update_from_flattened_dict(recipes.OFFICIAL_ESTIMATOR)
  c.estimator.spg_block_len = 32
  c.task.val_size = 128
  c.task.test_size = 128
  c.data.batch_size = 128
  c.eval.batch_size = 256
  c.sft.steps = 3000
  c.sft.lr = 5e-4
  c.sft.eval_every = 100
  c.sft.target_accuracy = 0.25
  c.rl.batch_prompts = 8
  c.rl.group_size = 16
  c.rl.lr = 1e-5
  c.rl.warmup_steps = 0  # study arms run 20–40 RL steps: no room for the default's warm-up
  c.rl.eval_every = 10
  c.checkpoint.save_every = 500
  return locked(c)


TESTBEDS.register("arithmetic")(Testbed(
    defaults.get_config, "the embedded default: 3-digit addition, 0.1M parameters, 8-token"
    " completions in one block (`dllm_rl/config/defaults.py`)",
    full=(200, 20, 5), quick=(10, 5, 1)))
TESTBEDS.register("countdown")(Testbed(
    countdown, "Countdown with 4 numbers in [1, 10], 1.1M parameters, 32-token completions in"
    " 4 blocks of 8 (`dllm_rl/config/testbeds.py: countdown`)",
    full=(50, 10, 5), quick=(10, 5, 1)))
TESTBEDS.register("chain")(Testbed(
    chain, "chain addition with a scratchpad: 6 one-digit numbers added one at a time"
    " (38-character answers, up to 720 correct orders), 1.1M parameters, 48-token completions"
    " in 3 blocks of 16, one SFT start shared by the seeds (`dllm_rl/config/testbeds.py:"
    " chain`)",
    full=(30, 10, 5), quick=(10, 5, 1), shared_sft=True))
TESTBEDS.register("chain_orders")(Testbed(
    chain_orders, "chain addition as `chain`, with SFT answers in a rotation of the prompt's"
    " order (the SFT start writes several correct orders per prompt), one SFT start shared"
    " by the seeds (`dllm_rl/config/testbeds.py: chain_orders`)",
    full=(30, 10, 5), quick=(10, 5, 1), shared_sft=True))
TESTBEDS.register("sum_split")(Testbed(
    sum_split, "sum split: a 3-digit target written as the sum of two 2-digit numbers (up to"
    " 100 correct answers per prompt; the SFT answers draw one per example), 0.1M parameters,"
    " 8-token completions in one block, one SFT start shared by the seeds"
    " (`dllm_rl/config/testbeds.py: sum_split`)",
    full=(200, 20, 5), quick=(20, 10, 1), shared_sft=True))
TESTBEDS.register("gpu")(Testbed(
    gpu, "the GPU profile: chain addition as `chain` (6 one-digit numbers, 38-character"
    " answers), 85M parameters, 128-token completions in 4 blocks of 32, bfloat16, one SFT"
    " start shared by the seeds (`dllm_rl/config/testbeds.py: gpu`)",
    full=(40, 10, 5), quick=(20, 10, 1), shared_sft=True))


def testbed(name: str) -> Testbed:
  """The registered testbed ``name``; a ``ValueError`` listing the names otherwise."""
  if name not in TESTBEDS:
    raise ValueError(TESTBEDS.unknown_message(name))
  return TESTBEDS.get(name)


def resolve(testbed: str | None, scale: str | None = None) -> str:
  """The testbed named by the study's ``--testbed`` or ``--scale`` (``gpu``; ``cpu`` = the
  default testbed); a ConfigError (a ValueError) naming the flag, listing the names when
  unknown, or when the two disagree: the command line prints it as one ``error:`` line."""
  from dllm_rl.errors import ConfigError
  if scale not in (None, "cpu", "gpu"):
    raise ConfigError("--scale", f"{scale!r} is not cpu or gpu (or --testbed:"
                      f" {', '.join(TESTBEDS.names())})")
  from_scale = {"gpu": "gpu", "cpu": DEFAULT}.get(scale)
  if testbed is not None and from_scale is not None and testbed != from_scale:
    raise ConfigError("--testbed", f"{testbed} and --scale={scale} (the {from_scale} testbed)"
                      " disagree: give one of them")
  name = testbed or from_scale or DEFAULT
  if name not in TESTBEDS:
    raise ConfigError("--testbed", TESTBEDS.unknown_message(name))
  return name
