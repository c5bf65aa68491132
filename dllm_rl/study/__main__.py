"""``python -m dllm_rl.study NAME --workdir=DIR [--testbed=T] [--seeds=N] [--quick]
[--config.key=value ...]``

NAME: ``stability``, ``steprs``, ``baselines``, a comma-separated list of them
(``stability,steprs``) or ``all`` (every registered study). Trains one SFT checkpoint per seed
(one for every seed on the testbeds whose seeds share a start: ``chain``, ``chain_orders``,
``sum_split``, ``gpu``), runs every arm from it, writes ``DIR/<study>.json`` (every run,
per-step records, per-arm summaries), ``DIR/<study>_curves.png`` (stability also
``_spikes.png``), and
``--results`` (default ``DIR/results.md``, plots and JSON copied to ``DIR/results/``; pass
``--results=docs/results.md`` to replace the committed report) from that JSON.
``--config.KEY=VALUE`` (or the older spelling ``--set=KEY=VALUE``) overrides a config key of
every run (e.g. tiny sizes for tests; a key every chosen arm sets itself, such as ``rl.lr``,
is refused: the arms' lrs follow the testbed's base config), parsed
as ``python -m dllm_rl.main`` parses it (dllm_rl.config.cli: every problem printed, exit
status 2). ``--testbed`` (``arithmetic``, the embedded default; ``countdown``; ``chain``;
``chain_orders``; ``sum_split``; ``gpu``, also spelled ``--scale=gpu``: every one is in
``dllm_rl/config/testbeds.py``) chooses the base config of the SFT start and every arm, and
the study's run lengths; ``--sft_seed=N`` trains the one SFT start of such a testbed from seed N
(another start, in its own DIR). ``--prefetch`` / ``--noprefetch``: compile the arms' programs
in a background thread ahead of the arm that trains (default: with a GPU or TPU only;
dllm_rl/study/prefetch.py). Finished arms are reused on rerun. SIGTERM / SIGINT stop the study
after the run in progress (a run still training saves a checkpoint first) with exit status 75:
rerun the same command to resume. ``--reuse_from=FILE[,FILE]``: an earlier report's runs
(its study JSON) seed DIR, and reruns already in DIR are checked against them bit for bit
(dllm_rl/study/reuse.py): extend a committed study with more seeds without rerunning it.
"""

from __future__ import annotations

import os
import sys

from absl import flags, logging

from dllm_rl.config import cli
from dllm_rl.config import testbeds
from dllm_rl.errors import ConfigError
from dllm_rl.study import arguments
from dllm_rl.study import arms as arms_lib
from dllm_rl.study.studies import study

_WORKDIR = flags.DEFINE_string("workdir", None, "Study directory (SFT, arms, JSON, plots).")
_SEEDS = flags.DEFINE_integer("seeds", None, "Seeds (default: the testbed's, 5; 1 with --quick).")
_QUICK = flags.DEFINE_bool("quick", False, "1 seed, fewer RL steps (the warm-up shrunk in step): a"
                            " smoke run of the study.")
_ARMS = flags.DEFINE_list("arms", None, "Only the arms whose names match one of these shell"
                          " patterns (e.g. 'grpo@*,stabledrl@*'); default: every arm.")
_overrides: list[tuple[str, str]] = []  # --config.KEY=VALUE and --set=KEY=VALUE
_TESTBED = flags.DEFINE_string("testbed", None, "Base config and run lengths of every run:"
                               f" {', '.join(testbeds.TESTBEDS.names())} (default"
                               f" {testbeds.DEFAULT}; dllm_rl/config/testbeds.py).")
_SCALE = flags.DEFINE_string("scale", None, "The issue's spelling of --testbed=gpu: --scale=gpu"
                             " (cpu = the default testbed).")
_RESULTS = flags.DEFINE_string("results", None, "Markdown report to write (default DIR/results.md;"
                               " the committed report is docs/results.md).")
_STEPS = flags.DEFINE_integer("rl_steps", None, "RL steps per arm (default: the testbed's, its"
                              " full study's or with --quick its quick length:"
                              " dllm_rl/config/testbeds.py).")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", None, "Validation every N RL steps (default:"
                                   " the testbed's; collapse is judged on validation, so keep"
                                   " it at most --rl_steps).")
_FIRST_SEED = flags.DEFINE_integer("first_seed", 0, "The first seed: the study runs --seeds"
                                   " seeds from it (e.g. --first_seed=20 --seeds=20: seeds"
                                   " 20-39, a fresh set to confirm a result of seeds 0-19 on"
                                   " one look; in the same DIR the SFT start is reused).")
_SFT_SEED = flags.DEFINE_integer("sft_seed", 0, "The seed of the one SFT start on a testbed whose"
                                  " seeds share it (" + ", ".join(
                                      n for n in testbeds.TESTBEDS.names()
                                      if testbeds.testbed(n).shared_sft) + "): the claims from"
                                  " another start (DIR/sft/seed<N>; one start per DIR).")
_REUSE_FROM = flags.DEFINE_list("reuse_from", None, "Study JSONs (.json or .json.gz, e.g. a"
                                 " committed report's docs/<report>/steprs.json.gz) whose runs"
                                 " of this study's arms and seeds are written into DIR as"
                                 " finished runs where DIR has none; runs DIR already has are"
                                 " compared with them (bit for bit; reported). The usual"
                                 " override check applies to every reused run.")
_PREFETCH = flags.DEFINE_bool("prefetch", None, "Compile the arms' RL programs in a background"
                              " thread ahead of the arm that trains (the results are the same)."
                              " Default: on with a GPU or TPU, off on CPU, where compiling and"
                              " training compete for the same cores.")


def main(argv):
  if len(argv) != 2:
    raise cli.usage_error(f"usage: {arguments.program(argv[0])} NAME --workdir=DIR; NAME: "
                          f"{', '.join(arms_lib.STUDIES.names())}, a comma-separated list of"
                          " them, or all")  # the program as typed: dllm-rl-study or python -m
  name = argv[1]
  names = arms_lib.STUDIES.names() if name == "all" else name.split(",")
  for n in names:
    if n not in arms_lib.STUDIES:
      raise cli.usage_error(arms_lib.STUDIES.unknown_message(n))
  if not _WORKDIR.value:
    raise cli.usage_error("--workdir is required")
  if problems := arguments.argument_problems(  # studies.study checks them too: said first here
      workdir=_WORKDIR.value, results=_RESULTS.value, seeds=_SEEDS.value, rl_steps=_STEPS.value,
      eval_every=_EVAL_EVERY.value, first_seed=_FIRST_SEED.value, sft_seed=_SFT_SEED.value,
      arms=_ARMS.value, reuse_from=_REUSE_FROM.value):
    cli.fail(problems)
  logging.set_verbosity(logging.WARNING)
  names = sorted(names, key=lambda n: n != "stability")  # stability first
  try:  # a wrong flag value: one error line naming it, no usage text
    testbed = testbeds.resolve(_TESTBED.value, _SCALE.value)
  except ConfigError as err:
    cli.fail([err])
  bed = testbeds.testbed(testbed)
  if (problem := arms_lib.unmatched(names, _ARMS.value, bed.get_config())) is not None:
    cli.fail([ConfigError("--arms", problem)])
  command = arguments.command_line(sys.argv)  # as typed: dllm-rl-study or python -m
  results = _RESULTS.value or os.path.join(_WORKDIR.value, "results.md")
  from dllm_rl.train.resilience import EXIT_PREEMPTED, NonFiniteError, Preempted
  from dllm_rl.train.validate import validate
  config = cli.load(None, _overrides, check=validate, default=bed.get_config)  # exits 2, all
  overrides = cli.override_values(config, _overrides)
  try:
    study(names, _WORKDIR.value, _SEEDS.value, _QUICK.value, overrides, results, command,
          _STEPS.value, _EVAL_EVERY.value, os.path.join(_WORKDIR.value, "jax_cache"), _ARMS.value,
          testbed, _PREFETCH.value, _SFT_SEED.value, _REUSE_FROM.value, _FIRST_SEED.value)
  except ConfigError as err:
    cli.fail([err])
  except Preempted as stop:  # SIGTERM / SIGINT: the run in progress saved, the study stopped
    print(f"[preemption] {stop}", file=sys.stderr, flush=True)
    sys.exit(EXIT_PREEMPTED)
  except NonFiniteError as err:  # an arm diverged: one line naming it (status 1)
    print(f"error: {err}", file=sys.stderr, flush=True)
    sys.exit(1)


def run():
  """Console-script entry point (pyproject.toml)."""
  cli.run_app(main, _overrides, sys.modules[__name__], aliases=("--set=",))


if __name__ == "__main__":
  run()
