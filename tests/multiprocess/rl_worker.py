"""One process of the real 2-process RL test (tests/parallel/test_multiprocess_rl.py).

    python tests/multiprocess/rl_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT.npz

Initialises jax.distributed (explicit mode), builds a data × fsdp = 2 × 2 mesh
over both processes' devices, initialises a tiny model sharded on it, and runs
two RL steps (StableDRL, StepRS advantages, ELBO, μ = 2) on a fixed rollout
batch, with the RL loop's optimizer and its lr and β passed as a replicated input
(``StepHyper``). Writes the losses and the final parameters (gathered) to OUT.npz.
"""

from __future__ import annotations

import os
import sys
import types

import jax
import ml_collections
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from dllm_rl.diffusion.estimators import EstimatorConfig  # noqa: E402
from dllm_rl.models import transformer as T  # noqa: E402
from dllm_rl.parallel import distributed, shard  # noqa: E402
from dllm_rl.parallel.mesh import make_mesh  # noqa: E402
from dllm_rl.rl.step import RolloutBatch, StepHyper, make_rl_step  # noqa: E402
from dllm_rl.train.optim import make_optimizer  # noqa: E402
from tests.helpers import rl_step_config, tiny_model  # noqa: E402

CFG = tiny_model(vocab_size=16, n_layers=2, n_heads=4)
STEP = rl_step_config("stabledrl", "steprs", "elbo", EstimatorConfig(num_samples=2),
                      inner_steps=2, num_states=3)


def rollout_batch() -> RolloutBatch:
  """The fixed global rollout batch every process holds (numpy)."""
  rng = np.random.default_rng(0)
  rewards = rng.integers(0, 2, (8, 2)).astype(np.float32)
  return RolloutBatch(rng.integers(3, 16, (8, 4)).astype(np.int32), np.ones((8, 4), bool),
                      rng.integers(3, 16, (8, 2, 6)).astype(np.int32),
                      np.broadcast_to(np.arange(6) % 3, (8, 2, 6)).astype(np.int32),
                      rewards, rewards > 0)


def two_rl_steps(mesh):
  """Losses of two RL steps and the final parameters (as host numpy, flattened)."""
  opt, schedule = make_optimizer(types.SimpleNamespace(
      lr=1e-2, steps=4, warmup_steps=0, schedule="constant", b1=0.9, b2=0.999,
      weight_decay=1e-4, grad_clip=0.0))
  graphdef, params = T.init_params_sharded(CFG, jax.random.key(0), mesh)
  state, sharding = shard.init_state_sharded(params, opt, jax.random.key(1), mesh)
  step = make_rl_step(graphdef, opt, schedule, STEP, mesh=mesh, state_sharding=sharding)
  batch = shard.put_global(mesh, rollout_batch())
  hyper = shard.put_replicated(mesh, StepHyper.of(1e-2, STEP.advantage_cfg))
  losses = []
  for i in range(2):
    state, metrics = step(state, batch, jax.random.key(10 + i), hyper)
    losses.append(float(metrics["loss"]))
  gathered = jax.jit(lambda p: p, out_shardings=shard.replicated(mesh))(state.params)
  leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(gathered)]
  return np.asarray(losses), leaves


def main(coordinator: str, num_processes: int, process_id: int, out_path: str) -> None:
  distributed.initialize(ml_collections.ConfigDict(dict(
      initialize="explicit", coordinator_address=coordinator, num_processes=num_processes,
      process_id=process_id, local_device_ids="")))
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 1})
  losses, leaves = two_rl_steps(mesh)
  distributed.sync("rl_worker_done")
  np.savez(out_path, losses=losses, process_count=jax.process_count(),
           global_devices=jax.device_count(), **{f"p{i}": x for i, x in enumerate(leaves)})


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
