"""A LoRA run's checkpoint holds the adapters (and their optimizer state) only; a restore
rebuilds the frozen base from the run's pointer; `export_run` writes merged HF weights whose
logits are the unmerged model's (≤ 1e-5) and a PEFT folder that adds up to them."""

import json
import logging
import os
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

import dllm_rl
from dllm_rl.errors import ConfigError
from dllm_rl.infra.checkpoint import Checkpointer, LayoutMismatch
from dllm_rl.models import hf, hf_fingerprint, lora, transformer
from dllm_rl.parallel.mesh import make_mesh
from dllm_rl.parallel.shard import init_state_sharded
from dllm_rl.tasks.tokenizer import CharTokenizer
from dllm_rl.train import context as setup
from dllm_rl.train import layout_errors
from dllm_rl.train.export import export_run
from dllm_rl.train.lora_checkpoint import (FINGERPRINT, base_pointer, check_base,
                                           restore_checkpoint, saved_state)
from dllm_rl.train.optim import make_optimizer
from tests.helpers import (LLADA_TINY_MODEL, hf_fixture_with_tokenizer, scratch_run_checkpoints,
                           tiny_run_config)
from tests.models.test_hf_fingerprint import rewrite
from tests.models.test_lora import _randomise_b


def _run(tmp_path, base=None):
  """A LoRA run's state as context.init_params builds it, B randomised, saved at sft step 1;
  ``base``: an HF folder as its model.hf_checkpoint (its pointer and fingerprint saved as the
  phase loop saves them; the state's base is still the seed's init, which no check reads)."""
  config = tiny_run_config("sft", {**LLADA_TINY_MODEL, "lora.rank": 4, "lora.alpha": 8.0})
  mesh = make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
  model_cfg = lora.configure(setup.model_config(config, CharTokenizer().vocab_size), config.lora)
  key = jax.random.fold_in(jax.random.key(config.seed), 0)  # context.init_params' key
  graphdef, params = transformer.init_params_sharded(model_cfg, key, mesh)
  optimizer = make_optimizer(config.sft, lora_only=True)[0]
  fresh, _ = init_state_sharded(params, optimizer, jax.random.key(1), mesh)
  trained, _ = init_state_sharded(_randomise_b(params, jax.random.key(2)), optimizer,
                                  jax.random.key(1), mesh)
  directory = os.path.join(str(tmp_path), "checkpoints", "sft")
  if base is not None:
    config.model.hf_checkpoint = str(base)
  with Checkpointer(directory, async_save=False) as ckpt:
    pointer = base_pointer(config, None if base is None else str(base))
    ckpt.save(1, saved_state(trained), {"phase": "sft", **pointer, "config": config.to_json()})
  return config, mesh, model_cfg, graphdef, fresh, trained, directory


def test_checkpoint_holds_adapters_and_restores_onto_the_base(tmp_path):
  config, mesh, model_cfg, _, fresh, trained, directory = _run(tmp_path)
  with Checkpointer(directory, read_only=True) as ckpt:
    assert ckpt.meta(1)["lora_base"] == f"init from seed {config.seed}"
    _, full = transformer.abstract_params_sharded(model_cfg, mesh)
    with pytest.raises(LayoutMismatch):  # no base weight was written
      ckpt.restore_part(full, "params", 1)
    restored, _ = restore_checkpoint(ckpt, fresh)
  for part in ("params", "opt_state"):  # adapters from the file, the base from the template
    for a, b in zip(jax.tree.leaves(getattr(trained, part)),
                    jax.tree.leaves(getattr(restored, part))):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_export_writes_merged_weights_with_the_unmerged_logits(tmp_path):
  _, _, _, graphdef, _, trained, _ = _run(tmp_path / "w")
  stats = export_run(str(tmp_path / "w"), str(tmp_path / "hf"), peft_dir=str(tmp_path / "peft"))
  assert stats["label"] == "sft1"
  exported = dllm_rl.load_pretrained(str(tmp_path / "hf"))
  tok = CharTokenizer()
  ids_BL = np.array([tok.encode("123+456="), tok.encode("9+9=18??")])
  pos_BL = np.broadcast_to(np.arange(ids_BL.shape[1]), ids_BL.shape)
  with jax.default_matmul_precision("highest"):
    want = np.asarray(transformer.apply(graphdef, trained.params, ids_BL, pos_BL))
    got = np.asarray(exported.logits(ids_BL))
  assert np.abs(want - got).max() <= 1e-5


def test_peft_folder_adds_up_to_the_merged_export(tmp_path):
  """PEFT's ΔW = (α/r)·lora_B·lora_A in torch layout equals the merged export minus the base,
  for an IN-layout (q_proj, one input dim) and an OUT-layout weight (attn_out: two)."""
  _, _, model_cfg, _, _, trained, _ = _run(tmp_path / "w")
  export_run(str(tmp_path / "w"), str(tmp_path / "hf"), peft_dir=str(tmp_path / "peft"))
  adapters = load_file(str(tmp_path / "peft" / "adapter_model.safetensors"))
  config = json.load(open(tmp_path / "peft" / "adapter_config.json"))
  assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8.0, "LORA")
  assert len(adapters) == 2 * 7 * model_cfg.n_layers
  assert "model.transformer.ff_out" not in config["target_modules"]  # the head is not adapted
  merged = load_file(str(tmp_path / "hf" / "model.safetensors"))
  # a run from scratch: its seeded base is written beside the adapters, and named
  base_dir = tmp_path / "peft" / "base"
  assert config["base_model_name_or_path"] == str(base_dir)
  written = load_file(str(base_dir / "model.safetensors"))
  assert set(written) == set(merged) and dllm_rl.load_pretrained(str(base_dir)).family == "llada"
  attn = trained.params["blocks"][1]["attn"]
  for name, w, kind in (("q_proj", attn["q_proj"], hf.IN), ("attn_out", attn["o_proj"], hf.OUT)):
    module = f"model.transformer.blocks.1.{name}"
    a = adapters[f"base_model.model.{module}.lora_A.weight"]
    b = adapters[f"base_model.model.{module}.lora_B.weight"]
    base = hf.to_hf(np.asarray(w[...], np.float32), kind)
    np.testing.assert_array_equal(written[f"{module}.weight"], base)
    assert a.shape == (4, base.shape[1]) and b.shape == (base.shape[0], 4)
    np.testing.assert_allclose(merged[f"{module}.weight"] - base, 2.0 * b @ a, atol=1e-6)


def test_a_failed_merged_export_leaves_no_peft_folder(tmp_path, monkeypatch):
  """--peft_dir is written after the merged --hf_dir: a failure writing the merged weights (a
  full disk) leaves no finished-looking adapter folder without its merged model."""
  from dllm_rl.train import export
  _run(tmp_path / "w")

  write = export.hf_export.export_checkpoint

  def full_disk(*args, **kw):  # the merged folder's weights; the PEFT base's are written
    if args[4] == str(tmp_path / "hf"):
      raise OSError(28, "No space left on device")
    return write(*args, **kw)

  monkeypatch.setattr(export.hf_export, "export_checkpoint", full_disk)
  with pytest.raises(OSError, match="No space left"):
    export_run(str(tmp_path / "w"), str(tmp_path / "hf"), peft_dir=str(tmp_path / "peft"))
  assert not (tmp_path / "peft").exists()


def test_the_bases_a_peft_folder_must_carry_are_those_transformers_cannot_load(tmp_path):
  from dllm_rl.models import convert
  from dllm_rl.train.export import base_unloadable
  hf_dir = os.path.join(os.path.dirname(__file__), "fixtures", "llada_tiny")
  convert.import_hf(hf_dir, str(tmp_path / "imported"))
  assert base_unloadable("scratch") and base_unloadable(str(tmp_path / "imported"))
  assert not base_unloadable(hf_dir) and not base_unloadable("GSAI-ML/LLaDA-8B-Instruct")


def test_a_kl_term_turned_on_or_off_since_the_checkpoint_restores(tmp_path, caplog):
  """Full fine-tuning holds the reference policy only with rl.kl_coef > 0. Turned on at a
  resume (or a study.branch variant), the reference is the template's, the run's starting
  policy, with a warning; turned off, the saved one is dropped; another difference is still
  the layout error."""
  config = tiny_run_config("rl")
  mesh = make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
  model_cfg = setup.model_config(config, CharTokenizer().vocab_size)
  _, params = transformer.init_params_sharded(model_cfg, jax.random.key(0), mesh)
  start = jax.tree.map(lambda x: x + 7.0, params)  # the reference a fresh KL run would hold
  optimizer = make_optimizer(config.rl)[0]
  plain, _ = init_state_sharded(params, optimizer, jax.random.key(1), mesh)
  with_ref, _ = init_state_sharded(params, optimizer, jax.random.key(1), mesh, ref_params=start)
  leaves = lambda tree: [np.asarray(x) for x in jax.tree.leaves(tree)]
  for name, saved, template, want in (("off_then_on", plain, with_ref, start),
                                      ("on_then_off", with_ref, plain, None)):
    with Checkpointer(str(tmp_path / name), async_save=False) as ckpt:
      ckpt.save(3, saved, {"at": 3})
      with caplog.at_level("WARNING"):
        state, meta = restore_checkpoint(ckpt, template)
    assert meta == {"at": 3}
    for got, expected in zip(leaves(state.params), leaves(params)):
      np.testing.assert_array_equal(got, expected)
    if want is None:
      assert state.ref_params is None
    else:
      for got, expected in zip(leaves(state.ref_params), leaves(start)):
        np.testing.assert_array_equal(got, expected)
  assert caplog.text.count("holds no reference policy") == 1
  wider = setup.model_config(tiny_run_config("rl", {"model.mlp_hidden": 96}),
                             CharTokenizer().vocab_size)
  _, other = transformer.init_params_sharded(wider, jax.random.key(0), mesh)
  other, _ = init_state_sharded(other, optimizer, jax.random.key(1), mesh, ref_params=other)
  with Checkpointer(str(tmp_path / "off_then_on"), async_save=False) as ckpt:
    with pytest.raises(LayoutMismatch, match="Shape mismatch"):
      restore_checkpoint(ckpt, other)


def test_adapters_are_checked_against_the_base_they_were_trained_on(caplog):
  config = tiny_run_config("rl", {"lora.rank": 4})
  seed0 = base_pointer(config)
  assert seed0["lora_base"] == "init from seed 0"
  check_base(seed0, config, "ckpt/3")  # the same base
  check_base({}, config, "ckpt/3")  # no pointer saved: nothing to check
  with pytest.raises(ConfigError, match=r"^config\.seed: ckpt/3: its LoRA adapters were trained"
                                        r" on the base 'init from seed 1'"):
    check_base({"lora_base": "init from seed 1"}, config, "ckpt/3")
  with pytest.raises(ConfigError, match=r"^config\.model\.hf_checkpoint: .* '/hf/base'"):
    check_base({"lora_base": "/hf/base"}, config, "ckpt/3")  # an HF base then, a seed's now
  config.model.hf_checkpoint = "/hf/base"
  with pytest.raises(ConfigError, match=r"^config\.model\.hf_checkpoint: .*'init from seed 0'"):
    check_base(seed0, config, "ckpt/3")  # a seed's then, an HF base now
  with caplog.at_level(logging.WARNING):
    check_base({"lora_base": "/moved/base"}, config, "ckpt/3")  # two HF paths: said
  assert "trained on the base '/moved/base'; this run's base is '/hf/base'" in caplog.text
  config.lora.rank = 0
  check_base({"lora_base": "init from seed 1"}, config, "ckpt/3")  # no LoRA: no adapters


def test_adapters_on_a_base_whose_weights_changed_in_place_are_refused(tmp_path, caplog):
  """A LoRA run's meta holds its HF base's fingerprint: the base folder rewritten in place
  with one tensor one ulp off (a re-download of another revision, a fine-tune saved over it)
  is a ConfigError on a resume, on mode=eval's read and on export, before the base is
  rebuilt; the same weights restore without a word."""
  from dllm_rl.train import run_checkpoints
  source = hf_fixture_with_tokenizer(tmp_path)
  config, mesh, model_cfg, _, fresh, _, directory = _run(tmp_path / "w", base=source)
  with Checkpointer(directory, read_only=True) as ckpt:
    assert ckpt.meta(1)[FINGERPRINT] == hf_fingerprint.fingerprint(str(source))
    with caplog.at_level(logging.WARNING):
      restore_checkpoint(ckpt, fresh, config)
  assert caplog.text == ""
  rewrite(source, lambda name, w: np.nextafter(w, np.inf) if "blocks.1.v_proj" in name else w)
  changed = (rf"{directory}/?1?: the weights of its LoRA base '{source}' changed since the"
             r" adapters were trained \(their fingerprint, saved with the adapters, differs\):"
             r" .* now holds the same tensors with other values")
  with Checkpointer(directory, read_only=True) as ckpt:  # a resume (phases._restore)
    with pytest.raises(ConfigError, match=rf"^config\.model\.hf_checkpoint: {changed}"):
      restore_checkpoint(ckpt, fresh, config)

  def base():
    raise AssertionError("the base was rebuilt before the check")

  ref = run_checkpoints.CheckpointRef(str(tmp_path / "w"), "sft", 1)
  with pytest.raises(ConfigError, match=r"Point model\.hf_checkpoint at the weights they were"):
    run_checkpoints.restore_params(ref, model_cfg, mesh, base=base, config=config)  # eval
  with pytest.raises(ConfigError, match=rf"^--hf_source: {changed}.* Point --hf_source at"):
    export_run(str(tmp_path / "w"), str(tmp_path / "hf"))
  assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_a_lora_run_saves_its_bases_fingerprint_and_its_resume_checks_it(tmp_path):
  """End to end: a LoRA SFT run from an HF folder saves the folder's fingerprint beside
  ``lora_base``; the folder overwritten in place (another model of the same architecture),
  the resume stops before anything compiles, naming model.hf_checkpoint."""
  from dllm_rl.train import modes
  source = hf_fixture_with_tokenizer(tmp_path)
  config = tiny_run_config("sft", {
      "model.hf_checkpoint": str(source), "lora.rank": 4, "sft.steps": 2, "sft.eval_every": 0,
      "sft.target_accuracy": 0.0, "checkpoint.save_every": 2, "data.batch_size": 8,
      "data.prompt_len": 16})
  modes.run(config, str(tmp_path / "w"))
  with Checkpointer(str(tmp_path / "w" / "checkpoints" / "sft"), read_only=True) as ckpt:
    meta = ckpt.meta(2)
  assert meta["lora_base"] == str(source)
  assert meta[FINGERPRINT] == hf_fingerprint.fingerprint(str(source))
  rewrite(source, lambda name, w: w[::-1].copy())  # the same tensors, other values
  config.sft.steps = 4
  with pytest.raises(ConfigError, match=r"^config\.model\.hf_checkpoint: .*sft: the weights of"
                                        r" its LoRA base .* changed since the adapters"):
    modes.run(config, str(tmp_path / "w"))


def _hf_base_meta(tmp_path):
  """(a LoRA run's config on an HF base folder, the meta its checkpoints hold, the folder)."""
  source = hf_fixture_with_tokenizer(tmp_path / "src")
  config = tiny_run_config("sft", {"lora.rank": 4, "model.hf_checkpoint": str(source)})
  return config, base_pointer(config, str(source)), source


def test_an_hf_base_is_checked_by_its_weights_not_its_path(tmp_path, caplog):
  """The same weights at another path (a moved copy): verified, no warning, where a
  checkpoint without a fingerprint (older) gets the path warning; the same tensors re-saved
  in another dtype: a warning (bytes cannot be compared); rewritten in place with other
  values: a ConfigError naming the key the caller gives."""
  config, meta, source = _hf_base_meta(tmp_path)
  moved = tmp_path / "moved"
  shutil.copytree(source, moved)
  config.model.hf_checkpoint = str(moved)
  with caplog.at_level(logging.WARNING):
    check_base(meta, config, "ckpt/1")
    assert caplog.text == ""
    older = {k: v for k, v in meta.items() if k != FINGERPRINT}
    check_base(older, config, "ckpt/1")  # no fingerprint saved: the path rule
    assert "this run's base is" in caplog.text and "right only if" in caplog.text
    caplog.clear()
    rewrite(moved, lambda name, w: w.astype(np.float16))
    check_base(meta, config, "ckpt/1")
  assert caplog.text.count("WARNING") == 1
  assert (f"ckpt/1: its LoRA adapters were trained on the base '{source}' in F32; {moved}"
          " holds the same tensors in F16 (a re-save in another dtype?), whose bytes cannot be"
          " compared: right only if it holds the same weights (model.hf_checkpoint)"
          ) in caplog.text
  config.model.hf_checkpoint = str(source)
  rewrite(source, lambda name, w: np.nextafter(w, np.inf) if "ln_f" in name else w)
  with pytest.raises(ConfigError, match=r"^--flag: ckpt/1: the weights of its LoRA base .*"
                                        r" now holds the same tensors with other values"):
    check_base(meta, config, "ckpt/1", key="--flag")


def test_every_process_stops_when_one_finds_the_base_changed(tmp_path, monkeypatch):
  """Each process fingerprints its own copy of the base (a gs:// base staged per host) and the
  verdicts are agreed: a process whose copy matches still stops when another's does not,
  rather than going on to wait for it in a collective."""
  from dllm_rl.train import lora_checkpoint
  config, meta, _ = _hf_base_meta(tmp_path)
  agreed = []

  def other_process_changed(flags):  # (changed, dtypes, unknown) OR another process's
    agreed.append(flags.tolist())
    return flags | np.array([True, False, False])

  monkeypatch.setattr(lora_checkpoint, "agree_any", other_process_changed)
  with pytest.raises(ConfigError, match=r"^config\.model\.hf_checkpoint: ckpt/1: another"
                                        r" process found the weights of its LoRA base"):
    check_base(meta, config, "ckpt/1")
  assert agreed == [[False, False, False]]  # this process: the same weights


def test_the_peft_folder_names_a_relative_source_by_its_absolute_path(tmp_path, monkeypatch):
  """A run given ``model.hf_checkpoint=rel/llada_tiny`` (relative to where it was launched):
  PEFT resolves ``base_model_name_or_path`` from the loading process's working directory (or
  as a hub id), so the folder names the source absolutely; hub ids stay as given."""
  from dllm_rl.train.export import peft_base
  (tmp_path / "rel" / "llada_tiny").mkdir(parents=True)
  monkeypatch.chdir(tmp_path)
  assert peft_base("rel/llada_tiny") == str(tmp_path / "rel" / "llada_tiny")
  assert peft_base(str(tmp_path / "rel" / "llada_tiny")) == str(tmp_path / "rel" / "llada_tiny")
  assert peft_base("GSAI-ML/LLaDA-8B-Instruct") == "GSAI-ML/LLaDA-8B-Instruct"
  assert peft_base("gs://bucket/llada") == "gs://bucket/llada"


def test_a_taken_peft_dir_is_refused_before_anything_is_written(tmp_path, capsys):
  """--peft_dir never overwrites an adapter, never adds adapter files to a model folder (the
  run's source, say: transformers would load it as that adapter) nor to --hf_dir itself;
  checked first, before the workdir (here without a checkpoint) is read."""
  from dllm_rl import convert as convert_cli
  w, out = str(tmp_path / "w"), str(tmp_path / "hf")
  old = tmp_path / "old_peft"
  old.mkdir()
  (old / "adapter_config.json").write_text("{}")
  model = tmp_path / "model"
  model.mkdir()
  (model / "config.json").write_text("{}")

  def error(peft_dir):
    assert convert_cli.main(["export", "--workdir", w, "--out", out,
                             "--peft_dir", str(peft_dir)]) == 2
    return capsys.readouterr().err

  assert error(old) == (f"error: --peft_dir: {old} already holds a PEFT adapter"
                        " (adapter_config.json); use a new folder\n")
  assert error(model) == (f"error: --peft_dir: {model} already holds an HF checkpoint;"
                          " use a new folder\n")
  assert error(out) == (f"error: --peft_dir: {out} is where --hf_dir {out} goes: the merged"
                        " weights and the adapters need two folders\n")
  assert sorted(os.listdir(old)) == ["adapter_config.json"]
  assert sorted(os.listdir(model)) == ["config.json"] and not os.path.exists(out)


def test_a_peft_dir_in_a_multi_process_export_is_refused(tmp_path, monkeypatch, capsys):
  """The PEFT folder is a single-process export (docs/models.md): with several processes
  --peft_dir is an error naming the flag before anything is read, not a hang in the base's
  collective write (process 0 alone wrote it) or a failure on arrays other processes hold."""
  from dllm_rl import convert as convert_cli
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  out, peft_dir = tmp_path / "hf", tmp_path / "peft"
  assert convert_cli.main(["export", "--workdir", str(tmp_path / "w"), "--out", str(out),
                           "--peft_dir", str(peft_dir)]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: --peft_dir: the PEFT folder is a single-process export (2")
  assert not out.exists() and not peft_dir.exists()


def test_a_lora_resume_with_another_model_param_dtype_is_not_refused():
  """model.param_dtype is not read with LoRA (adapters and moments float32, the base in
  lora.base_dtype and not saved): a resume that changes it casts nothing, so it is not the
  'would cast its parameters and optimizer state' error full fine-tuning gets."""
  trained = tiny_run_config("sft", {"lora.rank": 4})
  meta = {"config": trained.to_json()}
  now = tiny_run_config("sft", {"lora.rank": 4, "model.param_dtype": "bfloat16"})
  layout_errors.check_param_dtype(meta, now, "DIR/checkpoints/sft")
  now.lora.rank = 0
  with pytest.raises(ConfigError, match=r"^config\.model\.param_dtype: DIR/checkpoints/sft was"
                                        r" trained with model\.param_dtype = float32"):
    layout_errors.check_param_dtype(meta, now, "DIR/checkpoints/sft")


def test_a_peft_dir_for_a_full_fine_tuned_run_is_refused_before_its_parameters_are_read(
    tmp_path, monkeypatch):
  """--peft_dir on a run with lora.rank 0: said from the checkpoint's config, before the
  whole model is read (minutes at 8B) and before anything is written."""
  from dllm_rl.train import export
  scratch_run_checkpoints(tmp_path / "w", {"sft": [2]})

  def restore(*args, **kwargs):
    raise AssertionError("the parameters were read first")

  monkeypatch.setattr(export, "restore_run_params", restore)
  with pytest.raises(ValueError, match=r"^--peft_dir: sft2 is not a LoRA run \(lora.rank = 0\)"):
    export_run(str(tmp_path / "w"), str(tmp_path / "hf"), peft_dir=str(tmp_path / "peft"))
  assert not (tmp_path / "hf").exists() and not (tmp_path / "peft").exists()


def test_eval_of_adapters_on_their_base_moved_elsewhere_says_no_other_settings(tmp_path):
  """mode=eval of a LoRA run whose HF base folder has moved: the base at its new path holds
  the weights the adapters were trained on (their fingerprint), so the other
  model.hf_checkpoint is no other policy and not said (its fix would name the old path, gone);
  other weights there (or no fingerprint to compare) still are."""
  from dllm_rl.train import run_checkpoints
  from dllm_rl.train.eval_mode import trained_otherwise
  config, pointer, source = _hf_base_meta(tmp_path)
  config.lora.alpha = 8.0
  with Checkpointer(str(tmp_path / "w" / "checkpoints" / "sft"), async_save=False) as ckpt:
    ckpt.save(1, {"params": {"x": np.zeros(2)}}, {"phase": "sft", **pointer,
                                                  "config": config.to_json()})
  moved = tmp_path / "moved"
  shutil.move(str(source), moved)
  config.model.hf_checkpoint = str(moved)
  ref = run_checkpoints.CheckpointRef(str(tmp_path / "w"), "sft", 1)
  assert trained_otherwise(ref, config, str(moved)) == []
  config.lora.alpha = 16.0  # another policy setting is still said, alone
  [line] = trained_otherwise(ref, config, str(moved))
  assert "(lora.alpha: 8.0 → 16.0)" in line and "hf_checkpoint" not in line
  config.lora.alpha = 8.0
  rewrite(moved, lambda name, w: w[::-1].copy())  # other weights there: said
  [line] = trained_otherwise(ref, config, str(moved))
  assert f"model.hf_checkpoint: '{source}' → '{moved}'" in line


def test_a_run_without_lora_on_a_lora_checkpoint_says_how_to_fully_fine_tune_it():
  """LoRA SFT, then RL (or eval) with lora.rank=0 in the same workdir: the layout error names
  lora.rank with the value to pass and, since a full fine-tune cannot start from adapters,
  the merged export that it can start from (the reverse direction has its own note)."""
  from dllm_rl.config import base_config
  trained, now = base_config(), base_config()
  trained.lora.rank = 8
  err = layout_errors.layout_error(ValueError("x"), trained, now)
  assert err.key == "lora.rank" and "pass --config.lora.rank=8" in str(err)
  assert ("to fully fine-tune (or evaluate without LoRA) the policy it learned, export it"
          " merged (python -m dllm_rl.convert export --workdir RUN --hf_dir OUT) and point"
          " model.hf_checkpoint at OUT in a new --workdir") in str(err)
  assert "full-fine-tuned checkpoint cannot be its base" not in str(err)
  now.lora.rank = 4  # another rank: no note either way
  assert "export it merged" not in str(layout_errors.layout_error(ValueError("x"), trained, now))
