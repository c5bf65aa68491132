"""Shardings for parameters, optimizer state, train state and batches; sharded init.

Parameters never exist unsharded: ``models.transformer.init_params_sharded``
builds the abstract model (``eval_shape``), maps each parameter's logical axes
through :data:`~dllm_rl.parallel.rules.LOGICAL_RULES` (:func:`param_shardings`),
and runs the initialiser under ``jit`` with those output shardings, so every
device materialises only its shard.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dllm_rl.parallel.rules import batch_axes, logical_to_spec
from dllm_rl.types import TrainState


def _is_var(x) -> bool:
  return isinstance(x, nnx.Variable)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def param_shardings(abstract_params: nnx.State, mesh: Mesh) -> nnx.State:
  """NamedSharding per parameter from its ``logical_axes`` (same tree as the params)."""

  def one(var: nnx.Variable):
    shape = jax.tree_util.tree_leaves(var)[0].shape  # concrete or ShapeDtypeStruct
    axes = var.get_metadata().get("logical_axes")
    if axes is None:
      raise ValueError(f"parameter of shape {shape} has no logical_axes metadata")
    return var.replace(NamedSharding(mesh, logical_to_spec(axes, shape, mesh)))

  return jax.tree.map(one, abstract_params, is_leaf=_is_var)


def state_shardings(abstract_state: TrainState, optimizer: optax.GradientTransformation,
                    mesh: Mesh) -> TrainState:
  """Shardings for a whole TrainState: optimizer moments follow their parameters (none for
  the parameters a masked optimizer skips, e.g. a LoRA run's frozen base), counters and the
  RNG key are replicated."""
  p_sh = param_shardings(abstract_state.params, mesh)
  rep = replicated(mesh)
  masked = lambda x: isinstance(x, optax.MaskedNode)  # a parameter a masked optimizer skips
  opt_sh = optax.tree_map_params(optimizer, lambda v, s: v if masked(v) else s,
                                 abstract_state.opt_state, p_sh,
                                 transform_non_params=lambda _: rep,
                                 is_leaf=lambda x: _is_var(x) or masked(x))
  ref_sh = None if abstract_state.ref_params is None else p_sh
  return TrainState(step=rep, params=p_sh, opt_state=opt_sh, rng=rep, ref_params=ref_sh)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """Leading (batch) dimension over ('data', 'fsdp'[, 'expert']), the rest replicated."""
  return NamedSharding(mesh, PartitionSpec(batch_axes(mesh), *([None] * (ndim - 1))))


def batch_shardings(mesh: Mesh, batch: Any) -> Any:
  """Batch sharding for every array leaf of a batch pytree."""
  return jax.tree.map(lambda a: batch_sharding(mesh, np.ndim(a)), batch)


def _put(tree: Any, sharding_of) -> Any:
  """Host values every process holds in full → global arrays with ``sharding_of(ndim)``."""

  def one(a):
    a = np.asarray(a)
    return jax.make_array_from_callback(a.shape, sharding_of(a.ndim), lambda idx: a[idx])

  return jax.tree.map(one, tree)


def put_global(mesh: Mesh, batch: Any) -> Any:
  """Arrays every process holds in full (e.g. rewards computed on every host) →
  global arrays sharded over the batch axes."""
  return _put(batch, lambda ndim: batch_sharding(mesh, ndim))


def put_replicated(mesh: Mesh, tree: Any) -> Any:
  """Values every process holds (e.g. the step's traced hyperparameters) → global arrays
  replicated on every device of ``mesh``."""
  return _put(tree, lambda ndim: replicated(mesh))


def shard_batch(mesh: Mesh, batch: Any) -> Any:
  """Host-local rows → global arrays sharded over the batch axes.

  Each process passes the rows it loaded (``distributed.host_rows``); in a
  single process that is the whole batch. Right only where each process's devices hold one
  contiguous block of rows in process order — not with a batch-replicating axis (``tensor``)
  across processes: the framework's batches, which every process holds whole, go through
  :func:`put_global` instead.
  """
  return jax.tree.map(
      lambda a: jax.make_array_from_process_local_data(batch_sharding(mesh, np.ndim(a)),
                                                       np.asarray(a)), batch)


def init_train_state(params, optimizer: optax.GradientTransformation, rng: jax.Array) -> TrainState:
  """Step 0, ``params``, the optimizer's initial state and ``rng`` (no reference policy)."""
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(params), rng=rng)


def init_state_sharded(params: nnx.State, optimizer: optax.GradientTransformation, rng: jax.Array,
                       mesh: Mesh, *, ref_params: Any = None):
  """(TrainState placed on its shardings, the state shardings) for sharded params."""
  build, shardings = _state_builder(params, optimizer, rng, mesh, ref_params)
  state = jax.jit(build, out_shardings=shardings)(params, ref_params)
  return state, shardings


def abstract_state_sharded(params: Any, optimizer: optax.GradientTransformation, rng: jax.Array,
                           mesh: Mesh, *, ref_params: Any = None):
  """What :func:`init_state_sharded` gives, as ``jax.ShapeDtypeStruct`` leaves carrying their
  shardings (nothing allocated; ``params`` may be abstract too): the arguments of an AOT
  ``lower``."""
  build, shardings = _state_builder(params, optimizer, rng, mesh, ref_params)
  abstract = jax.eval_shape(build, params, ref_params)
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract, shardings), shardings


def _state_builder(params, optimizer, rng, mesh, ref_params):
  def build(p, r):
    state = init_train_state(p, optimizer, rng)
    return state.replace(ref_params=r)

  return build, state_shardings(jax.eval_shape(build, params, ref_params), optimizer, mesh)
