"""dllm_rl.train.flops: the analytic model FLOPs equal a count by hand and agree with XLA's cost
analysis of the actual programs at tiny size (unrolled layers, loops of trip count 1, so
XLA counts every operation once); the step and sampler counts compose as documented."""

import dataclasses

import jax
import jax.numpy as jnp
import optax
import pytest

from dllm_rl.train import flops
from dllm_rl.config.defaults import get_config
from dllm_rl.models import transformer as T
from dllm_rl.sampling.block_sampler import BlockSamplerConfig
from dllm_rl.sampling.sampler import SamplerConfig

# d=256, 4 query heads, 2 key-value heads of 64, F=768, V=512: matmuls dominate XLA's count
MODEL = T.ModelConfig(vocab_size=512, d_model=256, n_layers=2, n_heads=4, n_kv_heads=2,
                      head_dim=64, mlp_hidden=768)


def _xla_flops(fn, *args) -> float:
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost["flops"])


def test_forward_count_by_hand():
  m = T.ModelConfig(vocab_size=10, d_model=8, n_layers=3, n_heads=2, n_kv_heads=1, head_dim=4,
                    mlp_hidden=12)
  # q 8·2·4 + k 8·1·4 + v 8·1·4 + o 2·4·8 + MLP 3·8·12 = 64 + 32 + 32 + 64 + 288
  assert flops.layer_matmul_params(m) == 480
  attn = 4 * 5 * 5 * 2 * 4  # QKᵀ and PV: 2·N·M·H·Q each, N = M = 5
  per_layer = 2 * 5 * 480 + attn
  assert flops.forward_flops(m, 5) == 3 * per_layer + 2 * 8 * 10 * 5
  # per token: 2 × the non-embedding matmul weights + the attention terms (+ head rows)
  assert flops.forward_flops(m, 5, head_rows=0) == 5 * (2 * 3 * 480) + 3 * attn
  assert flops.forward_flops(m, 5, head_rows=2) == 3 * per_layer + 2 * 8 * 10 * 2
  # 2 rows against 7 keys; a cache write (last layer: key/value projections only, no head)
  assert flops.forward_flops(m, 2, keys=7) == 3 * (2 * 2 * 480 + 4 * 2 * 7 * 8) + 2 * 8 * 10 * 2
  kv = 2 * 5 * (32 + 32)
  assert flops.forward_flops(m, 5, head_rows=0, last_rows=0) == 2 * per_layer + kv


def test_forward_matches_xla():
  graphdef, params = T.init_model(MODEL, jax.random.key(0))
  b, n = 2, 64
  tokens = jnp.zeros((b, n), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(n), (b, n))
  mask = jnp.ones((b, 1, n), bool)
  xla = _xla_flops(lambda p, t, q, k: T.apply(graphdef, p, t, q, k), params, tokens, positions,
                   mask)
  assert xla == pytest.approx(b * flops.forward_flops(MODEL, n), rel=0.02)
  # the sampler's window: 24 new rows against 64 cache slots, the last layer and head on 8
  cache, valid = T.init_kv_cache(MODEL, b, n), jnp.ones((b, n), bool)
  window = lambda p, t, q, c, v: T.apply_cached_window(graphdef, p, t, q, c, v, 0, write=False,
                                                       start=4, length=8)[0]
  xla = _xla_flops(window, params, tokens[:, :24], positions[:, :24], cache, valid)
  assert xla == pytest.approx(b * flops.forward_flops(MODEL, 24, keys=n, head_rows=8,
                                                      last_rows=8), rel=0.02)
  # a cache write whose logits are discarded: the last layer keeps its key/value projections
  write = lambda p, t, q, c, v: T.apply_cached(graphdef, p, t, q, c, v, 0, write=True)[1]
  xla = _xla_flops(write, params, tokens[:, :24], positions[:, :24], cache, valid)
  assert xla == pytest.approx(b * flops.forward_flops(MODEL, 24, keys=n, head_rows=0,
                                                      last_rows=0), rel=0.02)


def _rl_config(**estimator):
  c = get_config()
  c.unlock()
  c.rl.batch_prompts, c.rl.group_size, c.rl.inner_steps = 2, 2, 1
  c.data.prompt_len, c.data.completion_len = 48, 16
  c.sampler.block_len, c.sampler.steps = 16, 4
  c.estimator.num_samples = 1
  for k, v in estimator.items():
    c.estimator[k] = v
  return c


@pytest.mark.parametrize("antithetic, kl_coef, passes", [(False, 0.0, 1 + 3),
                                                         (True, 0.1, 1 + 1 + 3)])
def test_rl_step_matches_xla(antithetic, kl_coef, passes):
  """μ = K = 1 (loops of one trip): ℓ̂_old once, ℓ̂_ref when kl_coef > 0, one update = 3×."""
  from dllm_rl.rl.step import RolloutBatch, make_rl_step
  from dllm_rl.train.rl_loop import rl_optimizer, step_config
  from dllm_rl.parallel.shard import init_train_state
  c = _rl_config(antithetic=antithetic)
  c.rl.kl_coef = kl_coef
  b, g, p, l = 2, 2, 48, 16
  analytic = flops.rl_step_flops(c, MODEL)
  assert analytic == b * g * passes * flops.forward_flops(MODEL, p + l, head_rows=l)
  graphdef, params = T.init_model(MODEL, jax.random.key(0))
  optimizer, schedule = rl_optimizer(c.rl)
  fn = make_rl_step(graphdef, optimizer, schedule,
                    step_config(c, SamplerConfig.from_config(c), mask_id=3, eos_id=1))
  state = init_train_state(params, optimizer, jax.random.key(1))
  state = state.replace(ref_params=params if kl_coef > 0 else None)
  batch = RolloutBatch(jnp.zeros((b, p), jnp.int32), jnp.ones((b, p), bool),
                       jnp.zeros((b, g, l), jnp.int32), jnp.zeros((b, g, l), jnp.int32),
                       jnp.zeros((b, g)), jnp.zeros((b, g), bool))
  cost = fn.lower(state, batch, jax.random.key(0)).compile().cost_analysis()
  xla = float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])
  assert xla == pytest.approx(analytic, rel=0.04)  # the head runs at the L scored rows only


def test_sft_step_matches_xla():
  from dllm_rl.parallel.shard import init_train_state
  from dllm_rl.train.sft_step import make_sft_step
  from dllm_rl.types import SequenceBatch
  c = _rl_config()
  c.data.batch_size = 4
  b, p, l = 4, 48, 16
  analytic = flops.sft_step_flops(c, MODEL)
  assert analytic == 3 * b * flops.forward_flops(MODEL, p + l, head_rows=l)
  graphdef, params = T.init_model(MODEL, jax.random.key(0))
  optimizer = optax.adamw(1e-3)
  fn = make_sft_step(graphdef, optimizer, optax.constant_schedule(1e-3), mask_id=3, t_eps=1e-3)
  batch = SequenceBatch(jnp.zeros((b, p), jnp.int32), jnp.ones((b, p), bool),
                        jnp.zeros((b, l), jnp.int32), jnp.ones((b, l), bool))
  cost = fn.lower(init_train_state(params, optimizer, jax.random.key(1)), batch,
                  jax.random.key(0)).compile().cost_analysis()
  xla = float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])
  assert xla == pytest.approx(analytic, rel=0.04)


def test_rl_step_pass_counts():
  """K draws per estimate (one for mean_field, K + 1 with full_mask_term), ℓ̂_old once or μ
  times (antithetic), ℓ̂_ref μ times with a KL, μ updates at 3× the estimate; block_elbo on
  P + 2L."""
  c = _rl_config(num_samples=3)
  c.rl.inner_steps = 2
  s, p, l = 4, 48, 16
  fwd = flops.forward_flops(MODEL, p + l, head_rows=l)
  assert flops.rl_step_flops(c, MODEL) == s * 3 * fwd * (1 + 3 * 2)
  c.estimator.antithetic, c.rl.kl_coef = True, 0.05
  assert flops.rl_step_flops(c, MODEL) == s * 3 * fwd * (2 + 2 + 3 * 2)
  c.estimator.full_mask_term = True  # DiffuCoder's fully masked pass: one more forward
  assert flops.rl_step_flops(c, MODEL) == s * 4 * fwd * (2 + 2 + 3 * 2)
  c.estimator.name = "mean_field"
  assert flops.rl_step_flops(c, MODEL) == s * fwd * (2 + 2 + 3 * 2)
  c.estimator.name, c.estimator.antithetic, c.rl.kl_coef = "block_elbo", False, 0.0
  assert flops.rl_step_flops(c, MODEL, prompt_len=32) == (
      s * 3 * flops.forward_flops(MODEL, 32 + 2 * l, head_rows=l) * (1 + 3 * 2))
  c.estimator.name = "nope"
  with pytest.raises(ValueError, match="nope"):
    flops.rl_step_flops(c, MODEL)


def test_sampler_counts():
  """Per step: the full forward (none), the open block against the cache (dual), the open
  block and the masked suffix (prefix); refreshes at block starts and every cache_refresh."""
  p, l, t = 16, 32, 8  # 4 blocks of 8, 2 steps per block
  cfg = SamplerConfig(completion_len=l, steps=8, block_len=t)
  full = flops.forward_flops(MODEL, p + l, head_rows=t, last_rows=t)
  assert flops.sampler_flops(MODEL, cfg, 3, p) == 3 * 8 * full
  assert flops.sampler_flops(MODEL, cfg, 3, p, blocks=2, steps=4) == 3 * 4 * full
  dual = dataclasses.replace(cfg, cache="dual")
  small = flops.forward_flops(MODEL, t, keys=p + l)
  assert flops.sampler_flops(MODEL, dual, 1, p) == 4 * (full + small)
  every = dataclasses.replace(cfg, cache="dual", steps=16, cache_refresh=2)  # 4 steps a block
  assert flops.sampler_flops(MODEL, every, 1, p) == pytest.approx(4 * (2 * full + 2 * small))
  prefix = dataclasses.replace(cfg, cache="prefix")
  suffix = lambda b: flops.forward_flops(MODEL, l - b * t, keys=p + l, head_rows=t, last_rows=t)
  assert flops.sampler_flops(MODEL, prefix, 1, p) == pytest.approx(
      sum(full + suffix(b) for b in range(4)))
  threshold = dataclasses.replace(cfg, threshold=0.9)  # upper bound: block_len steps a block
  assert flops.sampler_flops(MODEL, threshold, 1, p) == 4 * t * full
  block = BlockSamplerConfig(completion_len=l, steps=8, block_len=t)
  step = flops.forward_flops(MODEL, t, keys=p + l)
  write = flops.forward_flops(MODEL, t, keys=p + l, head_rows=0, last_rows=0)
  prefill = flops.forward_flops(MODEL, p, keys=p + l, head_rows=0, last_rows=0)
  assert flops.sampler_flops(MODEL, block, 2, p) == 2 * (prefill + 8 * step + 3 * write)
  assert flops.sampler_flops(MODEL, cfg, 2, p, blocks=0, steps=0) == 0.0


def test_every_registered_estimator_has_a_flop_count():
  """The registry check a new estimator meets (README "Adding a component"): each name in
  ESTIMATORS is counted by estimate_flops, which the run's MFU and the study's sizing read."""
  from dllm_rl.diffusion.estimators import ESTIMATORS
  missing = sorted(set(ESTIMATORS.names()) - set(flops.COUNTED_ESTIMATORS))
  assert not missing, [flops.no_flop_count(name) for name in missing]
  for name in ESTIMATORS.names():
    assert flops.estimate_flops(MODEL, name, 2, 8, 8) > 0, name


def test_a_registered_estimator_without_a_flop_count_is_a_config_error(monkeypatch):
  """Registered but left out of the FLOP count: validation names estimator.name and the file
  to fix, before anything compiles (it was a ValueError after SFT, at the first RL step);
  a mode that scores no estimate (sft) is not stopped."""
  from dllm_rl.config import ConfigError
  from dllm_rl.diffusion.estimators import ESTIMATORS
  from dllm_rl.train.validate import validate
  monkeypatch.setitem(ESTIMATORS._items, "toy_estimator", ESTIMATORS.get("elbo"))
  config = get_config()
  config.estimator.name = "toy_estimator"
  with pytest.raises(ConfigError, match=r"config\.estimator\.name: estimator 'toy_estimator'"
                     r" has no FLOP count .* dllm_rl/train/flops\.py"):
    validate(config)
  config.mode = "sft"
  validate(config)
  with pytest.raises(ValueError, match="has no FLOP count"):
    flops.estimate_flops(MODEL, "toy_estimator", 1, 8, 8)


def test_an_out_of_tree_estimator_counts_with_its_registered_flop_count(monkeypatch):
  """An estimator registered outside dllm_rl (README "Out-of-tree components") cannot be added
  to COUNTED_ESTIMATORS without editing dllm_rl: its module registers its count in
  FLOP_COUNTS, which validation and estimate_flops read; without one, the error says so."""
  from dllm_rl.config import ConfigError
  from dllm_rl.diffusion.estimators import ESTIMATORS
  from dllm_rl.train.validate import validate
  monkeypatch.setitem(ESTIMATORS._items, "toy_estimator", ESTIMATORS.get("elbo"))
  config = get_config()
  config.estimator.name = "toy_estimator"
  with pytest.raises(ConfigError, match=r"FLOP_COUNTS\.register\('toy_estimator'\)"):
    validate(config)
  monkeypatch.setitem(flops.FLOP_COUNTS._items, "toy_estimator",
                      lambda m, k, p, l, block: k * flops.forward_flops(m, p + l, head_rows=l))
  validate(config)
  assert flops.estimate_flops(MODEL, "toy_estimator", 2, 8, 8) == flops.estimate_flops(
      MODEL, "elbo", 2, 8, 8)
