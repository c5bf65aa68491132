"""Where a study's numbers come from: the code's git commit and the machine, recorded in the
report's header and in every run's record (``run.json``), so a report that reuses runs from
earlier invocations can name the code and machine each of them ran on."""

from __future__ import annotations

import functools
import os
import platform
import subprocess


@functools.cache
def machine() -> str:
  """"Linux x86_64, 2 CPU cores (Intel(R) Xeon(R) Processor)": system, architecture, cores and
  the CPU's model name (from /proc/cpuinfo where there is one)."""
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as fh:
      names = [l.split(":", 1)[1].strip() for l in fh if l.startswith("model name")]
    cpu = names[0] if names else cpu
  except OSError:
    pass
  return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores ({cpu})"


@functools.cache
def git_commit() -> str:
  """The git commit of the code that runs (``+dirty`` with uncommitted changes to the package
  or the configs: edits to docs or tests do not change a run), or "n/a" outside a git
  checkout. Read once per process (the study calls it when it starts): a process keeps the
  code it imported, so a commit made while it runs is not its code."""
  here = os.path.dirname(os.path.abspath(__file__))
  try:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, check=True,
                          capture_output=True, text=True, timeout=10).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                            ":/dllm_rl", ":/configs"], cwd=here, check=True,
                           capture_output=True, text=True, timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "n/a"
  return head + ("+dirty" if dirty else "")
