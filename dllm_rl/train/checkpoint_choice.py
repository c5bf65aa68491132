"""The names a user picks a run's checkpoint by (``convert export --phase / --step``;
``eval.phase`` / ``eval.checkpoint_step`` name the same things): constants only, no JAX, so a
CLI can build its parser (and answer ``--help``) before the heavy imports."""

PHASES = ("sft", "rl")  # training order: the newest last
AUTO = "auto"  # the newest phase that has a checkpoint
LATEST = -1  # the newest step of the phase
