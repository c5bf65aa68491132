"""launch/README.md's dry-run listings: each is what its command prints today (the `+ ` lines,
with /path/to/checkout standing for the checkout), so a launcher change that alters a printed
command also changes the listing a reader copies."""

from __future__ import annotations

import os
import re
import shlex

from tests.test_launch import REPO, commands, recording_tools, run_script

README = os.path.join(REPO, "launch", "README.md")
# "Dry run (`CMD`):" or "Dry run outside an allocation (`CMD`; ...):", then a fenced listing.
_DRY_RUN = re.compile(r"Dry run[^(`]*\(`([^`]+)`[^)]*\):\s*```\n(.*?)```", re.S)


def _listings() -> list[tuple[list[str], list[str]]]:
  """(the command's words, the listing's `+ ` lines) of every dry run in launch/README.md."""
  with open(README, encoding="utf-8") as fh:
    text = fh.read()
  return [(shlex.split(" ".join(cmd.split())),
           [line.replace("/path/to/checkout", REPO) for line in listing.splitlines()
            if line.startswith("+ ")])
          for cmd, listing in _DRY_RUN.findall(text)]


def test_every_dry_run_listing_is_what_the_script_prints(tmp_path):
  listings = _listings()
  assert [words[0] for words, _ in listings] == ["launch/tpu_pod.sh", "launch/slurm_gpu.sh"]
  env = recording_tools(tmp_path, {tool: f"touch '{tmp_path}/called-{tool}'; exit 97" for tool in
                                   ("gcloud", "srun", "sbatch", "scontrol", "salloc")})
  env["TMPDIR"] = "/tmp"  # the listing's tarball path; a dry run writes nothing there
  for words, expected in listings:
    res = run_script(os.path.join(REPO, words[0]), words[1:], env, REPO)
    assert res.returncode == 0, res.stderr
    printed = [line for line in res.stdout.splitlines() if line.startswith("+ ")]
    assert printed == expected, words[0]
    assert commands(res.stdout)  # the lines parse as shell words
  assert not list(tmp_path.glob("called-*"))
