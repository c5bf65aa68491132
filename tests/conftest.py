"""Test set-up: 8 simulated CPU devices (set before JAX is imported)."""

import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402  (after XLA_FLAGS)

from tests.fake_gcs import fake_gcs  # noqa: E402,F401  (fixture: an in-memory gs:// store)

_SLOW_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow_tests.txt")


def _measured_slow() -> set[str]:
  with open(_SLOW_LIST) as fh:
    return {line.strip() for line in fh if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(config, items):
  """Mark the measured slow tests (tests/slow_tests.txt) ``slow``."""
  slow = _measured_slow()
  for item in items:
    if item.nodeid in slow:
      item.add_marker(pytest.mark.slow)
