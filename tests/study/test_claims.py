"""The claims page (python -m dllm_rl.study.claims): every committed report's verdicts, recomputed
from its JSON by the report's rules, with claims whose runs reappear elsewhere marked."""

import json
import os

import pytest

from dllm_rl.study import claims

GRPO = [0.30, 0.40, 0.35, 0.20, 0.25, 0.33, 0.28, 0.31, 0.36, 0.22]
UP = [0.10, 0.12, 0.08, 0.11, 0.09, 0.10, 0.13, 0.07, 0.12, 0.09]


def _stability(seeds: int, *, quick: bool = False, testbed: str = "arithmetic",
               commit: str | None = None) -> dict:
  """A constructed stability study of GRPO and StableDRL at one lr: StableDRL higher by
  UP[s] in seed s, no collapse; ``commit``: the code its runs record (None: not recorded)."""
  runs = [{"arm": arm, "seed": s, **({"commit": commit} if commit else {}),
           "summary": {"rl_accuracy": GRPO[s] + (UP[s] if arm.startswith("stabledrl") else 0)},
           "stats": {"collapsed": False, "grad_spikes": 0, "bypass_fraction_mean": 0.01,
                     "abs_log_ratio": {"p99_first": 0.5}}}
          for arm in ("grpo@lr2e-4", "stabledrl@lr2e-4") for s in range(seeds)]
  return {"study": "stability", "testbed": testbed, "quick": quick, "seeds": seeds,
          "arms": [{"name": "grpo@lr2e-4"}, {"name": "stabledrl@lr2e-4"}], "runs": runs}


def _report(docs, name: str, study: dict, commit: str = "abc1234"):
  with open(docs / f"{name}.md", "w") as fh:
    fh.write(f"# Results\n\n| | |\n| --- | --- |\n| code (git commit) | {commit} |\n")
  os.makedirs(docs / name, exist_ok=True)
  with open(docs / name / f"{study['study']}.json", "w") as fh:
    json.dump(study, fh)


def test_verdicts_are_recomputed_and_a_larger_study_supersedes_its_subset(tmp_path):
  _report(tmp_path, "r_a", _stability(5), "1111111")
  _report(tmp_path, "r_b", _stability(10), "2222222")  # the same 5 runs and 5 more
  _report(tmp_path, "r_c", _stability(5), "3333333")  # r_a's runs: r_b's cover them too
  _report(tmp_path, "r_q", _stability(3, quick=True))  # a --quick smoke run: no claim
  _report(tmp_path, "r_t", _stability(5, testbed="chain", commit="feed123"))  # its own claim
  other_start = {**_stability(5, testbed="chain", commit="beef123"), "shared_sft": True,
                 "sft_seed": 1}  # --sft_seed=1: another start, so other runs
  for run in other_start["runs"]:
    run["summary"] = {"rl_accuracy": run["summary"]["rl_accuracy"] + 0.01}
  _report(tmp_path, "r_u", other_start)
  out = tmp_path / "claims.md"
  assert claims.main(["claims", str(tmp_path), f"--out={out}"]) == 0
  text = out.read_text()
  rows = [l for l in text.splitlines() if l.startswith("| [")]
  assert [r.split("]")[0] for r in rows] == ["| [r_a.md", "| [r_b.md", "| [r_c.md", "| [r_t.md",
                                              "| [r_u.md"]
  a, b, c, t, u = rows
  assert "| stability, 5 seeds, one SFT start (seed 1's) |" in u and "**reproduced**" in u
  assert "| 1111111 | not recorded |" in a and "(superseded by r_b.md) reproduced" in a
  assert "| 2222222 |" in b and "**reproduced**" in b and "10 seeds" in b
  assert "(superseded by r_b.md) reproduced" in c
  assert "| feed123 | `chain` |" in t and "**reproduced**" in t
  # r_a and r_c are covered: not counted; one judged line per section: Holm keeps each
  assert "Verdicts: reproduced 3; Holm's rule keeps 3 of the 3 \"reproduced\"." in text
  assert "**reproduced**; Holm: kept |" in b
  assert "stabledrl@lr2e-4 vs grpo@lr2e-4 (main)" in b
  assert "10 up, 0 down" in b


def test_a_fresh_set_of_seeds_is_its_own_claim_named_by_its_range(tmp_path):
  """A --first_seed study (seeds 5-9) shares no run with the seeds 0-4 study: two claims,
  the later labelled with its seed range; the study of seeds 0-9 supersedes both."""
  fresh = _stability(10)
  fresh["runs"] = [r for r in fresh["runs"] if r["seed"] >= 5]
  fresh["seeds"], fresh["first_seed"] = 5, 5
  _report(tmp_path, "r_a", _stability(5))
  _report(tmp_path, "r_f", fresh)
  out = tmp_path / "claims.md"
  assert claims.main(["claims", str(tmp_path), f"--out={out}"]) == 0
  a, f = [l for l in out.read_text().splitlines() if l.startswith("| [")]
  assert "| stability, 5 seeds |" in a and "**reproduced**" in a
  assert "| stability, 5 seeds (5–9) |" in f and "**reproduced**" in f
  assert "per seed +0.100, +0.130, +0.070, +0.120, +0.090" in f  # UP[5:]
  _report(tmp_path, "r_z", _stability(10))
  assert claims.main(["claims", str(tmp_path), f"--out={out}"]) == 0
  rows = [l for l in out.read_text().splitlines() if l.startswith("| [")]
  assert ["superseded by r_z.md" in r for r in rows] == [True, True, False]


def test_the_same_runs_in_two_reports_count_once(tmp_path):
  _report(tmp_path, "r_b", _stability(5))
  _report(tmp_path, "r_a", _stability(5))
  got = claims.mark_covered([c for md, st in claims.find_reports(str(tmp_path)) for s in st
                             for c in claims.claims_of(md, s)])
  assert [c.covered_by for c in got] == ["", "the same runs as r_a.md"]


def test_a_rerun_with_other_timings_is_the_same_run(tmp_path):
  """A run retrained bit for bit (another wall time, another plot path) still counts as the
  run a smaller report holds: that report is superseded; another accuracy is another run."""
  small, big = _stability(5), _stability(10)
  for r in small["runs"]:
    r["summary"].update(rl_wall_seconds=180.0, rollout_tokens_per_second=970.0,
                        rl_plot="/old/rl_curves.png")
  for r in big["runs"]:
    r["summary"].update(rl_wall_seconds=100.0, rollout_tokens_per_second=1940.0,
                        rl_plot="/new/rl_curves.png")
  _report(tmp_path, "r_small", small)
  _report(tmp_path, "r_big", big)
  got = claims.mark_covered([c for md, st in claims.find_reports(str(tmp_path)) for s in st
                             for c in claims.claims_of(md, s)])
  assert [c.covered_by for c in got] == ["", "superseded by r_big.md"]
  big["runs"][0]["summary"]["rl_accuracy"] += 0.01
  _report(tmp_path, "r_big", big)
  got = claims.mark_covered([c for md, st in claims.find_reports(str(tmp_path)) for s in st
                             for c in claims.claims_of(md, s)])
  assert [c.covered_by for c in got] == ["", ""]


def test_a_different_run_is_not_covered(tmp_path):
  other = _stability(10)
  other["runs"][0]["summary"]["rl_accuracy"] += 0.01  # seed 0 of GRPO differs: another run
  _report(tmp_path, "r_a", _stability(5))
  _report(tmp_path, "r_b", other)
  got = claims.mark_covered([c for md, st in claims.find_reports(str(tmp_path)) for s in st
                             for c in claims.claims_of(md, s)])
  assert [c.covered_by for c in got] == ["", ""]


@pytest.mark.parametrize("comparison, arms", [
    ("stabledrl@lr2e-4 vs grpo@lr2e-4 (main)", ("stabledrl@lr2e-4", "grpo@lr2e-4")),
    ("steprs vs centered, pass@8", ("steprs", "centered")),
    ("espo improves on the SFT start", ("espo",)),
    ("grpo_kl@lr2e-4 vs grpo@lr2e-4 (control: GRPO with and without the KL term (β = 0.04))",
     ("grpo_kl@lr2e-4", "grpo@lr2e-4")),
    ("grpo_low@lr2e-5 improves on the SFT start (control: GRPO below the lr grid)",
     ("grpo_low@lr2e-5",))])
def test_compared_arms_reads_each_comparison_form(comparison, arms):
  assert claims.compared_arms(comparison) == arms


def test_a_broken_json_or_an_empty_folder_exits_2_naming_it(tmp_path, capsys):
  assert claims.main(["claims", str(tmp_path)]) == 2
  assert "no study report" in capsys.readouterr().err
  (tmp_path / "r.md").write_text("# r\n")
  os.makedirs(tmp_path / "r")
  (tmp_path / "r" / "stability.json").write_text("{not json")
  assert claims.main(["claims", str(tmp_path)]) == 2
  assert os.path.join("r", "stability.json") in capsys.readouterr().err
  assert not (tmp_path / "claims.md").exists()  # nothing written on an error
  # --out a folder, under a missing folder, or a report's own .md: said before anything
  for out, said in ((tmp_path, "is a folder"), (tmp_path / "no" / "c.md", "does not exist"),
                    (tmp_path / "r.md", "is a study report")):
    assert claims.main(["claims", str(tmp_path), f"--out={out}"]) == 2
    assert said in capsys.readouterr().err
  assert (tmp_path / "r.md").read_text() == "# r\n"
  assert claims.main(["claims", str(tmp_path / "r.md")]) == 2  # a file given as DOCS
  assert "a file, not the folder of reports" in capsys.readouterr().err


def test_help_prints_what_the_command_does_and_writes_nothing(tmp_path, capsys, monkeypatch):
  monkeypatch.chdir(tmp_path)  # the default DOCS would be ./docs
  for flag in ("-h", "--help"):
    assert claims.main(["claims", flag]) == 0
    out = capsys.readouterr().out
    assert "[DOCS] [--out=FILE]" in out and "verdict" in out
  assert not os.listdir(tmp_path)


def test_report_write_keeps_the_study_json_gzipped_and_the_claims_page_reads_it(tmp_path,
                                                                               monkeypatch):
  """report_files.write copies DIR/<study>.json beside the report as <study>.json.gz (the same
  bytes for the same JSON; an uncompressed copy from older code removed) with the header's
  fields (meta.json, for dllm_rl.study.rerender), and the claims page reads it as it reads an
  older report's plain JSON."""
  from dllm_rl.study import report, report_files
  monkeypatch.setattr(report, "render", lambda *a: "# report\n")  # rendering: test_study.py
  workdir, docs = tmp_path / "w", tmp_path / "docs"
  os.makedirs(workdir)
  study = _stability(5)
  with open(workdir / "stability.json", "w") as fh:
    json.dump(study, fh)
  os.makedirs(docs / "r_new")
  (docs / "r_new" / "stability.json").write_text("{}")  # left by older code: replaced
  report_files.write([study], {"command": "test"}, str(workdir), str(docs / "r_new.md"))
  assert sorted(os.listdir(docs / "r_new")) == ["meta.json", "stability.json.gz"]
  assert json.loads((docs / "r_new" / "meta.json").read_text()) == {"command": "test"}
  first = (docs / "r_new" / "stability.json.gz").read_bytes()
  report_files.save_study_json(str(workdir / "stability.json"), str(docs / "r_new"))
  assert (docs / "r_new" / "stability.json.gz").read_bytes() == first  # deterministic
  assert report_files.load_study_json(str(docs / "r_new"), "stability")[1] == study
  assert report_files.load_study_json(str(docs / "r_new"), "steprs") is None
  _report(docs, "r_old", _stability(10))  # plain JSON: an older report
  found = claims.find_reports(str(docs))
  assert [(os.path.basename(md), len(st[0]["runs"])) for md, st in found] == [
      ("r_new.md", 10), ("r_old.md", 20)]
  (docs / "r_new" / "stability.json.gz").write_bytes(b"not gzip")
  with pytest.raises(ValueError, match="stability.json.gz: not a study JSON"):
    claims.find_reports(str(docs))


def test_every_stability_comparison_names_arms_the_study_has():
  """Each line the stability report can write (pairs, ablations, every control) over the
  study's real arm list reads back as arms of that study: the claims page can count it."""
  from dllm_rl.config.defaults import get_config
  from dllm_rl.study import arms as arms_lib
  from dllm_rl.study.report import REPORTS
  arms = arms_lib.STUDIES.get("stability")(get_config())
  runs = [{"arm": a.name, "seed": s, "summary": {"rl_accuracy": GRPO[s] + 0.01 * i},
           "stats": {"collapsed": False, "grad_spikes": 0, "bypass_fraction_mean": 0.01,
                     "abs_log_ratio": {"p99_first": 0.5}, "grad_norm_max": 1.0,
                     "zero_grad_steps": 0}}
          for i, a in enumerate(arms) for s in range(5)]
  study = {"study": "stability", "seeds": 5, "runs": runs,
           "arms": [{"name": a.name, "overrides": a.overrides, "group": a.group} for a in arms],
           "base_config": get_config().to_dict(),
           "sft": {str(s): {"sft_accuracy": GRPO[s]} for s in range(5)}}
  names = {a.name for a in arms}
  lines = REPORTS["stability"][1](study)
  assert {c.partition(" (")[0].split(" ")[0] for c, _, _ in lines} >= {
      "grpo_kl@lr2e-4", "grpo_low@lr2e-5", "stabledrl_no_eubo@lr2e-4"}  # every kind is there
  for comparison, _, _ in lines:
    assert set(claims.compared_arms(comparison)) <= names, comparison


def test_two_marginal_reproduced_lines_of_one_section_are_not_kept_by_holm(tmp_path):
  """Two StableDRL − GRPO pairs of one stability study, each "reproduced" with a one-sided
  p ≈ 0.023 (differences 0.05, 0.01, 0.03, 0.06, 0.005): Holm over the section's two judged
  comparisons needs the smaller p ≤ 0.0125 first, so neither is kept; the verdicts stand."""
  marginal = [0.05, 0.01, 0.03, 0.06, 0.005]
  arms = ("grpo@lr2e-4", "stabledrl@lr2e-4", "grpo@lr6e-4", "stabledrl@lr6e-4")
  runs = [{"arm": arm, "seed": s,
           "summary": {"rl_accuracy": GRPO[s] + (marginal[s] if arm[0] == "s" else 0)},
           "stats": {"collapsed": False, "grad_spikes": 0, "bypass_fraction_mean": 0.01,
                     "abs_log_ratio": {"p99_first": 0.5}}} for arm in arms for s in range(5)]
  study = {"study": "stability", "testbed": "arithmetic", "quick": False, "seeds": 5,
           "arms": [{"name": a} for a in arms], "runs": runs}
  _report(tmp_path, "r_m", study)
  out = tmp_path / "claims.md"
  assert claims.main(["claims", str(tmp_path), f"--out={out}"]) == 0
  text = out.read_text()
  rows = [l for l in text.splitlines() if l.startswith("| [")]
  assert len(rows) == 2 and all("**reproduced**; Holm: not kept |" in r for r in rows)
  assert "reproduced 2; Holm's rule keeps 0 of the 2 \"reproduced\"." in text
