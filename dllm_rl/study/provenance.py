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
  checkout (:func:`commit_of`). Read once per process (the study calls it when it starts): a
  process keeps the code it imported, so a commit made while it runs is not its code."""
  return commit_of(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def commit_of(package: str) -> str:
  """The commit of the checkout whose ``dllm_rl/`` folder is ``package`` (``+dirty`` as
  :func:`git_commit` says), or "n/a" when ``package`` is no checkout's ``dllm_rl/``: an
  installed wheel, also one in a virtual environment inside another git repository (a
  project's ``.venv``), whose commit is not this code's."""
  def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=package, check=True, capture_output=True,
                          text=True, timeout=10).stdout.strip()

  try:
    top = git("rev-parse", "--show-toplevel")
    if os.path.realpath(os.path.join(top, "dllm_rl")) != os.path.realpath(package):
      return "n/a"
    head = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ":/dllm_rl", ":/configs")
  except (OSError, subprocess.SubprocessError):
    return "n/a"
  return head + ("+dirty" if dirty else "")
