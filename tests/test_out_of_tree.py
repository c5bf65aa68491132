"""README "Out-of-tree components": a loss and an advantage registered by a module outside
dllm_rl, imported by a config file outside it, as the README's example writes them (its two
``# my_algo.py`` / ``# my_config.py`` blocks). Each check runs in a subprocess: the module
registers names in the process-global registries, and ``dllm_rl.main`` defines absl flags."""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ("my_algo.py", "my_config.py")


def _example(folder) -> str:
  """Writes the README's example files into ``folder``; returns its path."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  for name in FILES:
    blocks = re.findall(rf"```python\n(# {re.escape(name)}\n.*?)```", readme, re.S)
    assert len(blocks) == 1, f"README.md has {len(blocks)} ```python blocks starting # {name}"
    (folder / name).write_text(blocks[0])
  return str(folder)


def _run(args, *, path=(), cwd=None, timeout=120):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join((*path, ROOT)), JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                        cwd=cwd or ROOT, timeout=timeout)


CHECK = """
import json, sys
from dllm_rl.config import cli
from dllm_rl.config.unread import unread_settings
from dllm_rl.train.validate import validate
config = cli.load(sys.argv[1], [("rl.eps", "0.3"), ("rl.ref_sync_every", "5")], check=validate)
print(json.dumps({"loss": config.rl.loss, "advantage": config.rl.advantage,
                  "unread": unread_settings(config)}))
"""


def test_the_readme_example_validates_and_the_unread_rules_judge_it(tmp_path):
  """The config file's import registers the names before validation; rl.eps (which my_loss
  reads, as grpo does) is not said to be unread, rl.ref_sync_every without a KL term still is."""
  folder = _example(tmp_path)
  res = _run(["-c", CHECK, os.path.join(folder, "my_config.py")], path=(folder,))
  assert res.returncode == 0, res.stderr
  out = json.loads(res.stdout.strip().splitlines()[-1])
  assert (out["loss"], out["advantage"]) == ("my_loss", "my_adv")
  assert [line.split(" is not read")[0] for line in out["unread"]] == [
      "config.rl.ref_sync_every=5"]


def test_a_module_off_the_import_path_or_not_imported_is_a_config_error_that_says_so(tmp_path):
  """The config file's folder is not on the import path: the error names PYTHONPATH; a name
  that no import registered lists the registered ones and says to import the module."""
  folder = _example(tmp_path)
  work = str(tmp_path / "run")
  res = _run(["-m", "dllm_rl.main", f"--config={folder}/my_config.py", f"--workdir={work}"])
  assert res.returncode == 2, res.stderr
  assert ("ModuleNotFoundError: No module named 'my_algo' (my_algo is beside the config file,"
          " but a config file's folder is not on the import path: run with"
          f" PYTHONPATH={folder})") in res.stderr
  res = _run(["-m", "dllm_rl.main", f"--workdir={work}", "--config.rl.loss=my_loss"],
             path=(folder,))
  assert res.returncode == 2, res.stderr
  assert ("error: config.rl.loss: unknown policy loss 'my_loss'; available: espo, grpo,"
          in res.stderr)
  assert ("A policy loss registered outside dllm_rl is known once the module that registers it"
          " is imported: import it in the config file (--config=PATH)") in res.stderr


@pytest.mark.slow
def test_the_readme_example_trains_resumes_and_exports(tmp_path):
  """A tiny run with the out-of-tree loss and advantage, its resume with one more RL step, and
  ``convert export`` of it without the module on the path (the checkpoint's config names
  my_loss, which the export does not look up)."""
  folder = _example(tmp_path)
  work, hf = str(tmp_path / "run"), str(tmp_path / "hf")
  tiny = ["--config.sft.steps=4", "--config.sft.warmup_steps=0",
          "--config.rl.warmup_steps=0", "--config.rl.eval_every=0"]
  run = ["-m", "dllm_rl.main", f"--config={folder}/my_config.py", f"--workdir={work}", *tiny]
  res = _run([*run, "--config.rl.steps=1"], path=(folder,), timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  assert json.loads(res.stdout[res.stdout.index("{"):])["rl_steps"] == 1
  res = _run([*run, "--config.rl.steps=2"], path=(folder,), timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  assert "[rl] resumed at rollout batch 1" in res.stdout
  res = _run(["-m", "dllm_rl.convert", "export", "--workdir", work, "--hf_dir", hf])
  assert res.returncode == 0, res.stderr[-3000:]
  assert os.path.isfile(os.path.join(hf, "config.json"))
