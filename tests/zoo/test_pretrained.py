"""The public loading API: ``dllm_rl.load_pretrained(path)`` on every family's fixture.

Logits equal the official forward's (tests/fixtures/*/expected.npz), ``generate`` takes the
official generator's keywords and reproduces its outputs where the fixture has them, an
imported folder loads like its HF source, and bad input names the problem.
"""

import json
import os
import shutil

import jax
import numpy as np
import pytest

import dllm_rl
from dllm_rl.models import convert

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
LLADA, SDAR = os.path.join(FIXTURES, "llada_tiny"), os.path.join(FIXTURES, "sdar_tiny")


@pytest.fixture(scope="module")
def llada():
  return dllm_rl.load_pretrained(LLADA)


@pytest.fixture(scope="module")
def sdar():
  return dllm_rl.load_pretrained(SDAR)


def _max_diff(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def test_llada_logits_and_ids(llada):
  data = np.load(os.path.join(LLADA, "expected.npz"))
  with jax.default_matmul_precision("highest"):
    logits = llada.logits(data["input_ids"])
  assert logits.dtype == np.float32 and logits.shape == data["logits"].shape
  assert _max_diff(logits, data["logits"]) < 1e-4
  hf_config = json.load(open(os.path.join(LLADA, "config.json")))
  assert llada.family == "llada"
  assert llada.token_ids.mask_id == hf_config["mask_token_id"]
  assert llada.token_ids.eos_id == hf_config["eos_token_id"]


def test_sdar_block_causal_logits(sdar):
  data = np.load(os.path.join(SDAR, "expected.npz"))
  with jax.default_matmul_precision("highest"):
    logits = sdar.logits(data["input_ids"], attention="block_causal", block_size=4)
    full = sdar.logits(data["input_ids"])
  assert _max_diff(logits, data["logits"]) < 1e-4
  assert _max_diff(full, data["logits"]) > 0.1  # the mask matters: the test can fail


@pytest.mark.parametrize("shape", ["a", "c"])
def test_llada_generate_is_the_official_call(llada, shape):
  data = np.load(os.path.join(LLADA, "sampler_parity.npz"))
  b, p, gen_length, steps, block_length = (int(v) for v in data[f"{shape}_params"])
  with jax.default_matmul_precision("highest"):
    out = np.asarray(llada.generate(data[f"{shape}_prompt"], steps=steps, gen_length=gen_length,
                                    block_length=block_length, temperature=0.0, cfg_scale=0.0,
                                    remasking="low_confidence"))
  official = data[f"{shape}_output"]
  assert out.shape == official.shape == (b, p + gen_length)
  eos = llada.token_ids.eos_id
  for got, want in zip(out, official):  # equal up to and including the first EOS
    hits = np.flatnonzero(want[p:] == eos)
    n = p + (hits[0] + 1 if hits.size else gen_length)
    np.testing.assert_array_equal(got[:n], want[:n])


def test_unknown_keyword_names_the_accepted_ones(llada, sdar):
  with pytest.raises(TypeError, match=r"gen_lenght.*accepted: steps, gen_length"):
    llada.generate(np.zeros((1, 4), np.int32), gen_lenght=8)
  with pytest.raises(TypeError, match="denoising_steps"):
    sdar.generate(np.zeros((1, 4), np.int32), steps=8)
  with pytest.raises(ValueError, match="cfg_scale"):
    llada.generate(np.zeros((1, 4), np.int32), cfg_scale=1.0)
  with pytest.raises(ValueError, match=r"remasking='lowest'; supported: .*low_confidence.*random"):
    llada.generate(np.zeros((1, 4), np.int32), remasking="lowest")


def test_llada_prompt_holding_the_mask_id_is_refused(llada):
  """The official generate would infill a prompt's mask ids (they compete for every step's
  slots); the port decodes the completion only, so it names them instead of differing."""
  prompt = np.array([[5, 6, llada.token_ids.mask_id, 7]])
  with pytest.raises(ValueError, match=r"mask_id=126 at \(row, position\) \[\(0, 2\)\]"):
    llada.generate(prompt, steps=4, gen_length=4, block_length=4)


def _sdar_reference(model, prompt_1P, *, gen_length, block_length, denoising_steps, threshold):
  """The official ``block_diffusion_generate`` loop at temperature 0, written step by step in
  numpy over ``Pretrained.logits`` (one window forward per step, no cache)."""
  mask_id = model.token_ids.mask_id
  p = prompt_1P.shape[1]
  nb = -(-(p + gen_length) // block_length)
  x = np.full((1, nb * block_length), mask_id, np.int64)
  x[:, :p] = prompt_1P
  base, rem = divmod(block_length, denoising_steps)
  k_S = [base + (s < rem) for s in range(denoising_steps)]
  for blk in range(p // block_length, nb):
    lo, hi = blk * block_length, (blk + 1) * block_length
    for s in range(denoising_steps):
      cur = x[0, lo:hi]
      masked = cur == mask_id
      if not masked.any():
        break
      logits = np.asarray(model.logits(x[:, :hi], attention="block_causal",
                                       block_size=block_length))[0, lo:hi].astype(np.float64)
      probs = np.exp(logits - logits.max(-1, keepdims=True))
      probs /= probs.sum(-1, keepdims=True)
      x0, p0 = probs.argmax(-1), probs.max(-1)
      conf = np.where(masked, p0, -np.inf)
      high = conf > threshold
      if high.sum() >= k_S[s]:
        take = high
      else:
        take = np.zeros_like(masked)
        take[np.argsort(-conf, kind="stable")[:k_S[s]]] = True
      cur[take] = x0[take]
  return x


@pytest.mark.parametrize("prompt_len", [8, 6])  # a prompt that ends inside a block, and not
def test_sdar_generate_matches_the_official_loop(sdar, prompt_len):
  prompt = np.random.default_rng(prompt_len).integers(0, 120, (1, prompt_len))
  kwargs = dict(gen_length=10, block_length=4, denoising_steps=2, temperature=0.0)
  with jax.default_matmul_precision("highest"):
    out = np.asarray(sdar.generate(prompt, confidence_threshold=0.3, **kwargs))
    want = _sdar_reference(sdar, prompt, gen_length=10, block_length=4, denoising_steps=2,
                           threshold=0.3)
  assert out.shape == want.shape == (1, -(-(prompt_len + 10) // 4) * 4)
  np.testing.assert_array_equal(out, want)
  assert (out[:, prompt_len:] != sdar.token_ids.mask_id).any()


def test_sdar_padded_prompt_is_refused_with_a_reason(sdar):
  with pytest.raises(ValueError, match="unpadded prompt"):
    sdar.generate(np.ones((2, 4), np.int32), attention_mask_BP=np.array([[0, 1, 1, 1]] * 2))


def test_imported_folder_loads_like_its_source(tmp_path, llada):
  out = str(tmp_path / "imported")
  convert.import_hf(LLADA, out)
  imported = dllm_rl.load_pretrained(out)
  ids = np.load(os.path.join(LLADA, "expected.npz"))["input_ids"][:1]
  assert imported.family == "llada" and imported.token_ids == llada.token_ids
  np.testing.assert_array_equal(np.asarray(imported.logits(ids)), np.asarray(llada.logits(ids)))


def test_bad_input_is_named(tmp_path, llada):
  bad = tmp_path / "gpt2"
  shutil.copytree(LLADA, bad)
  cfg = json.load(open(bad / "config.json"))
  cfg.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
  json.dump(cfg, open(bad / "config.json", "w"))
  with pytest.raises(ValueError, match=r"unsupported architecture.*supported: LLaDAModelLM"):
    dllm_rl.load_pretrained(str(bad))
  with pytest.raises(FileNotFoundError, match="missing' does not exist; give a checkpoint folder"):
    dllm_rl.load_pretrained(str(tmp_path / "missing"))
  with pytest.raises(ValueError, match=r"token ids must lie in \[0, 128\)"):
    llada.logits(np.array([[1, 500]]))
  with pytest.raises(ValueError, match="block_size"):
    llada.logits(np.array([[1, 2]]), attention="block_causal")
  with pytest.raises(ValueError, match="does not match"):
    llada.logits(np.array([[1, 2]]), attention_mask_BL=np.ones((1, 3)))
  with pytest.raises(ValueError,
                     match=r"token ids must lie in \[0, 128\), got \[1, 1099511627776\]"):
    llada.logits(np.array([[1, 2**40]]))  # not wrapped to 0 by the int32 cast
  with pytest.raises(ValueError, match=r"input_ids_BL: empty \(\[1, 0\]\)"):
    llada.logits(np.zeros((1, 0), np.int64))
  # generate's counts and temperature, named by their official keywords before compiling
  with pytest.raises(ValueError, match="llada generate: steps must be a positive integer, got 0"):
    llada.generate(np.array([[1, 2]]), steps=0)
  with pytest.raises(ValueError, match="gen_length must be a positive integer, got 0"):
    llada.generate(np.array([[1, 2]]), gen_length=0)
  with pytest.raises(ValueError, match="temperature must be >= 0"):
    llada.generate(np.array([[1, 2]]), temperature=-1.0)
  with pytest.raises(ValueError, match=r"gen_length=8 must be a multiple of block_length=3"):
    llada.generate(np.array([[1, 2]]), gen_length=8, block_length=3, steps=8)
  # a special id outside the vocabulary (another model's) would embed as NaN rows
  with pytest.raises(ValueError, match=r"llada generate: mask_id=126336 is outside the"
                                       r" vocabulary \[0, 128\)"):
    llada.generate(np.array([[1, 2]]), mask_id=126336)


def test_a_mis_shaped_tensor_is_named_and_nothing_is_written(tmp_path):
  import safetensors.numpy
  src = tmp_path / "bad"
  shutil.copytree(LLADA, src)
  tensors = safetensors.numpy.load_file(str(src / "model.safetensors"))
  name = "model.transformer.blocks.0.ff_out.weight"
  want = tensors[name].shape
  tensors[name] = np.zeros(want[::-1], np.float32)
  safetensors.numpy.save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
  shape_msg = rf"{name}.*shape \({want[1]}, {want[0]}\), expected \({want[0]}, {want[1]}\)"
  with pytest.raises(ValueError, match=shape_msg):
    dllm_rl.load_pretrained(str(src))
  out = tmp_path / "imported"
  with pytest.raises(ValueError, match=shape_msg):
    convert.import_hf(str(src), str(out))
  assert not out.exists()


def test_a_generator_that_does_not_fit_the_family_is_refused_before_loading(tmp_path):
  with pytest.raises(ValueError,
                     match=r"generator='llada2.1' does not fit a llada.*supported: llada"):
    dllm_rl.load_pretrained(LLADA, generator="llada2.1")


DREAM = os.path.join(FIXTURES, "dream_tiny")


@pytest.fixture(scope="module")
def dream():
  return dllm_rl.load_pretrained(DREAM)


def test_dream_logits_are_the_raw_rows_and_ids_come_from_config(dream):
  data = np.load(os.path.join(DREAM, "expected.npz"))
  with jax.default_matmul_precision("highest"):
    logits = dream.logits(data["input_ids"])
  assert _max_diff(logits, data["logits"]) < 1e-4  # before the shift, as the official forward
  assert _max_diff(logits, data["logits_shifted"]) > 0.5
  assert (dream.family, dream.generator) == ("dream", "dream")
  ids = dream.token_ids
  assert (ids.mask_id, ids.eos_id, ids.pad_id) == (156, 150, 150)


def test_dream_diffusion_generate_is_the_official_call(dream):
  data = np.load(os.path.join(FIXTURES, "dream_tiny", "sampler_parity.npz"))
  b, p, max_new_tokens, steps = (int(v) for v in data["c_params"])
  with jax.default_matmul_precision("highest"):
    out = dream.generate(data["c_prompt"], max_new_tokens=max_new_tokens, steps=steps,
                         temperature=0.0, top_p=None, top_k=None, alg="entropy", alg_temp=0.0,
                         mask_token_id=156)
  np.testing.assert_array_equal(np.asarray(out), data["c_entropy_output"])
  with pytest.raises(TypeError, match="accepted: max_length, max_new_tokens, steps"):
    dream.generate(data["c_prompt"], gen_length=8)


def test_dream_length_keywords_follow_diffusion_generate(dream):
  """Dream's ``_prepare_generated_length``: without max_length / max_new_tokens, the default
  max_length (20) counts *new* tokens (20 + prompt, capped at max_position_embeddings); an
  explicit max_length counts the prompt, and one that leaves no room is refused."""
  import dataclasses
  prompt = np.random.default_rng(0).integers(0, 150, (1, 24))
  assert dream.generate(prompt[:, :8], steps=1).shape == (1, 8 + 20)
  assert dream.generate(prompt, steps=1).shape == (1, 24 + 20)  # a prompt longer than 20
  assert dream.generate(prompt[:, :8], max_length=20, steps=1).shape == (1, 20)
  capped = dataclasses.replace(dream, hf_config={**dream.hf_config, "max_position_embeddings": 30})
  assert capped.generate(prompt, steps=1).shape == (1, 30)
  with pytest.raises(ValueError, match=r"max_length=20 leaves no room after the 24-token prompt"):
    dream.generate(prompt, max_length=20, steps=1)


def test_dream_sampling_keywords_left_out_are_the_ones_from_config_json(dream):
  """diffusion_generate's config is DreamGenerationConfig.from_model_config(model.config);
  under transformers 4.46 config.json carries PretrainedConfig's legacy generation defaults
  (temperature 1.0, top_k 50, top_p 1.0), so a call without them samples, from the top 50."""
  from dllm_rl.zoo.generators import GENERATORS
  bound = GENERATORS["dream"].bind("dream", {})
  assert (bound["temperature"], bound["top_p"], bound["top_k"]) == (1.0, 1.0, 50)
  prompt = np.random.default_rng(0).integers(0, 150, (2, 8))
  runs = [np.asarray(dream.generate(prompt, max_new_tokens=8, steps=4, key=jax.random.key(k)))
          for k in (0, 1)]
  assert (runs[0] != runs[1]).any()  # sampled: another key, other tokens


def test_a_folder_never_holds_an_import_and_an_hf_checkpoint(tmp_path):
  """model.json (`convert import`) beside config.json: loading either silently would be a
  guess, so it is refused naming both files, and neither command writes such a folder."""
  imported, hf_dir = str(tmp_path / "imported"), tmp_path / "hf"
  convert.import_hf(SDAR, imported)
  with pytest.raises(FileExistsError, match="holds a `convert import` checkpoint"):
    convert.export_hf(imported, imported)  # the export would not be what loads
  shutil.copytree(LLADA, hf_dir)
  with pytest.raises(FileExistsError, match="holds an HF checkpoint"):
    convert.import_hf(str(hf_dir), str(hf_dir))
  for name in ("config.json", "model.safetensors"):  # an LLaDA beside the SDAR import
    shutil.copy(os.path.join(LLADA, name), os.path.join(imported, name))
  with pytest.raises(ValueError, match=r"two checkpoints: .*model\.json\) and .*config\.json\)"):
    dllm_rl.load_pretrained(imported)


def test_an_import_cut_short_is_never_completed_with_another_models_description(
    tmp_path, monkeypatch, capsys):
  """An import cut short before its model.json leaves params/ behind. Rerun into that folder
  (here with another model), Orbax kept the old step ("already exists ... not overwriting")
  and the new model.json described the new source: "import [sdar]" reported success, and the
  folder then loaded the other model's weights. It is refused, as a file for --out (or on
  the way to it) is, before the source is read; the CLI names --out."""
  from dllm_rl import convert as cli
  from dllm_rl.models import hf
  cut = tmp_path / "cut"
  convert.import_hf(LLADA, str(cut))
  os.remove(cut / "model.json")
  (tmp_path / "file").write_text("")
  monkeypatch.setattr(hf, "load_checkpoint", lambda *a, **k: pytest.fail("the source was read"))
  with pytest.raises(FileExistsError, match="holds params/ without model.json: an unfinished"
                     ) as taken:
    convert.import_hf(SDAR, str(cut))
  assert isinstance(taken.value, convert.OutputFolderError)  # the type the CLI names as --out
  assert not (cut / "model.json").exists()
  file = tmp_path / "file"
  for out, said in ((cut, f"{cut} holds params/ without model.json"),
                    (file, f"{file} is a file, not a folder"),
                    (file / "x", f"{file / 'x'}: {file} is a file, not a folder")):
    assert cli.main(["import", "--hf_dir", SDAR, "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out: {said}"), out
  assert cli.main(["roundtrip", "--hf_dir", SDAR, "--tmp", str(tmp_path / "file")]) == 2
  assert capsys.readouterr().err.startswith(f"error: --tmp: {tmp_path / 'file'} is a file")


def test_sequences_past_the_checkpoints_maximum_length_are_warned_about(llada):
  """llada_tiny's config.json: max_sequence_length 64. Logits of 65 tokens, or a generation
  whose sequences reach 72, get a warning naming the key; 64 tokens none."""
  import warnings
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    llada.logits(np.zeros((1, 64), np.int64))
  with pytest.warns(UserWarning, match=r"input_ids_BL: 65 tokens, longer than the checkpoint's"
                                       r" maximum sequence length 64 \(max_sequence_length"):
    llada.logits(np.zeros((1, 65), np.int64))
  with pytest.warns(UserWarning, match=r"the generated sequences: 72 tokens"):
    llada.generate(np.zeros((1, 8), np.int64), steps=8, gen_length=64, block_length=64)


def test_the_folders_tokenizer_encodes_templates_and_decodes(tmp_path, llada):
  """``model.tokenizer``: the folder's own tokenizer and chat template, with the checkpoint's
  ids (the EOS ends a decode), for an HF folder and its ``convert import``; a folder without
  tokenizer files is a FileNotFoundError naming it, only when the tokenizer is asked for."""
  from tests.helpers import hf_fixture_with_tokenizer
  folder = hf_fixture_with_tokenizer(tmp_path)
  imported = str(tmp_path / "imported")
  convert.import_hf(str(folder), imported)
  for path in (str(folder), imported):
    model = dllm_rl.load_pretrained(path)
    tok = model.tokenizer
    assert tok.format_prompt("1+2?") == "Q: 1+2?A: "  # HF renders with trim_blocks
    ids = tok.encode("1+2?")
    assert tok.decode(ids + [model.token_ids.eos_id] + tok.encode("x")) == "1+2?"
    assert tok.mask_id == model.token_ids.mask_id and model.tokenizer is tok  # read once
  with pytest.raises(FileNotFoundError, match="tokenizer"):
    llada.tokenizer  # noqa: B018  (the fixture folder has weights only)
