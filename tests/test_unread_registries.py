"""The registries against dllm_rl.config.unread (README "Adding a component"): a registered
loss, advantage or estimator whose code reads an option must not be told that the option is
"not read" (the rules list components by name, so a new one is left out until it is added to
them), and the estimators that read ``estimator.reduction`` are ``estimators.REDUCIBLE``.

Which options a component reads is taken from the attribute names its own functions use
(``cfg.eps`` → ``eps``): a read inside a helper it calls is not seen, so the check catches a
component left out of a rule, never one wrongly put in."""

import dataclasses
import itertools

import pytest

from dllm_rl.config.defaults import get_config
from dllm_rl.config.unread import RULES, is_read
from dllm_rl.diffusion.estimators import ESTIMATORS, REDUCIBLE, EstimatorConfig
from dllm_rl.rl.advantages import ADVANTAGES, AdvantageConfig
from dllm_rl.rl.losses import CLIP_MODES, LOSSES, LossConfig

RULE_KEYS = {key for key, _, _ in RULES}
# The LossConfig fields that dllm_rl.train.rl_loop.step_config fills from another key than
# rl.<field>
LOSS_KEYS = {"spg_omega": "estimator.spg_omega"}


def _options_read(fns, options_cls) -> set[str]:
  """The fields of ``options_cls`` that the code of ``fns`` names."""
  named = set().union(*(fn.__code__.co_names for fn in fns))
  return named & {f.name for f in dataclasses.fields(options_cls)}


def _configs(key: str, name: str):
  """RL configs that select ``name`` at ``key``, across the choices other rules depend on
  (estimator, loss, stabledrl's clip mode, a block-diffusion model)."""
  for est, loss, clip, block in itertools.product(ESTIMATORS.names(), LOSSES.names(),
                                                  CLIP_MODES, (0, 4)):
    c = get_config()
    c.unlock()
    c.mode = "rl"
    c.estimator.name, c.rl.loss, c.rl.clip, c.model.block_size = est, loss, clip, block
    section, field = key.split(".")
    c[section][field] = name
    yield c


def _components():
  for name in LOSSES.names():
    fields = _options_read([LOSSES.get(name)], LossConfig)
    yield "rl.loss", name, {LOSS_KEYS.get(f, f"rl.{f}") for f in fields}
  for name in ADVANTAGES.names():
    fields = _options_read([ADVANTAGES.get(name)], AdvantageConfig)
    yield "rl.advantage", name, {f"rl.{f}" for f in fields}
  for name in ESTIMATORS.names():
    est = ESTIMATORS.get(name)
    fields = _options_read([est.draw, est.forward, est.reduce], EstimatorConfig)
    yield "estimator.name", name, {f"estimator.{f}" for f in fields}


COMPONENTS = list(_components())


@pytest.mark.parametrize("key, name, reads", COMPONENTS,
                         ids=[f"{key}={name}" for key, name, _ in COMPONENTS])
def test_no_registered_component_is_told_an_option_it_reads_is_not_read(key, name, reads):
  wrong = sorted(k for k in reads & RULE_KEYS
                 if not any(is_read(c, k) for c in _configs(key, name)))
  assert not wrong, (f"{key}={name} reads {wrong}, but the rules of dllm_rl/config/unread.py"
                     " say no config of it does (add it to each rule's names)")


def test_the_reducible_estimators_are_those_that_read_estimator_reduction():
  for name in ESTIMATORS.names():
    c = next(_configs("estimator.name", name))
    read = is_read(c, "estimator.reduction")
    assert read == (name in REDUCIBLE), (
        f"estimator.name={name}: the estimator.reduction rule of dllm_rl/config/unread.py says"
        f" it is{'' if read else ' not'} read, and REDUCIBLE (dllm_rl/diffusion/estimators.py,"
        f" which validation reads) does{' not' if read else ''} hold {name!r}")


def test_an_out_of_tree_component_is_judged_as_any_of_dllm_rls_own(monkeypatch):
  """A loss registered outside dllm_rl (README "Out-of-tree components") is in no rule: a key
  some built-in loss reads (rl.eps) is not said to be unread, a key that no choice of loss
  makes read (rl.beta, read by one advantage only) still is, and a built-in loss is judged
  as before."""
  from dllm_rl.config.unread import unread_settings
  monkeypatch.setitem(LOSSES._items, "my_loss", LOSSES.get("grpo"))
  monkeypatch.setitem(LOSSES._modules, "my_loss", "my_algo")
  c = get_config()
  c.unlock()
  c.mode, c.rl.loss, c.rl.eps, c.rl.beta, c.rl.clip = "rl", "my_loss", 0.3, 2.0, "symmetric"
  assert [line.split(" is not read")[0] for line in unread_settings(c)] == [
      "config.rl.beta=2.0"]
  assert is_read(c, "rl.eps") and is_read(c, "rl.clip") and not is_read(c, "rl.beta")
  c.rl.loss = "wd1"
  assert [line.split(" is not read")[0] for line in unread_settings(c)] == [
      "config.rl.beta=2.0", "config.rl.clip='symmetric'", "config.rl.eps=0.3"]
