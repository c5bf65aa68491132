"""One process of the real 2-process test in tests/test_distributed.py.

    python tests/multiprocess/psum_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT.json

Initialises ``jax.distributed`` through ``dllm_rl.parallel.distributed.initialize``
in explicit mode, loads only its own rows (``host_rows``) of a fixed global
batch, assembles the global array over every process's devices with
``jax.make_array_from_process_local_data``, runs a jitted reduction over the
mesh (a cross-process all-reduce) and writes what it saw to ``OUT.json``.
The launching test sets ``XLA_FLAGS`` (devices per process) and ``JAX_PLATFORMS``.
"""

from __future__ import annotations

import json
import os
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from dllm_rl.parallel import distributed  # noqa: E402  (after the repo is on sys.path)

GLOBAL_BATCH = 8
FEATURES = 3


def global_batch() -> np.ndarray:
  """The global batch every process agrees on (each loads only its rows)."""
  return np.arange(GLOBAL_BATCH * FEATURES, dtype=np.float32).reshape(GLOBAL_BATCH, FEATURES)


def reduce_fn(x_BF):
  """Per-feature sum of squares and the grand total: the values both processes must agree on."""
  return jnp.sum(x_BF * x_BF, axis=0), jnp.sum(x_BF)


def main(coordinator: str, num_processes: int, process_id: int, out_path: str) -> None:
  # Start from "no CPU collectives" (the default of older JAX, under which a multi-process
  # CPU computation fails): initialize() must select gloo itself.
  try:
    jax.config.update("jax_cpu_collectives_implementation", None)
  except AttributeError:  # the flag is gone in a later JAX: nothing to undo
    pass
  info = distributed.initialize(ml_collections.ConfigDict(dict(
      initialize="explicit", coordinator_address=coordinator, num_processes=num_processes,
      process_id=process_id, local_device_ids="")))

  mesh = Mesh(np.array(jax.devices()), ("data",))  # devices ordered by process
  rows = distributed.host_rows(GLOBAL_BATCH)
  x_BF = jax.make_array_from_process_local_data(
      NamedSharding(mesh, P("data")), global_batch()[rows], (GLOBAL_BATCH, FEATURES))
  replicated = NamedSharding(mesh, P())
  sq_F, total = jax.jit(reduce_fn, out_shardings=(replicated, replicated))(x_BF)
  distributed.sync("psum_worker_done")

  key = distributed.process_key(jax.random.key(0))
  result = dict(
      info, is_primary=distributed.is_primary(), rows=[rows.start, rows.stop],
      sum_sq=np.asarray(sq_F.addressable_data(0)).tolist(),
      total=float(np.asarray(total.addressable_data(0))),
      addressable_shards=len(x_BF.addressable_shards),
      cpu_collectives=getattr(jax.config, "jax_cpu_collectives_implementation", None),
      process_key=np.asarray(jax.random.key_data(key)).tolist())
  with open(out_path, "w") as f:
    json.dump(result, f)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
