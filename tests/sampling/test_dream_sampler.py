"""Dream's ``diffusion_generate`` samplers: official parity and invariants.

tests/fixtures/dream_tiny/sampler_parity.npz (README there, "Sampler parity data") holds greedy
runs of the official ``diffusion_generate`` on the tiny Dream checkpoint: outputs and per-step
histories for shapes a/b/c × {entropy, maskgit_plus, topk_margin}, a left-padded run p,
``confidence_threshold`` (t) and the block / KV-cache sampler (k, prefix and dual cache). Where a
row has fewer masked positions than the step's k (``first_tie_step``) torch writes the mask id
over arbitrary positions; from there only the other rows are compared, and the short rows must
differ from the official ones only where torch wrote such a mask id. The schedule, ``origin`` and
``alg_temp`` are checked on synthetic logits (no model).
"""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dllm_rl.models import hf
from dllm_rl.sampling import dream
from dllm_rl.sampling.dream_ops import (ALGS, DreamSamplerConfig, choose, filter_logits, propose,
                                        transfer_fractions)

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                       "dream_tiny")
MASK = 156


@pytest.fixture(scope="module")
def checkpoint():
  _, _, graphdef, params, _ = hf.load_checkpoint(FIXTURE)
  return graphdef, params, np.load(os.path.join(FIXTURE, "sampler_parity.npz"))


def _official(checkpoint, name, **overrides):
  """(our DreamOutput, the official kwargs) for the run ``name`` of the fixture."""
  graphdef, params, data = checkpoint
  kwargs = json.loads(str(data[f"{name}_kwargs"]))
  kwargs.pop("return_dict_in_generate", None)
  kwargs.update(overrides)
  prompt = data[f"{name[0]}_prompt"]
  if kwargs.get("dual_cache"):
    prompt = prompt[:1]  # the official dual cache runs batch 1 (row 0)
  mask = data["p_attention_mask"] if name[0] == "p" else None
  with jax.default_matmul_precision("highest"):
    out = dream.dream_generate(graphdef, params, prompt, attention_mask_BP=mask, **kwargs)
  return jax.tree.map(np.asarray, out), kwargs


def _k(prev_BN, frac):
  """The official k from the tokens before a step (float32 batch mean × fraction)."""
  mean = np.float32((prev_BN == MASK).sum()) / np.float32(prev_BN.shape[0])
  return int(mean * frac)


PLAIN = [f"{c}_{a}" for c in "abc" for a in ("entropy", "maskgit_plus", "topk_margin")]


@pytest.mark.parametrize("name", PLAIN + ["p_entropy"])
def test_plain_sampler_reproduces_the_official_history(checkpoint, name):
  data = checkpoint[2]
  out, _ = _official(checkpoint, name)
  got_SBN, want_SBN = out.history_SBN, data[f"{name}_history"]
  tie = int(data[f"{name}_first_tie_step"])
  assert got_SBN.shape == want_SBN.shape
  np.testing.assert_array_equal(out.sequences_BN, got_SBN[-1])
  if tie < 0:
    np.testing.assert_array_equal(got_SBN, want_SBN)
    np.testing.assert_array_equal(out.sequences_BN, data[f"{name}_output"])
    return
  # Here the tie happens at the last step only (README): earlier steps are compared whole.
  assert tie == want_SBN.shape[0] - 1
  np.testing.assert_array_equal(got_SBN[:tie], want_SBN[:tie])
  prev_BN = want_SBN[tie - 1]
  k = _k(prev_BN, np.float32(1.0))
  full_B = (prev_BN == MASK).sum(1) >= k
  assert 0 < full_B.sum() < full_B.size
  np.testing.assert_array_equal(got_SBN[tie][full_B], want_SBN[tie][full_B])
  # Short rows: unmask all their masks; torch's extra mask ids land on decoded positions.
  diff_BN = got_SBN[tie] != want_SBN[tie]
  torch_extra_BN = (want_SBN[tie] == MASK) & (prev_BN != MASK)
  assert not np.any(diff_BN & ~torch_extra_BN)
  assert np.all((got_SBN[tie] == MASK) <= (prev_BN == MASK))


def test_padded_rows_generate_what_the_prompt_alone_does(checkpoint):
  graphdef, params, data = checkpoint
  padded, kwargs = _official(checkpoint, "p_entropy")
  kwargs.pop("output_history")
  valid = data["p_attention_mask"][1].astype(bool)
  with jax.default_matmul_precision("highest"):
    alone = dream.dream_generate(graphdef, params, data["p_prompt"][1:2, valid], **kwargs)
  np.testing.assert_array_equal(np.asarray(alone.sequences_BN)[0],
                                padded.sequences_BN[1][np.concatenate([valid, [True] * 24])])


def test_whole_row_decisions_match_and_decode_prompt_mask_ids(checkpoint):
  """Without mask ids in the prompt the front decides on the completion rows only; the whole-row
  path (the official one, taken when the prompt holds mask ids) gives the same tokens, and with
  a mask id in the prompt it decodes that position too and leaves the rest of the prompt."""
  graphdef, params, data = checkpoint
  prompt_BP = jnp.asarray(data["c_prompt"], jnp.int32)
  cfg = DreamSamplerConfig(max_new_tokens=16, mask_id=MASK, steps=8, alg="entropy")
  whole_row = functools.partial(dream.sample, graphdef, cfg=cfg, prompt_has_masks=True)
  run = jax.jit(lambda params, prompt_BP: whole_row(params, prompt_BP, jnp.ones(prompt_BP.shape,
                                                                                bool),
                                                    jax.random.key(0)))
  with jax.default_matmul_precision("highest"):
    whole = run(params, prompt_BP)
    masked = run(params, prompt_BP.at[:, 3].set(MASK))
  np.testing.assert_array_equal(whole.sequences_BN, data["c_entropy_output"])
  assert not jnp.any(masked.sequences_BN[:, 3] == MASK)
  np.testing.assert_array_equal(np.delete(np.asarray(masked.sequences_BN[:, :16]), 3, axis=1),
                                np.delete(data["c_prompt"], 3, axis=1))


def test_confidence_threshold_reproduces_the_official_history(checkpoint):
  data = checkpoint[2]
  out, _ = _official(checkpoint, "t_confidence_threshold")
  want_SBN = data["t_confidence_threshold_history"]  # 16 forwards for 8 scheduled steps
  s = want_SBN.shape[0]
  np.testing.assert_array_equal(out.sequences_BN, data["t_confidence_threshold_output"])
  np.testing.assert_array_equal(out.history_SBN[:s], want_SBN)
  assert np.all(out.history_SBN[s:] == MASK)  # no further forward ran


def test_confidence_threshold_runs_without_history(checkpoint):
  """``output_history=False`` (the default, and every ``load_pretrained(...).generate``):
  the same tokens; writing into the empty history buffer once raised an IndexError."""
  data = checkpoint[2]
  out, _ = _official(checkpoint, "t_confidence_threshold", output_history=False)
  assert out.history_SBN is None
  np.testing.assert_array_equal(out.sequences_BN, data["t_confidence_threshold_output"])


@pytest.mark.parametrize("name", ["k_prefix_entropy", "k_dual_entropy"])
def test_block_sampler_reproduces_the_official_output(checkpoint, name):
  data = checkpoint[2]
  out, _ = _official(checkpoint, name, output_history=True)
  np.testing.assert_array_equal(out.sequences_BN, data[f"{name}_output"])
  # Schedule (block 8, 4 steps a block): 1 at the block start, then 2, 2, 3 (README).
  b, p = out.sequences_BN.shape[0], data["k_prompt"].shape[1]
  masks_S = (out.history_SBN[:, :, p:] == MASK).sum(axis=(1, 2)) // b
  unmasked_S = -np.diff(np.concatenate([[32], masks_S]))
  np.testing.assert_array_equal(unmasked_S, [1, 2, 2, 3] * 4)
  h_SBN = out.history_SBN  # a decoded token never changes, and only its block is touched
  decoded_SBN = h_SBN[:-1] != MASK
  assert np.all(h_SBN[1:][decoded_SBN] == h_SBN[:-1][decoded_SBN])
  for s in range(1, h_SBN.shape[0]):
    outside_N = np.ones(h_SBN.shape[2], bool)
    outside_N[p + 8 * (s // 4): p + 8 * (s // 4 + 1)] = False
    np.testing.assert_array_equal(h_SBN[s][:, outside_N], h_SBN[s - 1][:, outside_N])


def test_block_sampler_scores_by_entropy_whatever_alg_is(checkpoint):
  """README, "Block sampler": the cached steps rank by entropy whatever ``alg`` names, so
  ``maskgit_plus`` gives the official entropy run."""
  out, _ = _official(checkpoint, "k_prefix_entropy", alg="maskgit_plus")
  np.testing.assert_array_equal(out.sequences_BN, checkpoint[2]["k_prefix_entropy_output"])


@pytest.mark.parametrize("dual,threshold", [(True, 1.1), (True, 0.0), (False, 1.1)])
def test_block_confidence_threshold_takes_one_or_all_per_step(checkpoint, dual, threshold):
  """Block + ``confidence_threshold`` (no official run in the fixture): a threshold above every
  probability takes the single most probable position per cached step (16 masks: 15 … 0 left,
  then unused history entries); threshold 0 takes the whole block in one cached step."""
  graphdef, params, data = checkpoint
  with jax.default_matmul_precision("highest"):
    out = dream.dream_generate(graphdef, params, data["k_prompt"][:1], mask_token_id=MASK,
                               max_new_tokens=16, steps=2, block_length=8, dual_cache=dual,
                               alg="confidence_threshold", threshold=threshold,
                               output_history=True)
  left_S = (np.asarray(out.history_SBN)[:, 0, 10:] == MASK).sum(-1)
  want = list(range(15, -1, -1)) if threshold > 1 else [15, 8, 7, 0]
  np.testing.assert_array_equal(left_S, want + [16] * (18 - len(want)))
  assert not np.any(out.sequences_BN == MASK)


# --- schedule, origin and alg_temp on synthetic logits ----------------------------------------


def _synthetic(cfg, b, p, key=0):
  """The plain sampler on fixed random logits that never propose the mask id; jitted once."""
  v = 40
  logits_BNV = jax.random.normal(jax.random.key(key), (b, p + cfg.max_new_tokens, v))
  logits_BNV = logits_BNV.at[..., cfg.mask_id].set(-1e9)
  prompt_BP = jax.random.randint(jax.random.key(1), (b, p), 0, 30)
  x_BN, _, _ = dream.initial_sequence(prompt_BP, jnp.ones((b, p), bool),
                                      max_new_tokens=cfg.max_new_tokens, mask_id=cfg.mask_id)
  run = jax.jit(lambda logits, x, k: dream.denoise(lambda _: logits, x, k, cfg=cfg))
  return functools.partial(run, logits_BNV), x_BN  # an argument: no constant folding


def _unmasked_per_step(x_BN, history_SBN, mask_id):
  masks_S = (np.concatenate([np.asarray(x_BN)[None], np.asarray(history_SBN)]) == mask_id)
  return -np.diff(masks_S.sum(axis=(1, 2)) // x_BN.shape[0])


@pytest.mark.parametrize("masks,steps,want", [
    (32, 32, [0] + [1] * 30 + [2]), (48, 16, [2] + [3] * 14 + [4]),
    (16, 8, [1] + [2] * 6 + [3]), (24, 12, [1] + [2] * 10 + [3])])
def test_schedule_matches_the_official_counts(masks, steps, want):
  cfg = DreamSamplerConfig(max_new_tokens=masks, mask_id=39, steps=steps, alg="entropy",
                           output_history=True)
  run, x_BN = _synthetic(cfg, b=2, p=3)
  out = run(x_BN, jax.random.key(0))
  np.testing.assert_array_equal(_unmasked_per_step(x_BN, out.history_SBN, 39), want)


def test_k_is_the_batch_mean_and_short_rows_touch_nothing_else():
  """Row 0 has 2 mask ids in its prompt (they count and are decoded), row 1 none: one step,
  k = int(mean(6, 4)) = 5. Row 1 has only 4: they are all unmasked and its prompt is intact."""
  cfg = DreamSamplerConfig(max_new_tokens=4, mask_id=39, steps=1, alg="maskgit_plus")
  prompt_BP = jnp.array([[5, 39, 39], [5, 6, 7]])
  x_BN, _, _ = dream.initial_sequence(prompt_BP, jnp.ones((2, 3), bool), max_new_tokens=4,
                                      mask_id=39)
  logits_BNV = jax.nn.one_hot(jnp.arange(7)[None] % 3 + 10, 40) * 5.0  # confident, never mask
  out = dream.denoise(lambda _: jnp.broadcast_to(logits_BNV, (2, 7, 40)), x_BN,
                      jax.random.key(0), cfg=cfg)
  assert int(jnp.sum(out.sequences_BN[0] == 39)) == 1
  np.testing.assert_array_equal(out.sequences_BN[1, :3], [5, 6, 7])
  assert not jnp.any(out.sequences_BN[1] == 39)


def test_transfer_fractions_are_one_minus_s_over_t_and_one_at_the_end():
  frac = transfer_fractions(32, 1e-3)
  assert frac.dtype == np.float32 and frac[-1] == 1.0
  ts = np.linspace(1.0, 1e-3, 33)
  np.testing.assert_allclose(frac[:-1], 1 - ts[1:-1] / ts[:-2], rtol=1e-5)


def test_confidence_measures_and_filters():
  logits = jnp.log(jnp.array([[[0.5, 0.3, 0.2, 0.0 + 1e-30]]], jnp.float32))
  probs = jax.nn.softmax(logits, -1)
  x0 = jnp.argmax(probs, -1)
  np.testing.assert_allclose(ALGS.get("maskgit_plus")(probs, x0), [[0.5]], rtol=1e-6)
  np.testing.assert_allclose(ALGS.get("topk_margin")(probs, x0), [[0.2]], rtol=1e-5)
  p = np.array([0.5, 0.3, 0.2, 1e-30])
  np.testing.assert_allclose(ALGS.get("entropy")(probs, x0), [[np.sum(p * np.log(p + 1e-10))]],
                             rtol=1e-6)
  low = jnp.finfo(jnp.float32).min
  kept_k = filter_logits(logits, temperature=0.0, top_p=None, top_k=2) > low
  np.testing.assert_array_equal(kept_k[0, 0], [True, True, False, False])
  kept_p = filter_logits(logits, temperature=0.0, top_p=0.6, top_k=None) > low
  np.testing.assert_array_equal(kept_p[0, 0], [True, True, False, False])  # 0.5 < 0.6: keep 2nd


def test_temperature_samples_tokens_from_the_filtered_softmax():
  """T > 0: x0 ~ softmax(logits / T) over the top-k tokens; the confidence is x0's probability."""
  logits = jnp.log(jnp.array([[[0.4, 0.3, 0.2, 0.1]]]))
  keys = jax.random.split(jax.random.key(0), 4000)
  x0, probs = jax.vmap(lambda k: propose(logits, k, temperature=0.5, top_p=None, top_k=3))(keys)
  want = np.array([0.4, 0.3, 0.2, 0.0]) ** 2
  np.testing.assert_allclose(np.asarray(probs[0, 0, 0]), want / want.sum(), rtol=1e-5)
  freq = np.bincount(np.asarray(x0[:, 0, 0]), minlength=4) / len(keys)
  np.testing.assert_allclose(freq, want / want.sum(), atol=0.03)


def test_origin_unmasks_each_position_with_probability_one_minus_s_over_t():
  cfg = DreamSamplerConfig(max_new_tokens=64, mask_id=39, steps=4, alg="origin",
                           output_history=True)
  run, x_BN = _synthetic(cfg, b=64, p=2)
  out = run(x_BN, jax.random.key(3))
  hist = np.asarray(out.history_SBN)
  assert not np.any(out.sequences_BN == 39)  # everything at the last step
  assert np.all((hist[1:] == 39) <= (hist[:-1] == 39))  # never re-masked
  frac = transfer_fractions(4, 1e-3)
  masks = np.concatenate([[64 * 64], (hist[:-1, :, 2:] == 39).sum(axis=(1, 2))])
  done = -np.diff(np.concatenate([masks, [0]]))
  for s in range(3):  # binomial(masks, frac) within 5 standard deviations
    mean, sd = masks[s] * frac[s], np.sqrt(masks[s] * frac[s] * (1 - frac[s]))
    assert abs(done[s] - mean) < 5 * sd + 1, (s, done[s], mean)
  again = run(x_BN, jax.random.key(3))
  other = run(x_BN, jax.random.key(4))
  np.testing.assert_array_equal(again.sequences_BN, out.sequences_BN)
  assert not np.array_equal(np.asarray(other.history_SBN[0]), hist[0])


def test_alg_temp_samples_positions_from_softmax_of_confidence():
  conf_BL = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05, 0.7]]))
  open_BL = jnp.array([[True, True, True, True, False]])  # the closed one is never chosen
  keys = jax.random.split(jax.random.key(0), 4000)
  pick1 = jax.vmap(lambda k: choose(conf_BL, open_BL, 1, k, 1.0))(keys)[:, 0]
  freq = np.asarray(pick1.mean(0))
  np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05, 0.0], atol=0.03)
  pick3 = jax.vmap(lambda k: choose(conf_BL, open_BL, 3, k, 1.0))(keys)[:, 0]
  assert np.all(pick3.sum(-1) == 3) and not np.any(pick3[:, 4])  # without replacement
  greedy = choose(conf_BL, open_BL, 2, keys[0], None)
  np.testing.assert_array_equal(greedy[0], [True, True, False, False, False])


@pytest.mark.parametrize("kwargs,match", [
    ({"alg": "nope"}, "unknown Dream alg"),
    ({"block_length": 4, "dual_cache": True, "batch": 2}, "batch 1 only"),
    ({"block_length": 4, "padded": True}, "padded attention_mask"),
    ({"dual_cache": True}, "needs block_length"),
    ({"alg": "confidence_threshold", "batch": 2}, "batch 1"),
    ({"alg": "confidence_threshold", "block_length": 4, "batch": 2}, "batch 1"),
    ({"alg": "confidence_threshold", "steps": 3}, "divisible by steps"),
    ({"block_length": 5}, "divisible by block_length")])
def test_unsupported_combinations_fail_fast(kwargs, match):
  kwargs = dict(kwargs)
  batch, padded = kwargs.pop("batch", 1), kwargs.pop("padded", False)
  cfg = DreamSamplerConfig(**{"max_new_tokens": 16, "mask_id": MASK, "steps": 8, **kwargs})
  with pytest.raises(ValueError, match=match):
    dream.validate(cfg, batch=batch, padded=padded)


def test_only_left_padding_is_accepted():
  with pytest.raises(ValueError, match="left padding"):
    dream.dream_generate(None, None, np.zeros((1, 3), int), attention_mask_BP=[[1, 0, 1]],
                         mask_token_id=MASK, max_new_tokens=4)
