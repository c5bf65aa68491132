"""Named registries: duplicate names, unknown names."""

import pytest

from dllm_rl.registry import Registry


def _first(x):
  return x


def _second(x):
  return x


def test_a_duplicate_name_names_both_registrations():
  reg = Registry("policy loss")
  reg.register("mine")(_first)
  with pytest.raises(ValueError, match=r"policy loss 'mine' is already registered \(by "
                     r"tests\.test_registry\._first\): register tests\.test_registry\._second "
                     "under another name"):
    reg.register("mine")(_second)
  assert reg.get("mine") is _first


def test_an_unknown_name_lists_the_names_and_the_closest():
  reg = Registry("advantage")
  reg.register("centered")(_first)
  with pytest.raises(KeyError, match=r"unknown advantage 'centred'; available: centered\. "
                     r"Did you mean 'centered'\?"):
    reg.get("centred")


def test_a_duplicate_instance_is_named_by_its_registry_name_only():
  reg = Registry("likelihood estimator")
  reg.register("elbo")((1, 2))
  with pytest.raises(ValueError, match=r"^likelihood estimator 'elbo' is already registered: "
                     "register this one under another name$"):
    reg.register("elbo")((3, 4))


def test_an_unknown_name_of_a_config_selected_registry_says_how_an_outside_one_is_known():
  """A name close to none (a component whose module the config file did not import) gets the
  hint; a typo of a registered name gets "Did you mean" alone."""
  reg = Registry("policy loss", key="test.loss")
  reg.register("grpo")(_first)
  msg = reg.unknown_message("my_loss")
  assert msg.startswith("unknown policy loss 'my_loss'; available: grpo. A policy loss"
                        " registered outside dllm_rl is known once the module that registers"
                        " it is imported: import it in the config file")
  assert reg.unknown_message("grp") == ("unknown policy loss 'grp'; available: grpo. Did you"
                                        " mean 'grpo'?")
  assert "outside" not in Registry("testbed").unknown_message("nope")


def test_the_registering_module_is_recorded():
  from dllm_rl.registry import SELECTED_BY
  from dllm_rl.rl.losses import LOSSES
  reg = Registry("policy loss", key="test.loss")
  reg.register("mine")(_first)
  assert reg.module("mine") == __name__ and not reg.in_tree("mine")
  assert LOSSES.module("grpo") == "dllm_rl.rl.losses" and LOSSES.in_tree("grpo")
  assert SELECTED_BY["rl.loss"] is LOSSES
