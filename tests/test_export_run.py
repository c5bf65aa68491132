"""`python -m dllm_rl.convert export --workdir RUN`: a training run's checkpoint becomes an HF
folder that `dllm_rl.load_pretrained` loads with the trained parameters' logits (≤ 1e-5), and
`mode=eval` with `model.hf_checkpoint=<export>` reproduces the run's evaluation; bad input
exits 2 naming it."""

import dataclasses
import filecmp
import json
import os

import jax
import numpy as np
import pytest
from safetensors import safe_open

import dllm_rl
from dllm_rl import convert as convert_cli
from dllm_rl.models import hf, hf_export
from dllm_rl.parallel import distributed
from dllm_rl.parallel.mesh import make_mesh
from dllm_rl.tasks.tokenizer import CharTokenizer
from dllm_rl.train import modes, run_checkpoints
from dllm_rl.train.export import export_run
from tests.helpers import hf_fixture_with_tokenizer, scratch_run_checkpoints, tiny_run_config

LOGIT_TOL = 1e-5


def _logits_equal(exported, params, ids_BL, **kw):
  """max |Δ| between the export's logits and the same forward on ``params``."""
  with jax.default_matmul_precision("highest"):
    a = np.asarray(exported.logits(ids_BL, **kw))
    b = np.asarray(dataclasses.replace(exported, params=params).logits(ids_BL, **kw))
  return float(np.abs(a - b).max())


def test_a_run_from_scratch_exports_a_complete_llada_folder(tmp_path):
  _, policies = scratch_run_checkpoints(tmp_path / "w", {"rl": [3]})
  stats = export_run(str(tmp_path / "w"), str(tmp_path / "hf"))
  assert stats["label"] == "rl3" and stats["family"] == "llada"
  assert sorted(os.listdir(tmp_path / "hf")) == [
      "config.json", "dllm_rl_export.json", "model.safetensors", "tokenizer.json",
      "tokenizer_config.json"]
  record = json.load(open(tmp_path / "hf" / "dllm_rl_export.json"))
  assert (record["label"], record["step"], record["step_unit"], record["source"]) == (
      "rl3", 3, "rollout batches", "scratch")
  exported = dllm_rl.load_pretrained(str(tmp_path / "hf"))
  tok = CharTokenizer()
  assert exported.family == "llada" and exported.config.vocab_size == tok.vocab_size
  assert (exported.token_ids.mask_id, exported.token_ids.eos_id) == (tok.mask_id, tok.eos_id)
  ids_BL = np.array([tok.encode("123+456="), tok.encode("9+9=18??")])
  assert _logits_equal(exported, policies["rl3"], ids_BL) == 0.0
  # The stored tensors are the checkpoint's: another policy's logits differ.
  other = jax.tree.map(lambda x: x * np.float32(0.5), policies["rl3"])
  assert _logits_equal(exported, other, ids_BL) > 1e-3


@pytest.mark.parametrize("overrides, family, named", [
    # Partial RoPE (the same parameter shapes): LLaDA's config.json has no key for it.
    ({"model.rotary_dim": 8}, "llada",
     "model.rotary_dim: config.json 0 vs model 8; a run trained with"
     " --config.model.rotary_dim=0 exports"),
    # A block model without qk-norm (configs/tiny_block_cpu.py): SDAR's config.json has no
    # switch for it.
    ({"model.block_size": 4, "sampler.block_len": 4}, "sdar",
     "model.qk_norm: config.json True vs model False; a run trained with"
     " --config.model.qk_norm=true exports"),
])
def test_a_model_the_family_cannot_describe_is_refused_before_writing(tmp_path, overrides,
                                                                       family, named):
  """The refusal names the config keys and the values that export (docs/models.md "Export")."""
  scratch_run_checkpoints(tmp_path / "w", {"sft": [2]}, overrides)
  with pytest.raises(ValueError) as err:
    export_run(str(tmp_path / "w"), str(tmp_path / "hf"))
  assert str(err.value) == (f"a model trained from scratch is exported as {family}, whose"
                            f" config.json cannot describe this one: {named}")
  assert not os.path.exists(tmp_path / "hf")


def test_cli_bad_input_exits_2_naming_it(tmp_path, capsys):
  w, out = str(tmp_path / "w"), str(tmp_path / "hf")

  def error(*args):
    assert convert_cli.main(["export", *args]) == 2
    return capsys.readouterr().err

  assert error("--workdir", w, "--out", out) == (
      f"error: --workdir: {w} does not exist; name a training run's --workdir\n")
  os.makedirs(w)
  assert "no checkpoint to export under" in error("--workdir", w, "--out", out)
  scratch_run_checkpoints(w, {"rl": [3]})
  ckpts = os.path.join(w, "checkpoints")
  assert error("--workdir", ckpts, "--out", out) == (
      f"error: --workdir: {ckpts} is a run's checkpoints folder: pass the run's folder,"
      f" --workdir {w}\n")
  assert error("--workdir", w, "--step", "7", "--out", out).startswith(
      "error: --step: no rl checkpoint at step 7")
  assert "available steps (rollout batches): [3]" in error("--workdir", w, "--step", "7",
                                                           "--out", out)
  assert error("--workdir", w, "--phase", "sft", "--out", out).startswith(
      "error: --phase: no sft checkpoint")
  assert "--ckpt has one" in error("--ckpt", w, "--step", "3", "--out", out)
  a_file = str(tmp_path / "a_file")
  open(a_file, "w").close()
  assert error("--workdir", w, "--out", a_file) == (
      f"error: --hf_dir: {a_file} is a file, not a folder; name a new folder\n")
  assert error("--workdir", w, "--out", f"{a_file}/hf") == (
      f"error: --hf_dir: {a_file}/hf: {a_file} is a file, not a folder\n")
  assert error("--workdir", w, "--out", out, "--hf_source", out) == (
      "error: --hf_source: the run was trained from scratch (no model.hf_checkpoint): it has no"
      " source folder to read; leave it out\n")
  assert error("--ckpt", w, "--out", out, "--hf_source", out).startswith(
      "error: --hf_source: only with --workdir")
  os.makedirs(out)
  open(os.path.join(out, "config.json"), "w").close()
  assert f"{out} already holds an HF checkpoint" in error("--workdir", w, "--out", out)
  assert not os.path.exists(os.path.join(out, "model.safetensors"))


def test_roundtrip_tmp_and_export_ckpt_hf_dir_that_are_files_are_named_as_the_flag(tmp_path,
                                                                                  capsys):
  """`convert roundtrip --tmp` and `convert export --ckpt ... --hf_dir` on a file, or under
  one, exit 2 naming the flag, before the source (here absent) is read."""
  a_file, nowhere = str(tmp_path / "a_file"), str(tmp_path / "nowhere")
  open(a_file, "w").close()
  for command, flag, source in (("roundtrip", "--tmp", "--hf_dir"),
                                ("export", "--hf_dir", "--ckpt")):
    for folder, why in ((a_file, f"{a_file} is a file, not a folder; name a new folder"),
                        (f"{a_file}/out", f"{a_file}/out: {a_file} is a file, not a folder")):
      assert convert_cli.main([command, source, nowhere, flag, folder]) == 2
      assert capsys.readouterr().err == f"error: {flag}: {why}\n"


def test_a_folder_holding_another_models_tokenizer_files_is_refused(tmp_path):
  """A tokenizer or generation file left in the folder by another model would load with the
  export: a chat_template.jinja wins over the export's tokenizer_config.json template (so the
  export's prompts were another model's), a tokenizer.json over a source's vocab.json +
  merges.txt. Before, the export wrote beside it and said nothing. Other files (notes, a
  README) stay allowed."""
  scratch_run_checkpoints(tmp_path / "w", {"rl": [3]})
  out = tmp_path / "hf"
  out.mkdir()
  (out / "chat_template.jinja").write_text("{{ messages[-1].content }} ASSISTANT:")
  (out / "modeling_llada.py").write_text("")
  (out / "notes.txt").write_text("x")
  with pytest.raises(convert_cli.ConfigError, match=(
      r"^--hf_dir: .*/hf holds chat_template.jinja, modeling_llada.py: read with the weights,"
      r" a file that another model left there would load with this export, .*; delete them or"
      r" use a new folder$")):
    export_run(str(tmp_path / "w"), str(out))
  assert sorted(os.listdir(out)) == ["chat_template.jinja", "modeling_llada.py", "notes.txt"]
  for name in ("chat_template.jinja", "modeling_llada.py"):
    os.remove(out / name)
  export_run(str(tmp_path / "w"), str(out))  # a README or notes beside it: written
  assert (out / "notes.txt").read_text() == "x" and (out / "config.json").is_file()


def test_convert_export_joins_the_launchs_processes_before_anything_else(tmp_path, monkeypatch,
                                                                          capsys):
  """export --workdir initialises jax.distributed from the environment first (as dllm_rl.main
  does with the default config.distributed), before its arguments' folders are looked at:
  convert once never did, so under a multi-process launch (DLLM_* set) each process exported
  the whole folder into the same place. Its error (a partial DLLM_* set) is one line, exit 2."""
  calls = []

  def initialize(dist_cfg):
    calls.append(dist_cfg)
    raise convert_cli.ConfigError("distributed.process_id", "required with initialize='auto':"
                                  " set it or the env var DLLM_PROCESS_ID")

  monkeypatch.setattr(distributed, "initialize", initialize)
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  assert convert_cli.main(["export", "--workdir", str(tmp_path), "--hf_dir", str(a_file)]) == 2
  assert capsys.readouterr().err == ("error: config.distributed.process_id: required with"
                                     " initialize='auto': set it or the env var"
                                     " DLLM_PROCESS_ID\n")
  assert calls == [None] and sorted(os.listdir(tmp_path)) == ["a_file"]


@pytest.mark.parametrize("env, why", [
    ({"DLLM_COORDINATOR_ADDRESS": "h:1234", "DLLM_NUM_PROCESSES": "2",
      "DLLM_PROCESS_ID": "1"}, "DLLM_COORDINATOR_ADDRESS"),
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
      "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_NUM_NODES": "2"}, "SLURM step"),
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_MCA_orte_hnp_uri": "x"}, "Open MPI world"),
])
def test_the_single_process_commands_refuse_a_multi_process_launch(tmp_path, monkeypatch,
                                                                   capsys, env, why):
  """import, roundtrip and export --ckpt write their whole folder from each process: under a
  multi-process launch each exits 2 saying so, before anything is read or written, and without
  joining jax.distributed (which would wait for the other processes)."""
  monkeypatch.setattr(distributed, "initialize", lambda dist_cfg: 1 / 0)
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  source = hf_fixture_with_tokenizer(tmp_path / "src")
  for command, argv in (("import", ["--hf_dir", str(source), "--out", str(tmp_path / "o")]),
                        ("roundtrip", ["--hf_dir", str(source), "--tmp", str(tmp_path / "o")]),
                        ("export --ckpt", ["--ckpt", str(source), "--hf_dir",
                                           str(tmp_path / "o")])):
    assert convert_cli.main([command.split()[0], *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: `convert {command}` runs on one process, and this one was"
                          " started by a multi-process launch ("), err
    assert why in err
  assert not (tmp_path / "o").exists()


def test_the_single_process_commands_run_alone_on_a_tpu_slice_worker(tmp_path, monkeypatch):
  """A multi-host TPU slice's own variables (every worker has them) are no launch: import runs
  on one worker alone, without jax.distributed (joining it would wait for the other workers)."""
  monkeypatch.setattr(distributed, "initialize", lambda dist_cfg: 1 / 0)
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "w0,w1,w2,w3")
  source = hf_fixture_with_tokenizer(tmp_path / "src")
  assert convert_cli.main(["import", "--hf_dir", str(source), "--out", str(tmp_path / "o")]) == 0
  assert (tmp_path / "o").is_dir()


def test_a_folder_problem_in_another_process_stops_this_one_too(monkeypatch):
  """export.agreed: this process's own error, or, where another process failed, a ConfigError
  naming the flag (not a wait in the next collective for a process that stopped)."""
  from dllm_rl.parallel import distributed
  from dllm_rl.train import export
  export.agreed(None, "--hf_dir", "the check")  # no process failed
  with pytest.raises(FileExistsError, match="mine"):
    export.agreed(FileExistsError("mine"), "--hf_dir", "the check")
  monkeypatch.setattr(distributed, "agree_any", lambda flags: np.array([True]))
  with pytest.raises(convert_cli.ConfigError, match=r"^--hf_dir: the check failed in another"
                     r" process \(its error says why\); nothing was written$"):
    export.agreed(None, "--hf_dir", "the check")


def test_a_failed_write_leaves_no_config_json_and_no_loadable_folder(tmp_path):
  """config.json is written last: a write that fails before it (here tokenizer.json, which a
  folder in its place makes unwritable) leaves a folder that no loader takes for a finished
  export. Before, config.json and the weights were written first: the folder loaded."""
  scratch_run_checkpoints(tmp_path / "w", {"rl": [3]})
  (tmp_path / "hf" / "tokenizer.json").mkdir(parents=True)
  with pytest.raises(IsADirectoryError, match="tokenizer.json"):
    export_run(str(tmp_path / "w"), str(tmp_path / "hf"))
  assert not (tmp_path / "hf" / "config.json").exists()
  with pytest.raises(FileNotFoundError, match="config.json"):
    dllm_rl.load_pretrained(str(tmp_path / "hf"))
  (tmp_path / "hf" / "tokenizer.json").rmdir()
  with pytest.raises(convert_cli.ConfigError, match=r"holds \*.safetensors without config.json: an "
                     r"unfinished export .*; delete the folder or use a new one"):
    export_run(str(tmp_path / "w"), str(tmp_path / "hf"))  # refused, named as unfinished


def test_a_write_failed_in_process_0_stops_the_others_naming_the_folder(monkeypatch):
  """hf_export.Process0Writes.agree: process 0's own error where it failed; where it failed in
  another process (process 0), a ConfigError naming --hf_dir and the folder."""
  from dllm_rl.parallel import distributed
  writes = hf_export.Process0Writes("/out/hf")
  writes.agree()  # nothing failed
  assert writes(lambda: 1 / 0) is None and writes(lambda: 7) is None  # none after a failure
  with pytest.raises(ZeroDivisionError):
    writes.agree()
  monkeypatch.setattr(distributed, "agree_any", lambda flags: np.array([True]))
  with pytest.raises(convert_cli.ConfigError, match=r"^--hf_dir: process 0 failed to write the"
                     r" export folder /out/hf \(its own error says why\)"):
    hf_export.Process0Writes("/out/hf").agree()


def test_a_failed_config_json_write_leaves_no_partial_config_json(tmp_path):
  """config.json marks an export folder as finished: a write that fails midway (here the
  JSON encoder, after the first keys) leaves no config.json at all, so the folder still reads
  as an unfinished export."""
  path = tmp_path / "config.json"
  with pytest.raises(TypeError):
    hf_export._write_json(str(path), {"a": 1, "z": object()})
  assert not path.exists()
  hf_export._write_json(str(path), {"b": [1, 2], "a": 1})
  assert path.read_text() == '{\n  "a": 1,\n  "b": [\n    1,\n    2\n  ]\n}\n'


def test_process_0_write_failures_are_agreed_per_file_and_gigabyte_not_per_tensor(tmp_path,
                                                                                monkeypatch):
  """One collective per agreement: an MoE's 15k tensors would double the export's collectives.
  The tiny model's file: one agreement at its start and one at the end; with a 1-byte
  interval, one per tensor as well."""
  scratch_run_checkpoints(tmp_path / "w", {"rl": [3]})
  calls = []
  agree = hf_export.Process0Writes.agree
  monkeypatch.setattr(hf_export.Process0Writes, "agree",
                      lambda self: calls.append(1) or agree(self))
  export_run(str(tmp_path / "w"), str(tmp_path / "hf"))
  assert len(calls) == 2
  with safe_open(str(tmp_path / "hf" / "model.safetensors"), "np") as f:
    tensors = len(list(f.keys()))
  calls.clear()
  monkeypatch.setattr(hf_export, "_AGREE_EVERY_BYTES", 1)
  export_run(str(tmp_path / "w"), str(tmp_path / "hf2"))
  assert tensors > 2 and len(calls) == tensors + 1


def _hf_run_checkpoint(workdir, source, step: int = 2):
  """An SFT checkpoint at ``step`` of a run from ``model.hf_checkpoint=source`` (the
  llada_tiny fixture) holding the fixture's weights × 1.5, saved as the SFT loop does (meta
  with the config); returns those parameters."""
  from dllm_rl.infra.checkpoint import Checkpointer
  config = tiny_run_config("sft", {"model.hf_checkpoint": str(source), "data.prompt_len": 24})
  params = jax.tree.map(lambda x: np.asarray(x) * np.float32(1.5),
                        hf.load_checkpoint(str(source)).params)
  with Checkpointer(os.path.join(str(workdir), "checkpoints", "sft"), keep=10,
                    async_save=False) as ckpt:
    ckpt.save(step, {"params": params}, {"phase": "sft", "config": config.to_json()})
  return params


def test_a_run_whose_hf_source_moved_exports_with_hf_source(tmp_path, capsys):
  """The run recorded model.hf_checkpoint=.../moveme; once it is moved, export says so and
  how to name the new place; --hf_source reads config.json and the tokenizer files there."""
  source = hf_fixture_with_tokenizer(tmp_path / "moveme")
  w, out = str(tmp_path / "w"), tmp_path / "hf"
  params = _hf_run_checkpoint(w, source)
  moved = tmp_path / "moved"
  os.rename(tmp_path / "moveme", moved)
  assert convert_cli.main(["export", "--workdir", w, "--out", str(out)]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"error: config.model.hf_checkpoint: {str(source)!r} does not exist;"), err
  assert err.endswith("Export reads the run's source model there (config.json, tokenizer"
                      " files; a LoRA run's base weights): if it has moved, pass --hf_source"
                      " with the folder it is in now\n"), err
  assert not out.exists()
  assert convert_cli.main(["export", "--workdir", w, "--out", str(out), "--hf_source",
                           str(tmp_path / "nowhere")]) == 2
  assert capsys.readouterr().err.startswith(
      f"error: --hf_source: {str(tmp_path / 'nowhere')!r} does not exist;")
  assert convert_cli.main(["export", "--workdir", w, "--out", str(out), "--hf_source",
                           str(moved / "llada_tiny")]) == 0
  for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
    assert filecmp.cmp(moved / "llada_tiny" / name, out / name, shallow=False), name
  assert json.load(open(out / "dllm_rl_export.json"))["source"] == str(moved / "llada_tiny")
  exported = dllm_rl.load_pretrained(str(out))
  ids_BL = np.random.default_rng(0).integers(0, 120, (2, 12))
  assert _logits_equal(exported, params, ids_BL) == 0.0


def test_an_hf_source_of_another_model_is_named(tmp_path, capsys):
  """--hf_source naming another family's folder: an error on --hf_source naming both models,
  not a bare checkpoint-layout message; nothing written."""
  source = hf_fixture_with_tokenizer(tmp_path)
  w, out = str(tmp_path / "w"), tmp_path / "hf"
  _hf_run_checkpoint(w, source)
  sdar = os.path.join(os.path.dirname(__file__), "fixtures", "sdar_tiny")
  assert convert_cli.main(["export", "--workdir", w, "--out", str(out), "--hf_source",
                           sdar]) == 2
  assert capsys.readouterr().err.startswith(
      f"error: --hf_source: {sdar} holds a sdar model that does not fit the parameters of sft2"
      f" (the run trained from {source}): State structure mismatch")
  assert not out.exists()


def _finetune(tmp_path, family):
  """SFT of the tiny fixture of ``family`` (with a character-level tokenizer) for 2 steps on
  the embedded default's task; returns (config, HF source folder, workdir)."""
  source = hf_fixture_with_tokenizer(tmp_path, f"{family}_tiny")
  overrides = {"model.hf_checkpoint": str(source), "data.prompt_len": 24, "sft.steps": 2,
               "sft.log_every": 1, "sft.eval_every": 0, "task.val_size": 8,
               "task.test_size": 8, "eval.batch_size": 8}
  if family == "sdar":
    overrides.update({"model.block_size": 4, "sampler.block_len": 4,
                      "estimator.name": "block_elbo"})
  config = tiny_run_config("sft", overrides)
  modes.run(config, str(tmp_path / "w"))
  return config, source, str(tmp_path / "w")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_a_fine_tuned_hf_model_exports_with_the_trained_logits(tmp_path, family):
  """Fine-tuned from the fixture: config.json and tokenizer files come from the source, the
  tensors are the trained ones (≠ the fixture's), `load_pretrained` logits equal theirs."""
  config, source, w = _finetune(tmp_path, family)
  assert convert_cli.main(["export", "--workdir", w, "--out", str(tmp_path / "hf"),
                           "--dtype", "float32"]) == 0
  out = tmp_path / "hf"
  for name in ("tokenizer.json", "tokenizer_config.json"):
    assert filecmp.cmp(source / name, out / name, shallow=False)
  src_config, out_config = hf.read_hf_config(str(source)), hf.read_hf_config(str(out))
  assert {k: v for k, v in out_config.items() if k != "torch_dtype"} == {
      k: v for k, v in src_config.items() if k != "torch_dtype"}
  assert json.load(open(out / "dllm_rl_export.json"))["label"] == "sft2"
  ref = run_checkpoints.find_checkpoint(w)
  exported = dllm_rl.load_pretrained(str(out))
  _, trained = run_checkpoints.restore_params(ref, exported.config,
                                             make_mesh({"data": 1, "fsdp": 1, "tensor": 1}))
  kw = {"attention": "block_causal", "block_size": 4} if family == "sdar" else {}
  ids_BL = np.random.default_rng(0).integers(0, 120, (2, 12))
  assert _logits_equal(exported, trained, ids_BL, **kw) <= LOGIT_TOL
  fixture = dllm_rl.load_pretrained(str(source))
  assert _logits_equal(exported, fixture.params, ids_BL, **kw) > 1e-3  # training moved them


@pytest.mark.slow
def test_eval_of_the_export_reproduces_the_runs_evaluation(tmp_path, capsys):
  """A run's checkpoint evaluated in its workdir, then exported in float32 and evaluated as
  a base model (mode=eval, model.hf_checkpoint=<export>, a workdir without checkpoints: the
  pre-RL-baseline path): the same generations, accuracy, pass@k and diversity. (A policy
  far from trained, so its greedy tokens are near ties: a bfloat16 export changes them.)"""
  w = str(tmp_path / "w")
  config, _ = scratch_run_checkpoints(w, {"sft": [5], "rl": [3]},
                                      {"task.test_size": 8, "eval.batch_size": 8})
  config.mode = "eval"
  run_eval = modes.run(config, w)  # auto: the newest checkpoint
  assert run_eval["step_label"] == "rl3"
  assert convert_cli.main(["export", "--workdir", w, "--out", str(tmp_path / "hf")]) == 0
  config.model.hf_checkpoint = str(tmp_path / "hf")
  capsys.readouterr()
  export_eval = modes.run(config, str(tmp_path / "baseline"))
  assert export_eval["step_label"] == "base" and export_eval["weights"] == str(tmp_path / "hf")
  # An empty workdir is said, in case a trained run's was meant; eval.phase=base is not.
  assert (f"[eval] note: no checkpoint under {tmp_path / 'baseline' / 'checkpoints'}:"
          f" evaluating the base model {tmp_path / 'hf'}") in capsys.readouterr().err
  config.eval.phase = "base"
  assert modes.run(config, str(tmp_path / "baseline"))["step_label"] == "base"
  assert "note: no checkpoint" not in capsys.readouterr().err
  for key in ("test_accuracy", "test_reward", "pass_at_k", "sample_accuracy", "diversity",
              "distinct_correct"):
    assert export_eval[key] == run_eval[key], key
  generations = open(export_eval["generations"]).read()
  assert generations == open(run_eval["generations"]).read()
  assert any(json.loads(line)["completion"] for line in generations.splitlines())


def _truncate_arrays(step_dir):
  """An interrupted copy: every array file of the step cut to half its size."""
  for root, _, files in os.walk(os.path.join(step_dir, "state")):
    for name in files:
      path = os.path.join(root, name)
      if "/d/" in path and os.path.getsize(path) > 64:
        with open(path, "r+b") as fh:
          fh.truncate(os.path.getsize(path) // 2)


def test_a_damaged_newest_step_exports_the_one_before_and_a_chosen_one_is_named(tmp_path,
                                                                              capsys):
  """As training's restore does: the newest step asked for falls back (a warning names the
  damaged folder); a damaged step asked for by --step is an error naming it, exit 2."""
  w = str(tmp_path / "w")
  _, policies = scratch_run_checkpoints(w, {"rl": [3, 5]})
  _truncate_arrays(os.path.join(w, "checkpoints", "rl", "5"))
  os.makedirs(os.path.join(w, "checkpoints", "rl", "6"))  # a step folder left empty
  stats = export_run(w, str(tmp_path / "hf"))
  assert stats["label"] == "rl3"
  record = json.load(open(tmp_path / "hf" / "dllm_rl_export.json"))
  assert (record["label"], record["step"]) == ("rl3", 3)  # the step read, not the one asked
  tok = CharTokenizer()
  assert _logits_equal(dllm_rl.load_pretrained(str(tmp_path / "hf")), policies["rl3"],
                       np.array([tok.encode("12+34=")])) == 0.0
  assert convert_cli.main(["export", "--workdir", w, "--step", "5", "--out",
                           str(tmp_path / "hf5")]) == 2
  err = capsys.readouterr().err
  assert f"No readable checkpoint in {w}/checkpoints/rl: step 5: " in err
  assert "Saved steps: [3, 5, 6]; choose another step." in err and len(err) < 1000
  assert not os.path.exists(tmp_path / "hf5")


def test_a_dream_shaped_run_from_scratch_exports_the_generation_config_dream_loads(tmp_path):
  """DreamModel.from_pretrained always reads generation_config.json (OSError without it,
  tests/fixtures/dream_tiny/README.md), so a Dream export writes one with its ids."""
  from dllm_rl.infra.checkpoint import Checkpointer
  from dllm_rl.models import transformer
  from dllm_rl.train.context import model_config
  from tests.helpers import LLADA_TINY_MODEL
  config = tiny_run_config("rl", {**LLADA_TINY_MODEL, "model.qkv_bias": True,
                                  "model.logit_shift": True})
  tok = CharTokenizer()
  _, params = transformer.init_model(model_config(config, tok.vocab_size), jax.random.key(0))
  with Checkpointer(str(tmp_path / "w" / "checkpoints" / "rl"), keep=1, async_save=False) as c:
    c.save(1, {"params": params}, {"phase": "rl", "config": config.to_json()})
  assert export_run(str(tmp_path / "w"), str(tmp_path / "hf"))["family"] == "dream"
  generation = json.load(open(tmp_path / "hf" / "generation_config.json"))
  assert generation == {"bos_token_id": None, "eos_token_id": tok.eos_id,
                        "pad_token_id": tok.pad_id, "mask_token_id": tok.mask_id}
  assert dllm_rl.load_pretrained(str(tmp_path / "hf")).token_ids.mask_id == tok.mask_id


def test_an_export_record_is_not_carried_to_a_folder_made_from_it(tmp_path):
  """dllm_rl_export.json describes the run that wrote its folder: an import of that folder,
  or an export of a run from it, does not copy it (the export writes its own)."""
  from dllm_rl.models import convert
  for name in ("config.json", "model.safetensors", "tokenizer.json", "dllm_rl_export.json"):
    (tmp_path / name).write_text("{}")
  assert convert.extra_files(str(tmp_path)) == [str(tmp_path / "tokenizer.json")]


def test_a_peft_adapter_beside_the_source_is_not_carried_to_an_export(tmp_path):
  """adapter_config.json in a model folder makes transformers load that folder as the adapter
  (on its base_model_name_or_path): an export or import of it never carries one."""
  from dllm_rl.models import convert
  for name in ("config.json", "model.safetensors", "tokenizer.json", "adapter_config.json",
               "adapter_model.safetensors"):
    (tmp_path / name).write_text("{}")
  assert convert.extra_files(str(tmp_path)) == [str(tmp_path / "tokenizer.json")]


def test_an_export_into_the_runs_checkpoints_folder_is_refused(tmp_path, capsys):
  """checkpoints/<phase>/<n> would read as a damaged newest step (and be rotated out with
  the steps): --hf_dir / --peft_dir there exit 2 before anything is written."""
  w = tmp_path / "w"
  scratch_run_checkpoints(str(w), {"rl": [3]})
  for flags in (["--hf_dir", str(w / "checkpoints" / "rl" / "7")],
                ["--hf_dir", str(tmp_path / "hf"), "--peft_dir", str(w / "checkpoints" / "p")]):
    assert convert_cli.main(["export", "--workdir", str(w), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flags[-2]}: {flags[-1]} lies in the run's checkpoints"
                          f" folder {w / 'checkpoints'}, which training manages"), err
  assert sorted(os.listdir(w / "checkpoints" / "rl")) == ["3"]
  assert sorted(os.listdir(w / "checkpoints")) == ["rl"] and not (tmp_path / "hf").exists()


def test_loading_a_workdir_or_a_peft_folder_says_what_to_load_instead(tmp_path):
  """load_pretrained (and model.hf_checkpoint) on a run's workdir or a PEFT folder: the
  missing config.json is said with what the folder is and what to load."""
  (tmp_path / "w" / "checkpoints").mkdir(parents=True)
  (tmp_path / "peft").mkdir()
  (tmp_path / "peft" / "adapter_config.json").write_text("{}")
  with pytest.raises(FileNotFoundError, match="is a training run's --workdir: export its"
                     " checkpoint with `python -m dllm_rl.convert export --workdir"
                     f" {tmp_path / 'w'} --hf_dir OUT` and load OUT"):
    dllm_rl.load_pretrained(str(tmp_path / "w"))
  with pytest.raises(FileNotFoundError, match="is a PEFT adapter folder: load the merged"):
    dllm_rl.load_pretrained(str(tmp_path / "peft"))


def test_loading_a_folder_of_a_runs_checkpoints_names_the_export_that_reads_it(tmp_path):
  """A run's checkpoint step (WORKDIR/checkpoints/sft/4, as a Hugging Face Trainer's
  checkpoint-500 folder would be loaded) given to load_pretrained / model.hf_checkpoint, or to
  `convert export --ckpt`, was only "config.json not found" / "model.json not found": each
  now names the run and the export command for that phase and step."""
  from dllm_rl.models import convert
  step = tmp_path / "w" / "checkpoints" / "sft" / "4"
  (step / "state").mkdir(parents=True)
  export = f"`python -m dllm_rl.convert export --workdir {tmp_path / 'w'}"
  for path, said in (
      (step, f"is a training run's sft checkpoint (Orbax), not an HF folder: export it with"
             f" {export} --phase sft --step 4 --hf_dir OUT` and load OUT"),
      (step / "state", f"lies in a training run's checkpoint (Orbax), not an HF folder: export"
                       f" it with {export} --phase sft --step 4 --hf_dir OUT`"),
      (step.parent, f"holds a training run's sft checkpoints (Orbax), not an HF folder: export"
                    f" the newest with {export} --phase sft --hf_dir OUT`"),
      (step.parent.parent, f"export the newest with {export} --hf_dir OUT`")):
    with pytest.raises(FileNotFoundError) as err:
      dllm_rl.load_pretrained(str(path))
    assert f"{path}/config.json not found" in str(err.value) and said in str(err.value)
    with pytest.raises(FileNotFoundError) as err:
      convert.read_meta(str(path))
    assert said in str(err.value)
  other = tmp_path / "runs" / "checkpoints" / "best"  # not a phase: no run is named
  other.mkdir(parents=True)
  with pytest.raises(FileNotFoundError) as err:
    dllm_rl.load_pretrained(str(other))
  assert "export" not in str(err.value)
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "config.json").write_text("{}")
  with pytest.raises(FileNotFoundError, match=r"hf is an HF folder already \(config.json\)"):
    convert.read_meta(str(tmp_path / "hf"))


@pytest.mark.parametrize("argv, status", [(["--help"], 0), (["export", "--hf_dir", "o"], 2),
                                          (["import", "--hf_dir", "h"], 2)])
def test_help_and_usage_errors_answer_before_the_training_stack_is_imported(argv, status):
  """`convert --help` and a usage error (here: no --workdir/--ckpt, no --out) need no JAX,
  Orbax or model code: the commands import them after parsing (was ~2 s before any answer)."""
  import subprocess
  import sys
  code = ("import sys, runpy; sys.argv = ['convert', *sys.argv[1:]]"
          "\ntry: runpy.run_module('dllm_rl.convert', run_name='__main__')"
          "\nexcept SystemExit as e: print('status', e.code)"
          "\nprint(sorted(m for m in ('jax', 'flax', 'orbax') if m in sys.modules))")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                       cwd=root, timeout=60)
  assert res.stdout.split("\n")[-3:-1] == [f"status {status}", "[]"], (res.stdout, res.stderr)
