"""dllm_rl.parallel.distributed: config/env resolution, host-local helpers, a real 2-process run."""

from __future__ import annotations

import json
import os

import jax
import ml_collections
import numpy as np
import pytest

from dllm_rl.config import ConfigError, base_config
from dllm_rl.errors import ConfigErrors
from dllm_rl.parallel import distributed
from tests.multiprocess import harness

WORKER = os.path.join(harness.REPO, "tests", "multiprocess", "psum_worker.py")


def dist_cfg(**overrides) -> ml_collections.ConfigDict:
  """config.distributed with the documented defaults, then ``overrides``."""
  c = ml_collections.ConfigDict(dict(initialize="auto", coordinator_address="", num_processes=0,
                                     process_id=-1, local_device_ids=""))
  c.update(overrides)
  return c


def plan(env=None, cloud_tpu_vm=False, **overrides) -> distributed.Plan:
  return distributed.plan(dist_cfg(**overrides), env or {}, cloud_tpu_vm=cloud_tpu_vm)


class FakeInit:
  """Records the calls jax.distributed.initialize would have received."""

  def __init__(self):
    self.calls = []

  def __call__(self, **kwargs):
    self.calls.append(kwargs)


def test_schema_defaults_mean_single_process_locally():
  p = distributed.plan(base_config().distributed, {}, cloud_tpu_vm=False)
  assert p.kind == "single" and dict(base_config().distributed) == dict(dist_cfg())


# --- explicit / never -------------------------------------------------------------------------

def test_never_is_single_even_in_a_cluster():
  p = plan({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4", "DLLM_COORDINATOR_ADDRESS": "h:1"},
           cloud_tpu_vm=True, initialize="never")
  assert p.kind == "single" and p.kwargs == {}


def test_explicit_from_config():
  p = plan(initialize="explicit", coordinator_address="10.0.0.1:1234", num_processes=4,
           process_id=3, local_device_ids="0,1")
  assert p.kind == "explicit"
  assert p.kwargs == dict(coordinator_address="10.0.0.1:1234", num_processes=4, process_id=3,
                          local_device_ids=[0, 1], cluster_detection_method="deactivate")


def test_explicit_from_env_and_config_wins_over_env():
  env = {"DLLM_COORDINATOR_ADDRESS": "host0:99", "DLLM_NUM_PROCESSES": "8",
         "DLLM_PROCESS_ID": "5"}
  assert plan(env, initialize="explicit").kwargs == dict(
      coordinator_address="host0:99", num_processes=8, process_id=5, local_device_ids=None,
      cluster_detection_method="deactivate")
  p = plan(env, initialize="explicit", coordinator_address="other:7", process_id=0)
  assert p.kwargs["coordinator_address"] == "other:7"
  assert p.kwargs["process_id"] == 0 and p.kwargs["num_processes"] == 8


@pytest.mark.parametrize("overrides, env, key", [
    ({}, {"DLLM_NUM_PROCESSES": "2", "DLLM_PROCESS_ID": "0"}, "coordinator_address"),
    ({"coordinator_address": "h:1"}, {"DLLM_PROCESS_ID": "0"}, "num_processes"),
    ({"coordinator_address": "h:1", "num_processes": 2}, {}, "process_id"),
    ({"coordinator_address": "localhost", "num_processes": 2, "process_id": 0}, {},
     "coordinator_address"),
    ({"coordinator_address": "h:port", "num_processes": 2, "process_id": 0}, {},
     "coordinator_address"),
    ({"coordinator_address": "h:1", "num_processes": 2, "process_id": 2}, {}, "process_id"),
    ({"coordinator_address": "h:1", "num_processes": -3, "process_id": 0}, {}, "num_processes"),
    ({"coordinator_address": "h:1", "process_id": 0}, {"DLLM_NUM_PROCESSES": "two"},
     "num_processes"),
    ({"coordinator_address": "h:1", "num_processes": 2, "process_id": 0,
      "local_device_ids": "0,a"}, {}, "local_device_ids"),
    ({"coordinator_address": "h:1", "num_processes": 2, "process_id": 0,
      "local_device_ids": "1,1"}, {}, "local_device_ids"),
])
def test_explicit_errors_name_the_config_key(overrides, env, key):
  with pytest.raises(ConfigError, match=rf"^config\.distributed\.{key}: ") as err:
    plan(env, initialize="explicit", **overrides)
  assert err.value.key == f"distributed.{key}"


def test_explicit_reports_every_missing_value_at_once():
  with pytest.raises(ConfigErrors) as err:
    plan({}, initialize="explicit")
  assert [e.key for e in err.value.errors] == [
      "distributed.coordinator_address", "distributed.num_processes", "distributed.process_id"]
  with pytest.raises(ConfigErrors) as err:  # a malformed one beside a missing one
    plan({"DLLM_NUM_PROCESSES": "two"}, initialize="explicit", coordinator_address="h")
  assert [e.key for e in err.value.errors] == [
      "distributed.coordinator_address", "distributed.num_processes", "distributed.process_id"]
  assert "is not an integer" in str(err.value.errors[1])


def test_a_port_out_of_range_is_named_whether_from_the_config_or_the_env():
  """1..65535: an env var's port is checked when initialize() runs, a config's also by
  validation (config_problems); config and env problems are said together, each once."""
  env = {"DLLM_COORDINATOR_ADDRESS": "h:65536", "DLLM_NUM_PROCESSES": "2", "DLLM_PROCESS_ID": "0"}
  with pytest.raises(ConfigError, match=r"^config\.distributed\.coordinator_address: port 65536"):
    plan(env)
  assert plan(dict(env, DLLM_COORDINATOR_ADDRESS="h:65535")).kwargs["process_id"] == 0
  with pytest.raises(ConfigErrors) as err:
    plan({"DLLM_NUM_PROCESSES": "x"}, coordinator_address="h:0", process_id=-2)
  assert [e.key for e in err.value.errors] == [
      "distributed.coordinator_address", "distributed.process_id", "distributed.num_processes"]
  assert [str(e) for e in err.value.errors] == [
      str(e) for e in distributed.config_problems(dist_cfg(coordinator_address="h:0",
                                                           process_id=-2))
  ] + ["config.distributed.num_processes: env var DLLM_NUM_PROCESSES='x' is not an integer"]


def test_missing_value_message_names_the_env_var():
  with pytest.raises(ConfigError, match="DLLM_COORDINATOR_ADDRESS"):
    plan(initialize="explicit", num_processes=2, process_id=0)


def test_unknown_mode():
  with pytest.raises(ConfigError, match=r"^config\.distributed\.initialize: .*'sometimes'"):
    plan(initialize="sometimes")


# --- auto detection ---------------------------------------------------------------------------

SLURM_STEP = {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "gpu[01-02]", "SLURM_NTASKS": "4",
              "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_NODES": "2"}


@pytest.mark.parametrize("env, cloud_tpu_vm, kind", [
    ({}, False, "single"),
    ({"HOME": "/root", "PATH": "/bin"}, False, "single"),
    # Cloud TPU pods, GKE and multislice: the variables JAX's own TPU detection reads.
    ({"TPU_WORKER_HOSTNAMES": "t-w-0,t-w-1,t-w-2,t-w-3"}, False, "cluster"),
    ({"TPU_PROCESS_ADDRESSES": "10.0.0.1:8476,10.0.0.2:8476"}, False, "cluster"),
    ({"TPU_WORKER_HOSTNAMES": "localhost"}, False, "single"),
    ({"MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.1"}, False, "cluster"),
    ({"MEGASCALE_NUM_SLICES": "2"}, False, "cluster"),
    ({"MEGASCALE_NUM_SLICES": "1"}, False, "single"),
    ({}, True, "cluster"),  # a Cloud TPU VM: JAX reads the slice from the metadata server
    # SLURM: only a multi-task srun step is a multi-process run.
    (SLURM_STEP, False, "cluster"),
    (dict(SLURM_STEP, SLURM_NTASKS="1"), False, "single"),
    ({"SLURM_JOB_ID": "77", "SLURM_NTASKS": "4"}, False, "single"),  # salloc shell, no srun
    # Open MPI (mpirun): JAX parses the coordinator from the ORTE URI.
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:4000"}, False, "cluster"),
    ({"OMPI_COMM_WORLD_SIZE": "1", "OMPI_MCA_orte_hnp_uri": "x"}, False, "single"),
    # DLLM_* variables: the explicit form, in any environment.
    ({"DLLM_COORDINATOR_ADDRESS": "h:1", "DLLM_NUM_PROCESSES": "2", "DLLM_PROCESS_ID": "1"},
     True, "explicit"),
])
def test_auto_detection(env, cloud_tpu_vm, kind):
  p = plan(env, cloud_tpu_vm=cloud_tpu_vm)
  assert p.kind == kind, p.reason
  if kind == "cluster":
    assert p.kwargs == {}  # jax.distributed.initialize() detects everything itself


def test_a_single_process_says_it_does_not_read_local_device_ids():
  """local_device_ids limits a process's devices through jax.distributed.initialize only: a
  run that auto-detects no multi-host environment used every local device silently."""
  assert "local_device_ids" not in plan().reason
  for env in ({}, {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "4"}):  # no cluster; salloc, no srun
    p = plan(env, local_device_ids="0,1")
    assert p.kind == "single" and p.kwargs == {}
    assert p.reason.endswith("; config.distributed.local_device_ids='0,1' is not read: a single"
                             " process sees every local device (limit them with"
                             " CUDA_VISIBLE_DEVICES, or size config.mesh without -1 to use a"
                             " prefix of them)"), p.reason
  assert "local_device_ids" not in plan(SLURM_STEP, local_device_ids="0").reason  # cluster


def test_auto_with_explicit_config_values_uses_them():
  p = plan(SLURM_STEP, coordinator_address="n0:5", num_processes=2, process_id=1)
  assert p.kind == "explicit"
  assert p.kwargs["coordinator_address"] == "n0:5" and p.kwargs["process_id"] == 1
  assert "config.distributed.coordinator_address" in p.reason


def test_auto_with_partial_dllm_env_fails_on_the_missing_key():
  with pytest.raises(ConfigError, match=r"^config\.distributed\.process_id: "):
    plan({"DLLM_COORDINATOR_ADDRESS": "h:1", "DLLM_NUM_PROCESSES": "2"})


def test_auto_passes_local_device_ids_to_cluster_init():
  p = plan(SLURM_STEP, local_device_ids="0,1,2,3")
  assert p.kind == "cluster" and p.kwargs == {"local_device_ids": [0, 1, 2, 3]}


def test_auto_open_mpi_5_without_orte_uri_says_what_to_set():
  with pytest.raises(ConfigError, match="DLLM_COORDINATOR_ADDRESS"):
    plan({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0"})


def test_parse_device_ids():
  assert distributed.parse_device_ids("") is None
  assert distributed.parse_device_ids("3") == [3]
  assert distributed.parse_device_ids(" 0, 2 ") == [0, 2]
  assert distributed.parse_device_ids(1) == [1]


# --- initialize with a fake jax.distributed.initialize ------------------------------------------

def test_initialize_explicit_calls_init_with_resolved_values():
  fake = FakeInit()
  env = {"DLLM_COORDINATOR_ADDRESS": "h0:1234", "DLLM_NUM_PROCESSES": "1", "DLLM_PROCESS_ID": "0"}
  info = distributed.initialize(dist_cfg(initialize="explicit"), env=env, init_fn=fake,
                                cloud_tpu_vm=False)
  # local_device_ids="" (all devices) is not passed, and JAX's cluster detection is off: it
  # would restrict the process to GPU $SLURM_LOCALID inside a SLURM step.
  assert fake.calls == [dict(coordinator_address="h0:1234", num_processes=1, process_id=0,
                             cluster_detection_method="deactivate")]
  assert info == {"process_index": 0, "process_count": 1, "local_devices": jax.local_device_count(),
                  "global_devices": jax.device_count()}
  assert info["global_devices"] == 8  # conftest's simulated devices


def test_initialize_cluster_calls_init_without_arguments():
  fake = FakeInit()
  distributed.initialize(dist_cfg(), env=SLURM_STEP, init_fn=fake, cloud_tpu_vm=False)
  assert fake.calls == [{}]


@pytest.mark.parametrize("cfg, env", [
    (dist_cfg(initialize="never"), {"DLLM_COORDINATOR_ADDRESS": "h:1"}),
    (dist_cfg(), {}),
    (dist_cfg(), {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "8"}),
])
def test_initialize_single_process_does_not_call_init(cfg, env, capsys, monkeypatch):
  monkeypatch.setattr(distributed, "_REPORTED", [""])
  fake = FakeInit()
  info = distributed.initialize(cfg, env=env, init_fn=fake, cloud_tpu_vm=False)
  assert fake.calls == []
  assert info["process_count"] == 1 and info["process_index"] == 0
  out = capsys.readouterr().out
  assert out.count("\n") == 1 and out.startswith("[distributed] process 0/1")


def test_initialize_prints_its_line_once(capsys, monkeypatch):
  monkeypatch.setattr(distributed, "_REPORTED", [""])
  for _ in range(3):  # a study's runs in one process
    distributed.initialize(dist_cfg(), env={}, init_fn=FakeInit(), cloud_tpu_vm=False)
  first = capsys.readouterr().out
  assert first.count("[distributed] process 0/1") == 1
  distributed.initialize(dist_cfg(initialize="never"), env={}, init_fn=FakeInit(),
                         cloud_tpu_vm=False)  # another reason: another line
  assert capsys.readouterr().out.startswith("[distributed] process 0/1")


def test_initialize_validates_before_calling_init():
  fake = FakeInit()
  with pytest.raises(ConfigError, match=r"^config\.distributed\.num_processes: "):
    distributed.initialize(dist_cfg(initialize="explicit", coordinator_address="h:1"), env={},
                           init_fn=fake)
  assert fake.calls == []


def test_enable_cpu_collectives_selects_gloo_when_unset():
  before = jax.config.jax_cpu_collectives_implementation
  try:
    jax.config.update("jax_cpu_collectives_implementation", None)
    distributed.enable_cpu_collectives()
    assert jax.config.jax_cpu_collectives_implementation == "gloo"
    jax.config.update("jax_cpu_collectives_implementation", "mpi")
    distributed.enable_cpu_collectives()  # an explicit user choice is kept
    assert jax.config.jax_cpu_collectives_implementation == "mpi"
  finally:
    jax.config.update("jax_cpu_collectives_implementation", before)


# --- host-local helpers -------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_host_rows_tile_the_global_batch(n):
  b = 24
  slices = [distributed.host_rows(b, p, n) for p in range(n)]
  rows = np.concatenate([np.arange(b)[s] for s in slices])
  np.testing.assert_array_equal(rows, np.arange(b))  # contiguous, ordered, disjoint, complete
  assert {s.stop - s.start for s in slices} == {b // n}
  assert slices[-1] == slice(b - b // n, b)


def test_host_rows_errors_and_single_process_default():
  assert distributed.host_rows(6) == slice(0, 6)
  with pytest.raises(ValueError, match="not divisible"):
    distributed.host_rows(10, 0, 4)
  with pytest.raises(ValueError, match="process_index"):
    distributed.host_rows(8, 2, 2)


def test_single_process_helpers():
  key = jax.random.key(3)
  assert distributed.is_primary()
  folded = distributed.process_key(key)
  np.testing.assert_array_equal(jax.random.key_data(folded),
                                jax.random.key_data(jax.random.fold_in(key, 0)))
  assert not np.array_equal(jax.random.key_data(folded), jax.random.key_data(key))
  distributed.sync("single_process_noop")  # returns at once


# --- a real 2-process run over localhost --------------------------------------------------------

@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_agree_with_single_process(tmp_path):
  outs, logs, codes, report = harness.run_workers(WORKER, tmp_path, out_suffix=".json")
  assert codes == [0, 0], report

  results = [json.loads(out.read_text()) for out in outs]
  worker = harness.load_module(WORKER, "psum_worker")
  x_BF = worker.global_batch()
  sq_F, total = jax.jit(worker.reduce_fn)(x_BF)  # the single-process value (8 local devices)
  np.testing.assert_allclose(sq_F, (x_BF.astype(np.float64) ** 2).sum(0))
  for p, r in enumerate(results):
    assert (r["process_index"], r["process_count"]) == (p, 2)
    assert (r["local_devices"], r["global_devices"], r["addressable_shards"]) == (2, 4, 2)
    assert r["is_primary"] == (p == 0)
    assert r["rows"] == [4 * p, 4 * p + 4]
    np.testing.assert_allclose(r["sum_sq"], np.asarray(sq_F), rtol=1e-6)
    assert r["total"] == pytest.approx(float(total)) == pytest.approx(276.0)
  # initialize() switched on gloo although the worker started with no CPU collectives.
  if hasattr(jax.config, "jax_cpu_collectives_implementation"):
    assert all(r["cpu_collectives"] == "gloo" for r in results)
  assert results[0]["process_key"] != results[1]["process_key"]
  for p, log in enumerate(logs):
    assert f"[distributed] process {p}/2, 2 local / 4 global cpu devices" in log.read_text()


# The process of a SLURM step whose explicit initialize must keep every local GPU.
_SLURM_VISIBLE = """
import sys
from jax._src import xla_bridge
from dllm_rl.parallel import distributed
distributed.initialize(dict(initialize="explicit", coordinator_address=sys.argv[1],
                            num_processes=1, process_id=0, local_device_ids=sys.argv[2]))
print("visible=" + xla_bridge.CUDA_VISIBLE_DEVICES.value)
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize("local_ids, visible", [("", "all"), ("1,2", "1,2")])
def test_explicit_in_a_slurm_step_keeps_the_local_devices_it_names(tmp_path, local_ids,
                                                                   visible):
  """launch/slurm_gpu.sh's one process per node: real jax.distributed.initialize inside a SLURM
  step (SLURM_LOCALID=3) with local_device_ids="" must leave every GPU visible; JAX's own SLURM
  detection would have restricted the process to GPU 3 (1 of the node's 8)."""
  import subprocess
  import sys
  env = {k: v for k, v in os.environ.items() if not k.startswith(harness.CLUSTER_ENV_PREFIXES)}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=harness.REPO, SLURM_JOB_ID="7",
             SLURM_STEP_NODELIST="node1", SLURM_NTASKS="1", SLURM_PROCID="0", SLURM_LOCALID="3",
             SLURM_STEP_NUM_NODES="1")
  proc = subprocess.run([sys.executable, "-c", _SLURM_VISIBLE, f"127.0.0.1:{harness.free_port()}",
                         local_ids], env=env, cwd=tmp_path, capture_output=True, text=True,
                        timeout=60)
  assert proc.returncode == 0, proc.stderr
  assert f"visible={visible}" in proc.stdout.splitlines()
