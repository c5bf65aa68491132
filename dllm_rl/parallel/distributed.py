"""Multi-process (multi-host) initialisation and host-local helpers.

:func:`initialize` must run first in every process, before any JAX call that
touches devices (``jax.devices()``, a jitted call, an array creation). It reads
``config.distributed``:

* ``initialize``: ``"never"`` (single process, no ``jax.distributed``);
  ``"explicit"`` (``jax.distributed.initialize`` with ``coordinator_address``,
  ``num_processes``, ``process_id``, each taken from the config or, when left at
  its default, from ``DLLM_COORDINATOR_ADDRESS`` / ``DLLM_NUM_PROCESSES`` /
  ``DLLM_PROCESS_ID``); ``"auto"`` (the default: explicit when any of those
  config keys or env vars is set; otherwise ``jax.distributed.initialize()``
  with JAX's own cluster detection on a Cloud TPU VM or TPU pod / multislice
  environment, inside a multi-task SLURM step, or in an Open MPI world of more
  than one rank; otherwise single process).
* ``coordinator_address`` ("" = from env, ``host:port``), ``num_processes``
  (0 = from env), ``process_id`` (-1 = from env), ``local_device_ids``
  ("" = all local devices, else e.g. ``"0"`` or ``"0,1"``).

On a Cloud TPU VM ``"auto"`` always initialises: JAX resolves the slice from
the TPU metadata server, and a single-host VM becomes a one-process run. Under
SLURM JAX makes each process see only GPU ``SLURM_LOCALID`` unless
``local_device_ids`` is set (one process per GPU); ``launch/slurm_gpu.sh``
therefore uses ``"explicit"``, which turns JAX's cluster detection off
(``cluster_detection_method="deactivate"``) so that ``local_device_ids=""`` keeps
every local device, under SLURM too.

CPU multi-process runs need cross-process CPU collectives: with JAX 0.10 they are
gloo (``jax_cpu_collectives_implementation``, already JAX's default); older or
unset configurations are switched to gloo before initialising.

What the config alone shows to be wrong (:func:`config_problems`: a port outside 1..65535, a
``process_id`` outside ``[0, num_processes)``, ...) validation reports with the other config
errors (``dllm_rl.train.validate``); ``initialize`` checks the values it takes from the
environment.

Everything here is a no-op or trivial for a single process, so the same code
runs on a laptop, one GPU and a TPU pod.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Mapping

import jax
import numpy as np

from dllm_rl.errors import ConfigError, raise_all

INITIALIZE_MODES = ("auto", "never", "explicit")
ENV_COORDINATOR = "DLLM_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "DLLM_NUM_PROCESSES"
ENV_PROCESS_ID = "DLLM_PROCESS_ID"

# The variables JAX's SLURM cluster detection reads (all must be present).
_SLURM_STEP_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
                    "SLURM_LOCALID", "SLURM_STEP_NUM_NODES")


@dataclasses.dataclass(frozen=True)
class Plan:
  """What :func:`initialize` will do, decided from the config and environment alone.

  Attributes:
    kind: ``"single"`` (no ``jax.distributed``), ``"explicit"`` (every argument
      given) or ``"cluster"`` (``jax.distributed.initialize`` detects the rest).
    kwargs: keyword arguments for ``jax.distributed.initialize``.
    reason: one line saying why, for the log.
  """

  kind: str
  kwargs: dict
  reason: str


def _get(cfg: Any, key: str, default: Any) -> Any:
  """``cfg.key`` for a ConfigDict / object, ``cfg[key]`` for a mapping, else ``default``."""
  if cfg is None:
    return default
  if isinstance(cfg, Mapping):
    return cfg.get(key, default)
  return getattr(cfg, key, default)


def _env_int(env: Mapping[str, str], var: str, key: str) -> int | None:
  """Integer value of env var ``var`` (None when unset); errors name config key ``key``."""
  raw = env.get(var, "").strip()
  if not raw:
    return None
  try:
    return int(raw)
  except ValueError:
    raise ConfigError(key, f"env var {var}={raw!r} is not an integer") from None


def _count(env: Mapping[str, str], var: str) -> int:
  """An integer env var used for detection; 0 when unset or malformed."""
  try:
    return int(env.get(var, "0").strip() or 0)
  except ValueError:
    return 0


def parse_device_ids(value: Any) -> list[int] | None:
  """``config.distributed.local_device_ids`` ("" = all, "0,1", 3, [0, 1]) as a list or None."""
  if value is None or value == "" or value == []:
    return None
  if isinstance(value, int):
    return [value]
  parts = value.split(",") if isinstance(value, str) else list(value)
  try:
    ids = [int(p) for p in parts]
  except (TypeError, ValueError):
    raise ConfigError("distributed.local_device_ids",
                      f"expected comma-separated integers like '0,1', got {value!r}") from None
  if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
    raise ConfigError("distributed.local_device_ids",
                      f"expected distinct non-negative integers, got {value!r}")
  return ids


def address_problem(address: str) -> str | None:
  """Why ``address`` is no coordinator address ``host:port`` with a port in 1..65535, or None."""
  host, _, port = address.rpartition(":")
  if not host or not (port.isascii() and port.isdigit()):
    return f"expected host:port, got {address!r}"
  if not 1 <= int(port) <= 65535:
    return f"port {int(port)} of {address!r} is not in 1..65535"
  return None


def config_problems(dist_cfg: Any) -> list[ConfigError]:
  """The problems of ``config.distributed`` that the config alone shows (an unknown mode, a
  malformed ``coordinator_address`` or port, a negative process count, a ``process_id`` outside
  ``[0, num_processes)``, malformed ``local_device_ids``): validation reports them with every
  other config error. Values the DLLM_* env vars fill in, and what the cluster says, only
  :func:`plan` (so :func:`initialize`) can check. With ``initialize="never"`` the process
  keys are not read, so not checked."""
  errors: list[ConfigError] = []
  mode = str(_get(dist_cfg, "initialize", "auto"))
  if mode not in INITIALIZE_MODES:
    errors.append(ConfigError("distributed.initialize",
                              f"unknown mode {mode!r}; expected one of {INITIALIZE_MODES}"))
  try:
    parse_device_ids(_get(dist_cfg, "local_device_ids", ""))
  except ConfigError as err:
    errors.append(err)
  if mode == "never":
    return errors
  address = str(_get(dist_cfg, "coordinator_address", "") or "").strip()
  if address and (problem := address_problem(address)):
    errors.append(ConfigError("distributed.coordinator_address", problem))
  num, pid = int(_get(dist_cfg, "num_processes", 0)), int(_get(dist_cfg, "process_id", -1))
  if num < 0:
    errors.append(ConfigError("distributed.num_processes",
                              f"must be >= 1 (0 = from env {ENV_NUM_PROCESSES}), got {num}"))
  if pid < -1 or (num > 0 and pid >= num):
    bound = f"num_processes={num}" if num > 0 else "num_processes"
    errors.append(ConfigError("distributed.process_id", f"must be in [0, {bound}) (-1 = from"
                              f" env {ENV_PROCESS_ID}), got {pid}"))
  return errors


def _explicit_kwargs(cfg: Any, env: Mapping[str, str], mode: str,
                     problems: list[ConfigError]) -> dict:
  """Coordinator, process count and id from the config, falling back to DLLM_* env vars; every
  missing or malformed one reported at once (:func:`raise_all`) with ``problems`` (those
  :func:`config_problems` found in the config, each said once)."""
  errors = list(problems)
  said = lambda key: any(e.key == f"distributed.{key}" for e in problems)
  address = str(_get(cfg, "coordinator_address", "") or "").strip() or env.get(
      ENV_COORDINATOR, "").strip()
  if not address:
    errors.append(ConfigError("distributed.coordinator_address",
                              f"required with initialize={mode!r}: set it (host:port) or the env"
                              f" var {ENV_COORDINATOR}"))
  elif not said("coordinator_address") and (problem := address_problem(address)):
    errors.append(ConfigError("distributed.coordinator_address", problem))

  def from_env(key: str, unset: int, var: str) -> int | None:
    value = int(_get(cfg, key, unset))
    if value != unset:
      return value
    try:
      value = _env_int(env, var, f"distributed.{key}")
    except ConfigError as e:
      errors.append(e)
      return None
    if value is None:
      errors.append(ConfigError(f"distributed.{key}", f"required with initialize={mode!r}: set"
                                f" it or the env var {var}"))
    return value

  num = from_env("num_processes", 0, ENV_NUM_PROCESSES)
  pid = from_env("process_id", -1, ENV_PROCESS_ID)
  if said("num_processes") or said("process_id"):
    pass  # the config's values: in problems already
  elif num is not None and num < 1:
    errors.append(ConfigError("distributed.num_processes",
                              f"must be >= 1 (0 = from env), got {num}"))
  elif num is not None and pid is not None and not 0 <= pid < num:
    errors.append(ConfigError("distributed.process_id",
                              f"must be in [0, num_processes={num}) (-1 = from env), got {pid}"))
  raise_all(errors)
  # "deactivate": every value is given, so JAX's cluster detection could only add one thing,
  # and a wrong one: inside a SLURM step it restricts an unset local_device_ids to GPU
  # $SLURM_LOCALID, so one process per node would use 1 of its GPUs ("" means all of them).
  return dict(coordinator_address=address, num_processes=num, process_id=pid,
              local_device_ids=parse_device_ids(_get(cfg, "local_device_ids", "")),
              cluster_detection_method="deactivate")


def _tpu_hint(env: Mapping[str, str]) -> str | None:
  """Why the environment looks like a multi-host TPU slice or multislice job, or None."""
  for var in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES"):
    hosts = [h for h in env.get(var, "").split(",") if h.strip()]
    if len(hosts) > 1:
      return f"{var} lists {len(hosts)} hosts"
  if env.get("MEGASCALE_COORDINATOR_ADDRESS", "").strip():
    return "MEGASCALE_COORDINATOR_ADDRESS is set (multislice)"
  if _count(env, "MEGASCALE_NUM_SLICES") > 1:
    return f"MEGASCALE_NUM_SLICES={env['MEGASCALE_NUM_SLICES']}"
  return None


def on_cloud_tpu_vm() -> bool:
  """Whether JAX found TPU chips on this host (its own check, made when jax is imported)."""
  try:
    from jax._src import cloud_tpu_init
  except ImportError:
    return False
  return bool(getattr(cloud_tpu_init, "running_in_cloud_tpu_vm", False))


def plan(dist_cfg: Any, env: Mapping[str, str] | None = None,
         cloud_tpu_vm: bool | None = None) -> Plan:
  """Decides single process / explicit / cluster init without touching JAX.

  Args:
    dist_cfg: ``config.distributed`` (ConfigDict, mapping or None = all defaults).
    env: environment variables (default ``os.environ``).
    cloud_tpu_vm: whether this host is a Cloud TPU VM (default: JAX's own check).

  Returns:
    The :class:`Plan`.

  Raises:
    ConfigError: an unknown mode or a missing / malformed value; the message
      starts with the config key, e.g. ``config.distributed.coordinator_address``.
  """
  env = os.environ if env is None else env
  problems = config_problems(dist_cfg)  # validation said them already (dllm_rl.main)
  mode = str(_get(dist_cfg, "initialize", "auto"))
  if mode == "explicit":
    return Plan("explicit", _explicit_kwargs(dist_cfg, env, mode, problems),
                "initialize='explicit'")
  if mode != "auto":  # never, or an unknown mode (one of the problems)
    raise_all(problems)
    return Plan("single", {}, "initialize='never'")

  explicit_keys = [k for k, default in (("coordinator_address", ""), ("num_processes", 0),
                                        ("process_id", -1))
                   if _get(dist_cfg, k, default) != default]
  dllm_vars = [v for v in (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID) if env.get(v)]
  if explicit_keys or dllm_vars:
    why = ", ".join([f"config.distributed.{k}" for k in explicit_keys] + dllm_vars)
    return Plan("explicit", _explicit_kwargs(dist_cfg, env, mode, problems), f"auto: {why} set")
  raise_all(problems)
  local_ids = parse_device_ids(_get(dist_cfg, "local_device_ids", ""))

  cluster_kwargs = {"local_device_ids": local_ids} if local_ids is not None else {}
  hint = _tpu_hint(env)
  if hint is None and (on_cloud_tpu_vm() if cloud_tpu_vm is None else cloud_tpu_vm):
    hint = "Cloud TPU VM"
  if hint is not None:
    return Plan("cluster", cluster_kwargs, f"auto: TPU ({hint})")

  if env.get("SLURM_JOB_ID") and _count(env, "SLURM_NTASKS") > 1:
    missing = [v for v in _SLURM_STEP_VARS if v not in env]
    if not missing:
      return Plan("cluster", cluster_kwargs, f"auto: SLURM step with {env['SLURM_NTASKS']} tasks")
    return Plan("single", {}, f"auto: SLURM allocation of {env['SLURM_NTASKS']} tasks but not "
                f"inside an srun step (missing {', '.join(missing)}): single process"
                + _unread_device_ids(dist_cfg))

  world = _count(env, "OMPI_COMM_WORLD_SIZE")
  if world > 1:
    if "OMPI_MCA_orte_hnp_uri" not in env:
      raise ConfigError("distributed.coordinator_address",
                        f"Open MPI world of {world} ranks without OMPI_MCA_orte_hnp_uri (Open MPI "
                        f">= 5), which JAX cannot auto-detect: set {ENV_COORDINATOR} (host:port), "
                        f"{ENV_NUM_PROCESSES} and {ENV_PROCESS_ID}")
    return Plan("cluster", cluster_kwargs, f"auto: Open MPI world of {world} ranks")

  return Plan("single", {}, "auto: no multi-host environment detected"
              + _unread_device_ids(dist_cfg))


def _unread_device_ids(dist_cfg: Any) -> str:
  """What a single process (no ``jax.distributed``) makes of ``local_device_ids``: nothing,
  said in the plan's reason ("" when it is unset): only ``jax.distributed.initialize`` limits a
  process to some of its devices."""
  ids = str(_get(dist_cfg, "local_device_ids", "") or "").strip()
  if not ids:
    return ""
  return (f"; config.distributed.local_device_ids={ids!r} is not read: a single process sees"
          " every local device (limit them with CUDA_VISIBLE_DEVICES, or size config.mesh"
          " without -1 to use a prefix of them)")


def enable_cpu_collectives() -> None:
  """Selects gloo for cross-process CPU collectives when none is configured.

  JAX 0.10 already defaults ``jax_cpu_collectives_implementation`` to gloo;
  without any implementation a multi-process CPU computation fails at run time.
  Must run before the CPU backend is created (i.e. before ``initialize``).
  """
  try:
    current = jax.config.jax_cpu_collectives_implementation
  except AttributeError:  # the flag is gone: JAX chooses its implementation itself
    return
  if current is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")


def _distributed_initialized() -> bool:
  is_initialized = getattr(jax.distributed, "is_initialized", None)
  return bool(is_initialized()) if is_initialized is not None else False


def initialize(dist_cfg: Any, *, env: Mapping[str, str] | None = None,
               init_fn: Callable[..., None] | None = None,
               cloud_tpu_vm: bool | None = None) -> dict:
  """Starts ``jax.distributed`` as ``config.distributed`` says; call it before touching devices.

  Prints one ``[distributed]`` line naming the processes and devices; a later call that would
  print the same line (a study's next run in the same process) prints nothing.

  Args:
    dist_cfg: ``config.distributed`` (see the module docstring).
    env: environment variables (default ``os.environ``).
    init_fn: the initialiser (default ``jax.distributed.initialize``; tests pass a fake).
    cloud_tpu_vm: override of the Cloud TPU VM check (tests).

  Returns:
    ``{"process_index", "process_count", "local_devices", "global_devices"}``
    (the last two are device counts).

  Raises:
    ConfigError: a missing or malformed ``config.distributed`` value.
  """
  p = plan(dist_cfg, env, cloud_tpu_vm)
  if p.kind != "single":
    if _distributed_initialized():
      p = Plan("single", {}, "jax.distributed already initialized")
    else:
      enable_cpu_collectives()
      kwargs = {k: v for k, v in p.kwargs.items() if v is not None}
      (init_fn or jax.distributed.initialize)(**kwargs)
  info = {"process_index": jax.process_index(), "process_count": jax.process_count(),
          "local_devices": jax.local_device_count(), "global_devices": jax.device_count()}
  line = (f"[distributed] process {info['process_index']}/{info['process_count']}, "
          f"{info['local_devices']} local / {info['global_devices']} global "
          f"{jax.default_backend()} devices ({p.reason})")
  if line != _REPORTED[0]:  # once per process, not once per run of a study's many runs
    print(line, flush=True)
    _REPORTED[0] = line
  return info


_REPORTED = [""]  # the last line initialize() printed


def is_primary() -> bool:
  """True in process 0, the one that writes summaries, plots and logs."""
  return jax.process_index() == 0


def process_key(key: jax.Array) -> jax.Array:
  """``key`` with the process index folded in: distinct host-local randomness per process.

  Use it only for host-side work (data shuffling, host verifiers); randomness
  inside jitted global computations must use the shared, unfolded key.
  """
  return jax.random.fold_in(key, jax.process_index())


def host_rows(global_batch: int, process_index: int | None = None,
              process_count: int | None = None) -> slice:
  """Rows ``[p*b/n, (p+1)*b/n)`` of a global batch of ``b`` rows that process ``p`` of ``n`` loads.

  Feed them to ``jax.make_array_from_process_local_data`` with a sharding whose
  devices are ordered by process (as ``jax.devices()`` is).

  Raises:
    ValueError: ``global_batch`` is not a multiple of the process count.
  """
  p = jax.process_index() if process_index is None else process_index
  n = jax.process_count() if process_count is None else process_count
  if not 0 <= p < n:
    raise ValueError(f"process_index={p} is not in [0, process_count={n})")
  if global_batch % n:
    raise ValueError(f"global batch {global_batch} is not divisible by the {n} processes")
  per = global_batch // n
  return slice(p * per, (p + 1) * per)


def sync(name: str) -> None:
  """Barrier: every process waits here until all reach ``sync(name)``; no-op in one process."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def agree_any(flags: np.ndarray) -> np.ndarray:
  """Element-wise OR of boolean ``flags`` over all processes (identity with one process)."""
  flags = np.asarray(flags, bool)
  if jax.process_count() == 1:
    return flags
  from jax.experimental import multihost_utils
  gathered = multihost_utils.process_allgather(flags.astype(np.int32))
  return np.asarray(gathered).reshape(-1, flags.size).any(axis=0)


def raise_agreed(failure: BaseException | None, elsewhere: BaseException) -> None:
  """Every process calls it at the same point with its own ``failure`` (None: none): when any
  process failed, the one that did raises its error and every other one ``elsewhere`` (which
  says another process failed), so that all of them stop, none left waiting in a collective
  for one that stopped. Nothing when no process failed (one process: ``failure``, if any)."""
  if agree_any(np.array([failure is not None]))[0]:
    raise failure or elsewhere
