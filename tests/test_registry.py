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
