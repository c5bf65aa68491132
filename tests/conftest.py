"""Test set-up: 8 simulated CPU devices (set before JAX is imported)."""

import os
import sys

# The tests' programs are tiny and run for milliseconds, so nearly all of the suite's time is
# XLA's CPU compiles: LLVM optimisation level 0 without its expensive passes compiles them
# about a quarter faster (one RL step's test: 47.9 s → 35.6 s). Tests only; a user's run keeps
# XLA's defaults.
#
# XLA's newer MLIR fusion emitters compile the suite's programs 2-3x slower than the loop
# emitters they replace (tests/sampling/test_cache.py + tests/models/test_logprob.py: 184 s →
# 75 s, backend compile 145 s → 48 s; 2-core Xeon, jax 0.10.2), so the tests turn them off.
# A flag XLA does not know aborts the process, so each such flag is added only when the
# installed jaxlib registers it (its name is in jaxlib's shared libraries).
_SPEED_FLAGS = ("--xla_cpu_use_fusion_emitters=false",)


def _known_xla_flags(flags):
  import glob
  import importlib.util
  import mmap

  spec = importlib.util.find_spec("jaxlib")
  libs = glob.glob(os.path.join(os.path.dirname(spec.origin), "*.so")) if spec else []
  found = set()
  for lib in libs:
    with open(lib, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
      found |= {f for f in flags if m.find(f[2:].split("=")[0].encode() + b"\0") >= 0}
  return [f for f in flags if f in found]


os.environ["XLA_FLAGS"] = (
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
    + " ".join(_known_xla_flags(_SPEED_FLAGS)) + " "
    + os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent XLA compilation cache per test run, shared by the xdist workers (they inherit
# this environment from the controller, which imports this file first): many tests compile the
# same programs (a tiny model's initialiser, forward, RL step) from fresh closures, which jit's
# in-memory cache cannot match but the persistent cache (keyed by the program) does. Compiles
# under 0.5 s are not worth a file. A fresh directory per run: nothing stale carries over.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import atexit
  import shutil
  import tempfile

  _cache = tempfile.mkdtemp(prefix="dllm_rl_test_xla_cache_")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
  atexit.register(shutil.rmtree, _cache, True)  # the process that made it removes it

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402  (after XLA_FLAGS)

from tests.fake_gcs import fake_gcs  # noqa: E402,F401  (fixture: an in-memory gs:// store)

_SLOW_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow_tests.txt")


def _measured_slow() -> set[str]:
  with open(_SLOW_LIST) as fh:
    return {line.strip() for line in fh if line.strip() and not line.startswith("#")}


COLLECTED = pytest.StashKey[set]()  # every collected node id, before -m / -k deselection


@pytest.hookimpl(tryfirst=True)  # before the mark plugin deselects
def pytest_collection_modifyitems(config, items):
  """Mark the measured slow tests (tests/slow_tests.txt) ``slow``."""
  config.stash[COLLECTED] = {item.nodeid for item in items}
  slow = _measured_slow()
  for item in items:
    if item.nodeid in slow:
      item.add_marker(pytest.mark.slow)
