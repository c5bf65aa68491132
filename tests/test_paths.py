"""gs:// workdirs: URLs are never made absolute; metrics, TensorBoard and checkpoints
follow the workdir. No network: an in-memory fsspec filesystem stands in for GCS
(epath hands gs:// paths to fsspec), and a TensorBoard writer factory over it."""

import os

import numpy as np
import pytest

from dllm_rl import paths
from dllm_rl.infra.checkpoint import Checkpointer
from dllm_rl.infra.observability import MetricsLogger, read_metrics
from dllm_rl.infra.plots import plot_metrics


def test_resolve_keeps_urls_and_makes_local_paths_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert os.fspath(paths.resolve("gs://bucket/run")) == "gs://bucket/run"
  assert paths.join("gs://bucket/run", "checkpoints", "rl") == "gs://bucket/run/checkpoints/rl"
  assert os.fspath(paths.resolve("run")) == str(tmp_path / "run")
  assert paths.join("run", "tb") == os.path.join("run", "tb")
  assert paths.is_url("s3://b/x") and not paths.is_url("/tmp/gs:/x")


def test_a_workdir_or_file_under_tilde_is_the_home_folders(tmp_path, monkeypatch):
  """``--workdir=~/run`` reaches the program unexpanded (the shell expands ``~`` only at the
  start of a word): taken literally it made a folder named ``~`` in the current directory."""
  from dllm_rl.train import modes
  from tests.helpers import tiny_run_config
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.chdir(tmp_path)
  assert os.fspath(paths.resolve("~/run")) == str(tmp_path / "home" / "run")
  assert paths.expand("~/data/x.jsonl") == str(tmp_path / "home" / "data" / "x.jsonl")
  assert paths.expand("gs://bucket/~x") == "gs://bucket/~x"
  seen = []

  def built(config, workdir, mesh=None):
    seen.append(workdir)
    raise RuntimeError("stop")

  monkeypatch.setattr("dllm_rl.train.context.build_context", built)
  with pytest.raises(RuntimeError, match="stop"):
    modes.run(tiny_run_config("sft", {}), "~/run")
  assert seen == [str(tmp_path / "home" / "run")] and not (tmp_path / "~").exists()


def test_metrics_follow_a_gs_workdir_and_resume_appends(fake_gcs):
  with MetricsLogger("gs://bucket/run", tensorboard=False) as logger:
    logger.log(1, {"loss": 0.5}, phase="sft")
    logger.flush()
    assert fake_gcs.exists("bucket/run/metrics.jsonl")
    logger.log(2, {"loss": float("nan")}, phase="sft")
  with MetricsLogger("gs://bucket/run", tensorboard=False) as logger:  # a resumed run
    logger.log(3, {"loss": 0.25}, phase="sft")
  records = read_metrics("gs://bucket/run", phase="sft")
  assert [r["step"] for r in records] == [1, 2, 3] and np.isnan(records[1]["loss"])
  png = plot_metrics("gs://bucket/run/metrics.jsonl", "gs://bucket/run/curves.png", ["loss"])
  assert png == "gs://bucket/run/curves.png"
  assert fake_gcs.cat("bucket/run/curves.png")[:4] == b"\x89PNG"


def test_tensorboard_follows_a_gs_workdir(fake_gcs, monkeypatch):
  from tensorboardX import record_writer

  class Factory:  # tensorboardX's own gs:// writer needs google-cloud-storage and a network
    def open(self, path):
      f = fake_gcs.open(path, "wb")
      return type("Writer", (), {"write": lambda _, b: f.write(b), "flush": lambda _: f.flush(),
                                 "close": lambda _: f.close()})()

    def directory_check(self, path):
      pass

  monkeypatch.setitem(record_writer.REGISTERED_FACTORIES, "gs", Factory())
  with MetricsLogger("gs://bucket/run", tensorboard=True) as logger:
    logger.log(1, {"loss": 0.5}, phase="sft")
  events = fake_gcs.ls("bucket/run/tb/sft", detail=False)
  assert len(events) == 1 and "tfevents" in events[0]
  assert fake_gcs.size(events[0]) > 0


def test_checkpointer_keeps_the_url(fake_gcs):
  # s3:// here: on gs:// orbax also asks google-cloud-storage about the bucket (network).
  ckpt = Checkpointer("s3://bucket/run/checkpoints/rl", keep=1, async_save=False)
  assert ckpt.directory == "s3://bucket/run/checkpoints/rl"
  assert ckpt.latest_step() is None
  assert fake_gcs.isdir("bucket/run/checkpoints/rl")  # orbax created it through epath
  ckpt.close()


def test_profile_trace_is_copied_to_a_gs_workdir(fake_gcs, tmp_path):
  """profile.steps on a gs:// workdir: traced to a local folder, copied under workdir/profile
  when the window's last step is done; the local copy is removed."""
  import jax
  import jax.numpy as jnp
  from dllm_rl.train.throughput import ProfileWindow
  x = jnp.ones((8, 8))
  with ProfileWindow("1:2", "gs://bucket/run") as profile:
    profile.before(1)
    local = profile._local
    assert local is not None and os.path.isdir(local)
    for step in (1, 2):
      x = jax.jit(lambda a: a @ a)(x)
      profile.after(step, x)
    assert profile._local is None
  found = [f for f in fake_gcs.find("bucket/run/profile") if f.endswith(".xplane.pb")]
  assert found and not os.path.exists(local)


def test_a_url_without_its_backend_package_is_named(monkeypatch):
  """gs:// without gcsfs: BackendMissing naming the package and how to install it; local
  paths and installed backends pass (the check runs before a run creates anything)."""
  import importlib.util

  from dllm_rl import paths as P
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "gcsfs" else real(name, *a))
  with pytest.raises(P.BackendMissing,
                     match=r"gs://b/run: gs:// paths need the gcsfs package.*\[gcs\]"):
    P.check_backend("gs://b/run")
  P.check_backend("/tmp/run")
  P.check_backend("memory://run")
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
  P.check_backend("gs://b/run")
