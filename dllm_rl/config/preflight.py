"""The launchers' check of a run's config before they create or reach any machine.

``python -m dllm_rl.config.preflight CONFIG SLICES [--config.KEY=VALUE ...]`` loads the config
file, applies the overrides and checks what needs no accelerator and no import of the training
stack (a fraction of a second): the file loads, every override names a key and parses as its
type, and with ``SLICES`` > 1 (TPU multislice) ``mesh.data`` is a multiple of the slice count —
the mesh's data axis alone spans the slices (``dllm_rl.parallel.mesh``), which the workers
would otherwise find only after the slices were created, set up and staged. Every problem is
printed as ``error: config.<key>: ...`` and the status is 2; 0 when all is well. The full
validation (``dllm_rl.train.validate``) still runs on the workers, before anything compiles.
"""

from __future__ import annotations

import sys

from dllm_rl.config.cli import EXIT_CONFIG, config_line, fail, split_overrides
from dllm_rl.config.overrides import apply_overrides
from dllm_rl.config.schema import load_config_file
from dllm_rl.errors import ConfigError


def problems(path: str, slices: int, argv: list[str]) -> list[ConfigError]:
  """The problems of config file ``path`` under the ``--config.`` overrides in ``argv`` for a
  run on ``slices`` TPU slices (empty when there are none). Other words of ``argv`` are left
  to ``dllm_rl.main`` (it takes absl's own flags too, e.g. ``--verbosity``)."""
  _, overrides = split_overrides(argv)  # other flags (absl's --verbosity, ...): main's to judge
  config = load_config_file(path)
  errors = apply_overrides(config, overrides, [])
  data = config.mesh.data  # -1 (the devices the other axes leave) is resolved on the workers
  if slices > 1 and not errors and data != -1 and (data < 1 or data % slices):
    errors.append(ConfigError(
        "mesh.data", f"{data} is not a multiple of the {slices} slices (--slices {slices}): the "
        "data axis alone spans the slices; set --config.mesh.data to a multiple of it (and "
        "check the plan: python -m dllm_rl.plan --topology=TYPE --slices="
        f"{slices} with the same overrides)"))
  return errors


def main(argv: list[str]) -> int:
  if len(argv) < 2 or not argv[1].isdigit() or int(argv[1]) < 1:
    print("usage: python -m dllm_rl.config.preflight CONFIG SLICES [--config.KEY=VALUE ...]",
          file=sys.stderr)
    return EXIT_CONFIG
  try:
    errors = problems(argv[0], int(argv[1]), argv[2:])
  except Exception as e:  # noqa: BLE001 - a broken config file: its line, no traceback
    print(f"error: --config={argv[0]}{config_line(e, argv[0])}: {type(e).__name__}: {e}",
          file=sys.stderr)
    return EXIT_CONFIG
  if errors:
    fail(errors)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
