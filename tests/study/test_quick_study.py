"""The study's ``--quick`` path end to end at a tiny size, run once for the module: every
arm of the quick selection (:data:`~tests.study.test_study.QUICK_ARMS`) of both studies from
the seed's SFT checkpoint, with background compiles, into its own compilation cache (the
``quick`` fixture: five arms' compiles are most of a minute on 2 cores). Each test then checks
it from its own side: every arm's summary, the JSON, the plots, the report and its rerender;
that the arms loaded what was compiled in the background (dllm_rl.study.prefetch) and give
the same run without it; and a branch of one of its arms, replayed from its records
(``python -m dllm_rl.study.branch``)."""

import dataclasses
import json
import logging
import os
import pathlib
import platform
import shutil
import threading

import pytest

from dllm_rl.config.defaults import get_config
from dllm_rl.errors import ConfigError, each
from dllm_rl.study import arms as arms_lib
from dllm_rl.study import branch, prefetch
from dllm_rl.study.studies import study
from tests.helpers import malformed_table_rows
from tests.study.test_study import _DEFAULT, _HIGH, QUICK_ARMS, TINY


class _CacheLog(logging.Handler):
  """JAX's persistent-cache lines: (thread name, 'hit' / 'miss', cache key)."""

  def __init__(self):
    super().__init__(logging.DEBUG)
    self.events = []

  def emit(self, record):
    msg = record.getMessage()
    for marker, kind in (("Persistent compilation cache hit", "hit"),
                         ("PERSISTENT COMPILATION CACHE MISS", "miss")):
      if msg.startswith(marker):
        self.events.append((threading.current_thread().name, kind, msg.rsplit(" ", 1)[-1]))


def _logged_study(*args, **kwargs) -> tuple[dict, list]:
  """``study(*args, **kwargs)`` and the persistent-cache lines (:class:`_CacheLog`) of it."""
  handler, logger = _CacheLog(), logging.getLogger("jax._src.compiler")
  old_level = logger.level
  logger.setLevel(logging.DEBUG)
  logger.addHandler(handler)
  try:
    return study(*args, **kwargs), handler.events
  finally:
    logger.removeHandler(handler)
    logger.setLevel(old_level)


@dataclasses.dataclass(frozen=True)
class Quick:
  """The module's quick study: its folder ``root`` (``study`` the DIR, ``jax_cache`` its
  compilation cache, ``docs/results.md`` its report), what ``study`` returned and the
  persistent-cache lines (:class:`_CacheLog`) of its run."""

  root: pathlib.Path
  out: dict
  events: list

  workdir = property(lambda self: str(self.root / "study"))
  cache = property(lambda self: str(self.root / "jax_cache"))
  md = property(lambda self: str(self.root / "docs" / "results.md"))


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> Quick:
  """``python -m dllm_rl.study all --quick --prefetch`` at the tiny size: 2 RL steps, a
  validation after each."""
  root = tmp_path_factory.mktemp("quick")
  out, events = _logged_study(
      ["stability", "steprs"], str(root / "study"), None, True, TINY,
      str(root / "docs" / "results.md"), "python -m dllm_rl.study all --quick (test)",
      rl_steps=2, eval_every=1, cache_dir=str(root / "jax_cache"), arm_patterns=QUICK_ARMS,
      prefetch=True)
  return Quick(root, out, events)


@pytest.mark.slow
def test_quick_study_gives_every_arm_a_summary(quick, tmp_path):
  workdir, md, out = quick.workdir, quick.md, quick.out
  assert [r["arm"] for st in out["studies"] for r in st["runs"]] == [
      f"grpo@{_DEFAULT}", f"stabledrl@{_DEFAULT}", f"stabledrl_elbo1@{_HIGH}", "steprs",
      "steprs_calibrated"]
  for result in out["studies"]:
    name = result["study"]
    arms = [a.name for a in arms_lib.select(arms_lib.STUDIES.get(name)(get_config()), QUICK_ARMS)]
    assert sorted(r["arm"] for r in result["runs"]) == sorted(arms)
    for run in result["runs"]:
      assert len(run["steps"]) == 2 and all("grad_norm_max" in s for s in run["steps"])
      # the arm's statistics are what its metrics.jsonl says (read here without the study
      # code): validation at steps 0, 1, 2 on 16 prompts, then one test line
      arm_dir = os.path.join(workdir, name, f"seed{run['seed']}", run["arm"].replace("@", "_"))
      lines = [json.loads(line) for line in open(os.path.join(arm_dir, "metrics.jsonl"))]
      val = {r["step"]: r["val_accuracy"] for r in lines
             if r.get("phase") == "rl" and "val_accuracy" in r}
      test = [r["test_accuracy"] for r in lines if r.get("phase") == "rl" and "test_accuracy" in r]
      assert sorted(val) == [0, 1, 2] and len(test) == 1
      assert run["stats"]["start_val_accuracy"] == val[0]
      assert run["stats"]["final_val_accuracy"] == val[2]
      assert run["stats"]["best_val_accuracy"] == max(val[1], val[2])
      assert all(v * 16 == round(v * 16) for v in val.values())
      assert run["summary"]["rl_accuracy"] == test[0] == run["final"]["test_accuracy"]
      assert set(run["summary"]["rl_pass_at_k"]) == {"1", "4", "8"}
      # |log ρ̂| quantiles are the metrics' per-step values, summarised (median / max)
      firsts = [r["abs_log_ratio_p99_first"] for r in lines
                if r.get("phase") == "rl" and "abs_log_ratio_p99_first" in r]
      q = run["stats"]["abs_log_ratio"]
      assert len(firsts) == 2 and q["p99_first"] == pytest.approx(sorted(firsts)[0] / 2
                                                                   + sorted(firsts)[1] / 2)
      assert q["p50_first"] <= q["p90_first"] <= q["p99_first"] <= q["max_first"] <= q["max_all"]
      assert "rl_distinct_correct" in run["summary"]
      assert 0.0 <= run["summary"]["rl_malformed_fraction"] <= 1.0
      assert all(0.0 <= r["malformed_fraction"] <= 1.0 for r in run["steps"])  # each rollout batch
      assert run["commit"] and run["machine"].startswith(platform.system())  # provenance
      # every arm restored the seed's one SFT checkpoint: the same starting accuracy
      assert run["stats"]["start_val_accuracy"] == result["runs"][0]["stats"]["start_val_accuracy"]
    with open(os.path.join(workdir, f"{name}.json")) as fh:
      assert len(json.load(fh)["runs"]) == len(arms)
    assert os.path.getsize(os.path.join(workdir, f"{name}_curves.png")) > 0
  calibrated = [r for r in out["studies"][1]["runs"] if r["arm"] == "steprs_calibrated"][0]
  assert calibrated["overrides"]["rl.beta_end"] > 0  # p̄ < 1/2 at the start gives β > 0
  text = open(md).read()
  for arm in [a.name for n in ("stability", "steprs")
              for a in arms_lib.select(arms_lib.STUDIES.get(n)(get_config()), QUICK_ARMS)]:
    assert f"| {arm} |" in text
  assert "--quick" in text
  assert malformed_table_rows(text) == []  # every table renders (pipes in cells escaped)
  assert text.count("* **stabledrl") == 1  # a verdict per GRPO / StableDRL pair run (main)
  assert "stress test: heavier ratio noise than the paper" in text
  assert "not established (1 seed(s)" in text
  assert f"{out['studies'][0]['runs'][0]['commit']}, {platform.system()}" in text  # header
  assert os.path.exists(quick.root / "docs" / "results" / "stability_spikes.png")
  # the arms compiled into the study's cache, not a run's own config.compilation_cache
  assert os.listdir(quick.cache)
  # the same DIR at another size: its finished runs are not mixed in; nothing runs
  from dllm_rl.config import ConfigError
  with pytest.raises(ConfigError, match=r"grpo_lr.*run\.json is a finished run with other"
                     r" settings \(.*rl\.steps: ran with 2, this study sets 3"):
    study(["stability", "steprs"], workdir, None, True, TINY, md, "test", rl_steps=3,
          eval_every=1, arm_patterns=QUICK_ARMS)
  # --reuse_from: a fresh DIR (given the SFT start) seeded from the first study's JSONs trains
  # nothing and reports the same runs, and says where they came from
  again, md2 = str(tmp_path / "again"), str(tmp_path / "docs2" / "again.md")
  shutil.copytree(os.path.join(workdir, "sft"), os.path.join(again, "sft"))
  jsons = [os.path.join(workdir, f"{n}.json") for n in ("stability", "steprs")]
  out2 = study(["stability", "steprs"], again, None, True, TINY, md2, "test", rl_steps=2,
               eval_every=1, arm_patterns=QUICK_ARMS, reuse_from=jsons)
  for first, second in zip(out["studies"], out2["studies"]):
    assert [{k: r[k] for k in ("arm", "steps", "final")} for r in first["runs"]] == [
        {k: r[k] for k in ("arm", "steps", "final")} for r in second["runs"]]
    assert {r["reused_from"] for r in second["runs"]} == {f"{first['study']}.json"}
  assert out2["meta"]["reused"]["steprs"]["written"] == 2
  assert "| runs reused (--reuse_from) | steprs: 2 run(s) written from" in open(md2).read()
  _rerender_keeps_every_number(md, md2)


def _rerender_keeps_every_number(md: str, md2: str):
  """python -m dllm_rl.study.rerender: a report rewritten from its folder alone keeps every
  line but the code rows, its plots and verdicts; one without meta.json (older code) reads
  the same header fields back from its own text, the --reuse_from row included."""
  from dllm_rl.study import rerender
  code_rows = ("| code (git commit) |", "| first written by", "| re-rendered |")
  body = lambda text: [l for l in text.splitlines() if not l.startswith(code_rows)]
  for path in (md, md2):
    before = open(path).read()
    folder = os.path.splitext(path)[0]
    with open(os.path.join(folder, "meta.json")) as fh:
      meta = json.load(fh)
    parsed = rerender.header_meta(before, path)
    same = ("command", "quick", "machine", "load_start", "load_end", "jax", "commit",
            "started", "testbed")
    assert {k: parsed[k] for k in same} == {k: meta[k] for k in same}
    assert parsed["wall_seconds"] == round(meta["wall_seconds"])
    assert [r["line"] for r in parsed["reused"].values()] == [
        r["line"] for r in meta["reused"].values()]
    os.remove(os.path.join(folder, "meta.json"))  # as older code left it
    os.remove(os.path.join(folder, "steprs_curves.png"))
    got = rerender.rerender(path, "abc1234")
    after = open(path).read()
    assert got == {"verdicts": before.count("\n* **"), "changed": [], "studies": 2}
    assert body(after) == body(before)
    assert "| code (git commit) | abc1234 |" in after
    assert f"| first written by (git commit) | {meta['commit']} |" in after
    assert os.path.getsize(os.path.join(folder, "steprs_curves.png")) > 0
    assert rerender.rerender(path, "def5678")["changed"] == []  # again, from its meta.json
    assert f"| first written by (git commit) | {meta['commit']} |" in open(path).read()




@pytest.mark.slow
def test_arms_load_the_background_compiles_and_give_the_same_runs(quick, tmp_path):
  """The quick study compiled its arms' RL programs in a background thread; its first arm
  again without one, in another DIR from the same SFT start over the same compilation cache
  (so it compiles little): the arms loaded every program the thread compiled, and both gave
  the same run bit for bit."""
  off = tmp_path / "prefetch_False"
  shutil.copytree(os.path.join(quick.workdir, "sft"), off / "sft")
  out, events = _logged_study(["stability"], str(off), None, True, TINY, str(off / "r.md"),
                              "test", rl_steps=2, eval_every=1, cache_dir=quick.cache,
                              arm_patterns=QUICK_ARMS[:1], prefetch=False)
  runs_on = [r for r in quick.out["studies"][0]["runs"] if r["arm"] == QUICK_ARMS[0]]
  # the same programs either way: every step record and test result is bit-identical
  for a, b in zip(runs_on, out["studies"][0]["runs"], strict=True):
    assert a["arm"] == b["arm"] and a["steps"] == b["steps"] and a["final"] == b["final"]

  def keys(events, thread, kind):  # the mesh-wrapped programs (parallel.constraints.jit_sharded):
    # samplers, steps, evaluators; small helpers (e.g. the RNG's) are left out, as one
    # thread's compile of them serves the other from the process's in-memory cache
    return {key for t, k, key in events
            if t == thread and k == kind and key.startswith("'jit_wrapped-")}

  background = keys(quick.events, "dllm_rl-prefetch", "miss")
  assert not {t for t, _, _ in events} - {"MainThread"}  # prefetch=False: no thread
  assert len(background) >= 2  # the rollout sampler and an rl_step, at least
  assert background <= keys(quick.events, "MainThread", "hit")  # each was loaded by an arm
  assert not background & keys(quick.events, "MainThread", "miss")  # ... not compiled again
  assert not os.path.exists(prefetch.scratch_dir(quick.workdir))


@pytest.mark.slow  # three training subprocesses, and a fourth for the changed variant
def test_a_replayed_run_branches_and_its_recorded_settings_reproduce_it(quick, tmp_path,
                                                                        monkeypatch):
  """The quick study's steprs arm (2 RL steps) replayed to step 1, then branched to step 2:
  the recorded settings reproduce the run, a variant does not; finished branches are reused,
  a changed variant is retrained, another branch point needs another OUT."""
  # the training subprocesses take the JAX environment's compilation cache: the study's, so
  # they load the programs it compiled
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", quick.cache)
  run_dir = os.path.join(quick.workdir, "steprs", "seed0", "steprs")
  out = str(tmp_path / "branches")
  with pytest.raises(ConfigError, match="until"):
    branch.branch(run_dir, out, 1, 3, [])
  with pytest.raises(ConfigError, match="run.json does not exist: not a finished study run"):
    branch.branch(str(tmp_path), out, 1, 2, [])
  lone = tmp_path / "lone" / "a" / "b"
  lone.mkdir(parents=True)
  shutil.copy(os.path.join(run_dir, "run.json"), lone)
  with pytest.raises(ConfigError, match="not in a study DIR"):
    branch.branch(str(lone), out, 1, 2, [])
  variant = [("cold", [("rl.temperature", "0.3")])]  # rollouts at another temperature
  got = branch.branch(run_dir, out, 1, 2, variant, log=lambda *_: None)
  assert got["replay_differs"] is None  # the replay's step 1 equals the run's
  with open(os.path.join(run_dir, "run.json")) as fh:
    run_steps = [r for r in json.load(fh)["steps"] if r["step"] > 1]
  as_run, cold = got["branches"]
  assert as_run["name"] == "as_run" and as_run["overrides"] == {}
  for ours, theirs in zip(as_run["records"], run_steps, strict=True):  # resumed at step 1
    assert {k: ours.get(k) for k in theirs} == theirs
  assert cold["overrides"] == {"rl.temperature": 0.3}  # typed against the testbed
  assert [r["step"] for r in cold["records"]] == [2]
  assert cold["records"][0]["entropy"] != run_steps[0]["entropy"]  # from step 2 on
  assert as_run["val_accuracy"] is not None  # evaluated at step 2
  text = open(os.path.join(out, "branches.md")).read()
  assert "| cold | rl.temperature=0.3 |" in text and malformed_table_rows(text) == []
  again = branch.branch(run_dir, out, 1, 2, variant, log=lambda *_: None)
  assert again["branches"][1]["records"] == cold["records"]  # finished branches are reused
  hotter = branch.branch(run_dir, out, 1, 2, [("cold", [("rl.temperature", "0.6")])],
                         log=lambda *_: None)  # the same name, other settings: retrained
  assert hotter["branches"][1]["records"][0]["entropy"] != cold["records"][0]["entropy"]
  with pytest.raises(ConfigError) as err:  # another branch point: another --out (the run's
    branch.branch(run_dir, out, 2, 2, [])  # 2 steps leave no later point a branch can reach)
  assert f"--out: {out} holds the branches of {os.path.abspath(run_dir)} at step 1: use" \
      " another --out" in [str(e) for e in each(err.value)]
