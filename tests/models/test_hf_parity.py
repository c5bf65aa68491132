"""HF checkpoint conversion: reference logits, exact round trips, CLI, errors, sharded loading.

Fixtures (tests/fixtures/*/README.md) hold tiny LLaDA and SDAR checkpoints written by
``save_pretrained`` and the PyTorch reference logits for one forward pass.
"""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
from flax import nnx
from safetensors import safe_open

from dllm_rl import convert as convert_cli
from dllm_rl.models import convert
from dllm_rl.models import hf, hf_export
from dllm_rl.models import transformer as T
from dllm_rl.parallel.mesh import make_mesh
from dllm_rl.parallel.shard import param_shardings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = {"llada": os.path.join(ROOT, "tests", "fixtures", "llada_tiny"),
            "sdar": os.path.join(ROOT, "tests", "fixtures", "sdar_tiny")}
# The fixture READMEs expect ≤ 1e-5 in float32 on CPU (float64 torch differs by < 3e-6).
LOGIT_TOL = 1e-5


def _inputs(family):
  """(tokens, positions, mask, expected logits) as the reference forward was run."""
  e = np.load(os.path.join(FIXTURES[family], "expected.npz"))
  tokens = jnp.asarray(e["input_ids"], jnp.int32)
  if family == "llada":  # no attention mask, positions 0..L-1
    positions, mask = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape), None
  else:  # the stored block-causal bool mask (1, L, L) and position_ids (1, L)
    positions = jnp.broadcast_to(jnp.asarray(e["position_ids"], jnp.int32), tokens.shape)
    mask = jnp.asarray(e["attention_mask"])
  return tokens, positions, mask, e["logits"]


def _logits(graphdef, params, family):
  tokens, positions, mask, _ = _inputs(family)
  with jax.default_matmul_precision("highest"):
    return np.asarray(jax.jit(T.apply, static_argnums=0)(graphdef, params, tokens, positions, mask))


def _copy_fixture(family, tmp_path):
  out = tmp_path / family
  shutil.copytree(FIXTURES[family], out)
  for f in out.iterdir():
    f.chmod(0o644)
  return out


def _tensors(path):
  with safe_open(str(path), framework="numpy") as f:
    return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_converted_model_reproduces_reference_logits(family):
  cfg, ids, graphdef, params, got_family = hf.load_checkpoint(FIXTURES[family])
  assert got_family == family
  assert cfg.qk_norm == (family == "sdar")
  assert (ids.mask_id, ids.eos_id) == (126, 125)
  assert ids.block_size == (4 if family == "sdar" else None)
  expected = _inputs(family)[3]
  err = float(np.abs(_logits(graphdef, params, family) - expected).max())
  print(f"{family}: max |logit error| = {err:.2e}")
  assert err <= LOGIT_TOL


def test_model_config_and_token_ids_come_from_config_json():
  with open(os.path.join(FIXTURES["sdar"], "config.json")) as f:
    c = json.load(f)
  c.update(mask_token_id=7, eos_token_id=[9, 8], pad_token_id=3, block_size=8, head_dim=16,
           tie_word_embeddings=True)
  cfg, ids = hf.model_config_from_hf(c, dtype="bfloat16")
  assert ids == hf.TokenIds(mask_id=7, eos_id=9, pad_id=3, bos_id=125, block_size=8)
  assert (cfg.head_dim, cfg.n_kv_heads, cfg.rope_theta, cfg.rms_norm_eps) == (16, 2, 1e6, 1e-6)
  assert cfg.tie_embeddings and cfg.dtype == jnp.bfloat16


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_export_import_round_trip_is_exact(family, tmp_path):
  src = FIXTURES[family]
  cfg, ids, _, params, _ = hf.load_checkpoint(src)
  hf_export.export_checkpoint(params, cfg, ids, family, str(tmp_path / "one"),
                              hf_config=hf.read_hf_config(src))
  # safetensors tensors and whole files (header + data), and config.json, byte for byte.
  for name in ("model.safetensors", "config.json"):
    with open(os.path.join(src, name), "rb") as a, open(tmp_path / "one" / name, "rb") as b:
      assert a.read() == b.read(), name
  assert convert.compare_tensors(src, str(tmp_path / "one")) == []
  # Sharded export with a config built from the family's keys; re-import is exact.
  files = hf_export.export_checkpoint(params, cfg, ids, family, str(tmp_path / "sharded"),
                                      max_shard_bytes=100_000)
  assert sum(f.endswith(".safetensors") for f in files) > 1
  assert os.path.isfile(tmp_path / "sharded" / "model.safetensors.index.json")
  assert convert.compare_tensors(src, str(tmp_path / "sharded")) == []
  cfg2, ids2, _, params2, family2 = hf.load_checkpoint(str(tmp_path / "sharded"))
  assert (cfg2, ids2, family2) == (cfg, ids, family)
  flat1, flat2 = nnx.to_flat_state(params), nnx.to_flat_state(params2)
  assert [p for p, _ in flat1] == [p for p, _ in flat2]
  for (path, a), (_, b) in zip(flat1, flat2):
    assert np.array_equal(a.get_value(), b.get_value()), path


def test_bfloat16_import_and_tied_embeddings(tmp_path):
  cfg32, ids, _, p32, _ = hf.load_checkpoint(FIXTURES["llada"])
  _, _, _, p16, _ = hf.load_checkpoint(FIXTURES["llada"], dtype="bfloat16")
  for a, b in zip(jax.tree.leaves(p32), jax.tree.leaves(p16)):
    assert b.dtype == jnp.bfloat16 and np.array_equal(np.asarray(a).astype(jnp.bfloat16), b)
  # weight_tying=true: no separate LM-head tensor is written or expected.
  tied = T.ModelConfig(**{**cfg32.__dict__, "tie_embeddings": True})
  _, params = T.init_model(tied, jax.random.key(0))
  hf_export.export_checkpoint(params, tied, ids, "llada", str(tmp_path))
  assert hf.read_hf_config(str(tmp_path))["weight_tying"] is True
  assert "model.transformer.ff_out.weight" not in _tensors(tmp_path / "model.safetensors")
  cfg2, _, _, params2, _ = hf.load_checkpoint(str(tmp_path))
  assert cfg2.tie_embeddings
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    assert np.array_equal(a, b)


def test_a_tied_models_copy_of_its_embedding_as_head_loads(tmp_path):
  """A tied checkpoint (SDAR-1.7B / 4B: tie_word_embeddings) saved by a trainer that writes
  lm_head.weight too, as a copy of the embedding, is one transformers loads: it loads, its
  logits those of the folder without the copy. It was refused as an unexpected tensor. A head
  that differs is named with the config.json key (trained untied)."""
  def tie(out, head):
    c = hf.read_hf_config(str(out))
    (out / "config.json").write_text(json.dumps({**c, "tie_word_embeddings": True}))
    tensors = _tensors(out / "model.safetensors")
    if head is None:
      del tensors["lm_head.weight"]
    else:
      tensors["lm_head.weight"] = head(tensors["model.embed_tokens.weight"])
    safetensors.numpy.save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return str(out)

  clean = tie(_copy_fixture("sdar", tmp_path / "clean"), None)
  copy = tie(_copy_fixture("sdar", tmp_path / "copy"), lambda e: e.copy())
  ref, got = hf.load_checkpoint(clean), hf.load_checkpoint(copy)
  assert got.model_cfg.tie_embeddings
  for a, b in zip(jax.tree.leaves(ref.params), jax.tree.leaves(got.params)):
    assert np.array_equal(a, b)
  differs = tie(_copy_fixture("sdar", tmp_path / "differs"), lambda e: e * 2)
  with pytest.raises(ValueError, match=r"tensor 'lm_head.weight' in .*differs from the embedding"
                                       r" 'model.embed_tokens.weight', but config.json ties them"
                                       r" \(tie_word_embeddings true\)"):
    hf.load_checkpoint(differs)


def _run_cli(*args):
  proc = subprocess.run([sys.executable, "-m", "dllm_rl.convert", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=120,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stdout + proc.stderr
  print(proc.stdout)
  return proc.stdout


def test_cli_import_export_roundtrip(tmp_path):
  out = _run_cli("import", "--hf_dir", FIXTURES["sdar"], "--out", str(tmp_path / "ckpt"))
  assert "MB/s" in out and "peak RSS" in out
  _run_cli("export", "--ckpt", str(tmp_path / "ckpt"), "--hf_dir", str(tmp_path / "hf"))
  assert convert.compare_tensors(FIXTURES["sdar"], str(tmp_path / "hf")) == []
  assert hf.read_hf_config(str(tmp_path / "hf")) == hf.read_hf_config(FIXTURES["sdar"])
  assert os.path.isfile(tmp_path / "hf" / "README.md")  # non-weight files travel along
  # The trainer's loader restores the imported params onto a sharded mesh.
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  cfg, ids, graphdef, params, family, _ = convert.load_imported(str(tmp_path / "ckpt"), mesh=mesh)
  assert family == "sdar" and ids.block_size == 4
  assert params["blocks"][0]["attn"]["q_proj"].get_value().sharding.mesh.shape == mesh.shape
  assert np.abs(_logits(graphdef, params, "sdar") - _inputs("sdar")[3]).max() <= LOGIT_TOL
  out = _run_cli("roundtrip", "--hf_dir", FIXTURES["llada"], "--tmp", str(tmp_path / "rt"))
  assert "roundtrip OK: 21 tensors byte-identical" in out


def test_cli_bad_input_exits_2(tmp_path, capsys):
  assert convert_cli.main(["import", "--hf_dir", str(tmp_path / "nope"), "--out",
                           str(tmp_path / "o")]) == 2
  assert "config.json" in capsys.readouterr().err


def test_an_import_without_tokenizer_files_warns_naming_the_folder_and_files(tmp_path, caplog):
  """It said nothing: the missing tokenizer was found by the run (or model.tokenizer) only.
  Weights alone are a documented use (load_pretrained's logits on token ids): a warning."""
  bare = _copy_fixture("llada", tmp_path / "bare")
  assert convert_cli.main(["import", "--hf_dir", str(bare), "--out", str(tmp_path / "a")]) == 0
  (warning,) = [r.getMessage() for r in caplog.records if "tokenizer" in r.getMessage()]
  assert warning.startswith(f"{bare} holds no tokenizer files (looked for tokenizer.json, or"
                            " vocab.json + merges.txt): the import holds the weights alone")
  assert convert.load_imported(str(tmp_path / "a")).family == "llada"  # imported all the same
  caplog.clear()
  for layout in convert.TOKENIZER_LAYOUTS:
    folder = _copy_fixture("llada", tmp_path / layout[-1])
    for name in layout:
      (folder / name).write_text("{}")
    assert convert.tokenizer_problem(str(folder)) is None
  convert.import_hf(str(folder), str(tmp_path / "b"))
  assert not [r for r in caplog.records if "tokenizer" in r.getMessage()]


def _truncate(path):
  os.truncate(path, os.path.getsize(path) // 2)  # an interrupted download


def test_a_truncated_safetensors_file_is_named_before_the_model_is_built(tmp_path, capsys,
                                                                        monkeypatch):
  single = _copy_fixture("llada", tmp_path / "single")
  _truncate(single / "model.safetensors")
  # a sharded copy: the fixture's tensors in two files and an index, the second file cut short
  sharded = _copy_fixture("llada", tmp_path / "sharded")
  tensors = _tensors(sharded / "model.safetensors")
  os.remove(sharded / "model.safetensors")
  names = sorted(tensors)
  shards = {"model-00001-of-00002.safetensors": names[:10],
            "model-00002-of-00002.safetensors": names[10:]}
  for shard, keys in shards.items():
    safetensors.numpy.save_file({k: tensors[k] for k in keys}, str(sharded / shard))
  (sharded / "model.safetensors.index.json").write_text(json.dumps(
      {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}))
  assert hf.weight_files(str(sharded))[0].keys() == tensors.keys()
  _truncate(sharded / "model-00002-of-00002.safetensors")

  built = []
  monkeypatch.setattr(hf, "abstract_model", lambda *a: built.append(a))  # not reached
  for folder, bad in ((single, "model.safetensors"), (sharded, "model-00002-of-00002.safetensors")):
    pattern = rf"{folder / bad} looks truncated or corrupt \(an interrupted download\?\)"
    with pytest.raises(ValueError, match=pattern):
      hf.weight_files(str(folder))
    with pytest.raises(ValueError, match=pattern):
      hf.load_checkpoint(str(folder))
    assert convert_cli.main(["import", "--hf_dir", str(folder), "--out",
                             str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {folder / bad} looks truncated") and "\n" not in err, err
  assert not built and not (tmp_path / "o").exists()
  (sharded / "model.safetensors.index.json").write_text('{"weight_map": {"a": ')
  with pytest.raises(ValueError, match=r"index\.json looks truncated or corrupt"):
    hf.weight_files(str(sharded))


def _break(tmp_path, family, edit):
  out = _copy_fixture(family, tmp_path)
  tensors = _tensors(out / "model.safetensors")
  edit(tensors)
  safetensors.numpy.save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
  return str(out)


def test_errors_name_the_problem(tmp_path):
  name = "model.transformer.blocks.1.q_proj.weight"
  bad = _break(tmp_path / "a", "llada", lambda t: t.pop(name))
  with pytest.raises(ValueError, match=rf"{name}.*missing from .*model\.safetensors"):
    hf.load_checkpoint(bad)

  name = "model.layers.0.self_attn.k_proj.weight"
  bad = _break(tmp_path / "b", "sdar", lambda t: t.update({name: np.zeros((32, 64), np.float32)}))
  with pytest.raises(ValueError, match=rf"{name}.*shape \(32, 64\), expected \(64, 64\)"):
    hf.load_checkpoint(bad)

  bad = _break(tmp_path / "c", "sdar", lambda t: t.update({"extra.bias": np.zeros(3, np.float32)}))
  with pytest.raises(ValueError, match=r"unexpected tensor.*extra\.bias"):
    hf.load_checkpoint(bad)

  out = _copy_fixture("llada", tmp_path / "e")  # the weights it has, but cannot read, named
  os.rename(out / "model.safetensors", out / "model-00001-of-00002.safetensors")
  (out / "pytorch_model.bin").write_bytes(b"")
  with pytest.raises(FileNotFoundError, match=r"index.json found; it has model-00001-of-00002"
                                              r"\.safetensors, pytorch_model\.bin \(only"):
    hf.load_checkpoint(str(out))

  out = _copy_fixture("llada", tmp_path / "d")
  c = hf.read_hf_config(str(out))
  (out / "config.json").write_text(json.dumps({**c, "architectures": ["GPT2LMHeadModel"],
                                               "model_type": "gpt2"}))
  with pytest.raises(ValueError,
                     match=r"GPT2LMHeadModel.*supported: LLaDAModelLM.*SDARForCausalLM"):
    hf.load_checkpoint(str(out))
  for key, value in (("alibi", True), ("include_bias", True), ("layer_norm_type", "default"),
                     ("block_type", "sequential")):
    with pytest.raises(ValueError, match=f"'{key}'"):
      hf.model_config_from_hf({**c, key: value})
  with pytest.raises(ValueError, match="'rope_scaling'"):
    hf.model_config_from_hf({**hf.read_hf_config(FIXTURES["sdar"]),
                             "rope_scaling": {"type": "yarn", "factor": 4.0}})


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_sharded_load_matches_single_device(family):
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  cfg, _, graphdef, params, _ = hf.load_checkpoint(FIXTURES[family], mesh=mesh)
  _, _, _, single, _ = hf.load_checkpoint(FIXTURES[family])
  want = nnx.to_flat_state(param_shardings(T.abstract_model(cfg)[1], mesh))
  split = 0
  for (path, var), (_, sh), (_, ref) in zip(nnx.to_flat_state(params), want,
                                            nnx.to_flat_state(single)):
    x = var.get_value()
    assert x.sharding.is_equivalent_to(sh.get_value(), x.ndim), path
    assert np.array_equal(x, ref.get_value()), path
    split += x.addressable_shards[0].data.shape != x.shape
  assert split >= 4 * cfg.n_layers  # q/k/v/o (and MLP) really are partitioned
  sharded_logits = _logits(graphdef, params, family)
  np.testing.assert_allclose(sharded_logits, _logits(graphdef, single, family), atol=1e-5)
  assert np.abs(sharded_logits - _inputs(family)[3]).max() <= LOGIT_TOL


# Keys of the fixtures' config.json (save_pretrained of the official config classes) that a
# config.json built by ``to_config`` (a run trained from scratch) may leave out: the official
# config class defaults each one (LLaDA's ModelConfig dataclass, SDARConfig.__init__), or no
# official code reads it (SDAR's debug / ep_size / micro_forward / skip_checkpoint /
# use_deepep), and transformers writes its own version.
_DEFAULTED = {
    "llada": {"alibi_bias_max", "attention_layer_norm_with_affine", "flash_attention",
              "init_cutoff_factor", "init_device", "init_fn", "init_std", "max_sequence_length",
              "precision"},
    "sdar": {"debug", "ep_size", "micro_forward", "skip_checkpoint", "use_deepep",
             "initializer_range", "max_position_embeddings", "max_window_layers"},
    "dream": set(),
}


@pytest.mark.parametrize("family", ["llada", "sdar", "dream"])
def test_a_built_config_json_has_every_key_the_official_code_reads(family):
  """Checked with the official modeling code (torch, trust_remote_code) on exports of runs
  trained from scratch: SDARForCausalLM.forward reads ``config.fuse_cross_entropy``, which
  SDARConfig does not default, so a config.json without it failed every forward with
  AttributeError. The built config.json now carries every key of the fixture's, but those
  the official config class defaults."""
  folder = FIXTURES.get(family, os.path.join(ROOT, "tests", "fixtures", f"{family}_tiny"))
  fixture = hf.read_hf_config(folder)
  cfg, ids = hf.model_config_from_hf(fixture)
  built = hf.FAMILIES[family].to_config(cfg, ids)
  written = {"transformers_version", "torch_dtype"}  # by transformers / export_checkpoint
  missing = set(fixture) - set(built) - _DEFAULTED[family] - written
  assert not missing, f"{family}: to_config leaves out {sorted(missing)}"
  assert hf_export.config_differences(built, cfg, ids) == []
