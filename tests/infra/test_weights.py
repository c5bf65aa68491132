"""model.hf_checkpoint sources (dllm_rl.infra.weights): a local folder, a gs:// folder staged to
the local cache, a hub id from the hub cache. No network: a hub cache laid out on disk as
huggingface_hub writes it, a download stand-in that fails like a network, and the in-memory
gs:// store of tests/fake_gcs.py."""

import json
import os
import re
import socket
import subprocess
from datetime import datetime, timezone
from unittest import mock

import pytest

import dllm_rl
from dllm_rl.config import ConfigError
from dllm_rl.infra import weights
from dllm_rl.train.hf_source import checkpoint_folder

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LLADA = os.path.join(ROOT, "tests", "fixtures", "llada_tiny")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(root, repo, files):
  """A hub cache holding ``repo`` at ``main`` with ``files`` (name → bytes); returns the
  snapshot folder."""
  base = root / ("models--" + repo.replace("/", "--"))
  (base / "refs").mkdir(parents=True)
  (base / "refs" / "main").write_text(COMMIT)
  snap = base / "snapshots" / COMMIT
  snap.mkdir(parents=True)
  for name, data in files.items():
    (snap / name).write_bytes(data)
  return snap


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  return tmp_path / "hub"


def test_hub_ids_are_two_names_that_are_not_a_local_path(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert weights.hub_id("GSAI-ML/LLaDA-8B-Instruct") == ("GSAI-ML/LLaDA-8B-Instruct", None)
  assert weights.hub_id("org/name@v1.0") == ("org/name", "v1.0")
  for not_hub in ("gs://bucket/model", "/abs/model", "./org/name", "org/name/sub", "name",
                  "~/org", "org/"):
    assert weights.hub_id(not_hub) is None, not_hub
  (tmp_path / "org" / "name").mkdir(parents=True)
  assert weights.hub_id("org/name") is None  # an existing local folder wins
  assert weights.resolve_checkpoint("org/name") == str(tmp_path / "org" / "name")


def test_a_missing_local_path_or_a_file_is_named(tmp_path):
  with pytest.raises(weights.WeightsUnavailable, match=r"nope/a/b' does not exist; give a "
                     r"checkpoint folder .* a gs:// folder, or a hub id"):
    weights.resolve_checkpoint(str(tmp_path / "nope" / "a" / "b"))
  (tmp_path / "f").write_text("x")
  with pytest.raises(weights.WeightsUnavailable, match="is a file, not a folder"):
    weights.resolve_checkpoint(str(tmp_path / "f"))


def test_a_hub_id_resolves_from_the_cache_offline(offline_hub):
  snap = _hub_cache(offline_hub, "org/tiny", {"config.json": b"{}", "model.safetensors": b"x"})
  assert weights.resolve_checkpoint("org/tiny") == str(snap)


def test_a_hub_id_not_in_the_cache_offline_says_how_to_fetch_it(offline_hub):
  """Offline, `dllm-rl-data weights ID` told the user to fetch ID with `dllm-rl-data weights
  ID`, the command that had just failed: it says how to download here (HF_HUB_OFFLINE=0) and
  how to bring the files from a machine with network (a folder, or the hub cache's)."""
  how = (r"on a machine with network run `hf download org/{0} --local-dir DIR`, copy DIR "
         r"here and give that folder instead of the id, or copy the hub cache's "
         rf"models--org--{{0}} folder from there into {re.escape(str(offline_hub))} here; or give "
         r"a gs:// URL$")
  with pytest.raises(weights.WeightsUnavailable,
                     match=r"'org/absent' is not a local folder, and as a Hugging Face hub id it "
                           rf"is not in the hub cache \({re.escape(str(offline_hub))}; "
                           r"HF_HUB_OFFLINE=1 downloads nothing\)\. With network here: "
                           r"`HF_HUB_OFFLINE=0 "
                           r"dllm-rl-data weights org/absent`\. Without, "
                           + how.format("absent")):
    weights.resolve_checkpoint("org/absent")
  _hub_cache(offline_hub, "org/partial", {"config.json": b"{}"})
  with pytest.raises(weights.WeightsUnavailable,
                     match=r"incomplete snapshot .*With network here: `HF_HUB_OFFLINE=0 "
                           r"dllm-rl-data weights org/partial` fetches the rest\. Without, "
                           + how.format("partial")):
    weights.resolve_checkpoint("org/partial")
  # planning reads config.json only: the partial snapshot is enough
  assert os.path.isfile(os.path.join(
      weights.resolve_checkpoint("org/partial", config_only=True), "config.json"))


def test_a_download_failure_is_named_and_only_loader_files_are_asked_for(tmp_path, monkeypatch):
  monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
  calls = []

  def no_network(repo, **kwargs):
    calls.append((repo, kwargs))
    raise OSError("[Errno 101] Network is unreachable\nmore detail")

  with pytest.raises(weights.WeightsUnavailable,
                     match=r"could not be downloaded \(OSError: \[Errno 101\] Network is"
                           r" unreachable\)\. "
                           r"Without network here, on a machine with network run `hf download "
                           r"org/m --revision abc --local-dir DIR`, copy DIR here and give that "
                           r"folder instead of the id, or copy the hub cache's models--org--m "
                           rf"folder from there into {re.escape(str(tmp_path / 'hub'))} here"):
    weights.resolve_checkpoint("org/m@abc", download=no_network)
  (repo, kwargs), = calls
  assert repo == "org/m" and kwargs["revision"] == "abc" and not kwargs["local_files_only"]
  assert "*.safetensors" in kwargs["allow_patterns"] and "*.bin" not in kwargs["allow_patterns"]


def test_config_key_is_named_before_anything_loads(offline_hub):
  with pytest.raises(ConfigError, match=r"^config\.model\.hf_checkpoint: 'org/absent' is not a "
                                        r"local folder, and as a Hugging Face hub id"):
    checkpoint_folder("org/absent")


def test_load_pretrained_takes_a_hub_id(offline_hub):
  files = {n: open(os.path.join(LLADA, n), "rb").read()
           for n in ("config.json", "model.safetensors")}
  snap = _hub_cache(offline_hub, "org/llada-tiny", files)
  model = dllm_rl.load_pretrained("org/llada-tiny")
  assert model.family == "llada" and model.path == str(snap)


def _put(fs, path, data: bytes, mtime: int | None = None):
  """Write the object ``path``; ``mtime``: its update time (seconds), else now."""
  with fs.open(path, "wb") as f:
    f.write(data)
  if mtime is not None:
    fs.store[fs._strip_protocol(path)].modified = datetime.fromtimestamp(mtime, timezone.utc)


def _inodes(folder) -> dict[str, int]:
  """name → inode of the staged files directly in ``folder`` (a copy renamed in gets a new
  one; the marker is rewritten by every stage)."""
  return {n: os.stat(os.path.join(folder, n)).st_ino for n in os.listdir(folder)
          if n != weights.MARKER}


def _read(folder, name) -> bytes:
  with open(os.path.join(folder, name), "rb") as f:
    return f.read()


def test_a_gs_folder_is_staged_to_the_local_cache_once(fake_gcs, tmp_path, monkeypatch):
  monkeypatch.setenv("DLLM_RL_CACHE", str(tmp_path / "cache"))
  for name, data in {"config.json": b"{}", "model.safetensors": b"weights",
                     "hf_extra/tokenizer.json": b"tok"}.items():
    _put(fake_gcs, f"bucket/ckpt/tiny/{name}", data, mtime=1_700_000_000)
  url = "gs://bucket/ckpt/tiny"
  local = weights.resolve_checkpoint(url)
  assert local == str(tmp_path / "cache" / "weights" / "gs" / "bucket" / "ckpt" / "tiny")
  assert open(os.path.join(local, "hf_extra", "tokenizer.json"), "rb").read() == b"tok"
  assert os.path.isfile(os.path.join(local, weights.MARKER))

  before = _inodes(local)
  weights.resolve_checkpoint(url)  # nothing changed: nothing copied
  assert _inodes(local) == before
  with open(os.path.join(local, "model.safetensors"), "wb") as f:
    f.write(b"WEIGHTS")  # a local copy edited since: copied again, same size or not
  weights.resolve_checkpoint(url)
  assert _read(local, "model.safetensors") == b"weights"
  _put(fake_gcs, "bucket/ckpt/tiny/model.safetensors", b"new weights")  # changed: copied again
  weights.resolve_checkpoint(url)
  assert open(os.path.join(local, "model.safetensors"), "rb").read() == b"new weights"
  assert not [n for n in os.listdir(local) if ".tmp-" in n]


def test_a_same_size_reupload_is_staged_again_and_nothing_else(fake_gcs, tmp_path, monkeypatch):
  """Safetensors of the same shapes have the same size: the object's update time tells a
  re-uploaded fine-tune from the weights staged before; files not re-uploaded stay."""
  monkeypatch.setenv("DLLM_RL_CACHE", str(tmp_path / "cache"))
  for name, data in {"config.json": b"{}", "model.safetensors": b"base"}.items():
    _put(fake_gcs, f"bucket/m/{name}", data, mtime=1_700_000_000)
  local = weights.resolve_checkpoint("gs://bucket/m")
  before = _inodes(local)
  _put(fake_gcs, "bucket/m/model.safetensors", b"tune", mtime=1_700_000_100)
  assert weights.resolve_checkpoint("gs://bucket/m") == local
  assert _read(local, "model.safetensors") == b"tune"
  after = _inodes(local)
  assert after["config.json"] == before["config.json"]  # not copied again
  assert after["model.safetensors"] != before["model.safetensors"]
  with open(os.path.join(local, weights.MARKER)) as f:
    assert json.load(f) == {"source": "gs://bucket/m", "files": {
        "config.json": {"size": 2, "mtime": 1_700_000_000},
        "model.safetensors": {"size": 4, "mtime": 1_700_000_100}}}


def test_a_cache_staged_before_mtimes_were_recorded_is_refreshed(fake_gcs, tmp_path,
                                                                 monkeypatch):
  """A copy without the stamp (an old-format marker: sizes only) cannot be proven current:
  it is copied again, once."""
  monkeypatch.setenv("DLLM_RL_CACHE", str(tmp_path / "cache"))
  _put(fake_gcs, "bucket/m/config.json", b"{}", mtime=1_700_000_000)
  _put(fake_gcs, "bucket/m/model.safetensors", b"tune", mtime=1_700_000_100)
  local = weights.staging_dir("gs://bucket/m")
  os.makedirs(local)
  for name, data in {"config.json": b"{}", "model.safetensors": b"base"}.items():
    with open(os.path.join(local, name), "wb") as f:
      f.write(data)
  with open(os.path.join(local, weights.MARKER), "w") as f:
    json.dump({"source": "gs://bucket/m", "files": {"config.json": 2, "model.safetensors": 4}}, f)
  weights.resolve_checkpoint("gs://bucket/m")
  assert _read(local, "model.safetensors") == b"tune"
  before = _inodes(local)
  weights.resolve_checkpoint("gs://bucket/m")
  assert _inodes(local) == before


def test_an_interrupted_stage_is_finished_by_the_next(fake_gcs, tmp_path, monkeypatch):
  """Cut off after one of two re-uploaded files is renamed in, beside the old marker: the next
  stage copies the other one only and records the new versions."""
  monkeypatch.setenv("DLLM_RL_CACHE", str(tmp_path / "cache"))
  for name in ("a.safetensors", "b.safetensors", "config.json"):
    _put(fake_gcs, f"bucket/m/{name}", b"v1", mtime=1_700_000_000)
  local = weights.resolve_checkpoint("gs://bucket/m")
  with open(os.path.join(local, weights.MARKER)) as f:
    old_marker = f.read()
  for name in ("a.safetensors", "b.safetensors"):
    _put(fake_gcs, f"bucket/m/{name}", b"v2", mtime=1_700_000_100)
  replace, calls = os.replace, []

  def replace_once(src, dst):
    calls.append(dst)
    if len(calls) > 1:
      raise OSError("No space left on device")
    replace(src, dst)

  monkeypatch.setattr(os, "replace", replace_once)
  with pytest.raises(OSError, match="No space"):
    weights.resolve_checkpoint("gs://bucket/m")
  monkeypatch.setattr(os, "replace", replace)
  assert [_read(local, n) for n in ("a.safetensors", "b.safetensors")] == [b"v2", b"v1"]
  with open(os.path.join(local, weights.MARKER)) as f:
    assert f.read() == old_marker  # the marker is written last
  before = _inodes(local)
  weights.resolve_checkpoint("gs://bucket/m")
  assert [_read(local, n) for n in ("a.safetensors", "b.safetensors")] == [b"v2", b"v2"]
  after = _inodes(local)
  assert after["a.safetensors"] == before["a.safetensors"]  # renamed in before the cut
  assert after["b.safetensors"] != before["b.safetensors"]
  with open(os.path.join(local, weights.MARKER)) as f:
    assert json.load(f)["files"]["b.safetensors"] == {"size": 2, "mtime": 1_700_000_100}


def test_partial_copies_are_removed_by_the_failing_stage_or_the_next(fake_gcs, tmp_path,
                                                                     monkeypatch):
  """A copy that fails removes its temporary file; one left on this host by a stager killed
  mid-copy (its pid gone) is removed by the next stage; a running stager's, and another
  host's (a cache shared between hosts: its pids are not this host's), are left alone."""
  monkeypatch.setenv("DLLM_RL_CACHE", str(tmp_path / "cache"))
  for name in ("a.safetensors", "config.json"):
    _put(fake_gcs, f"bucket/m/{name}", b"v1", mtime=1_700_000_000)
  with mock.patch.object(os, "utime", side_effect=OSError("Disk quota exceeded")):
    with pytest.raises(OSError, match="quota"):
      weights.resolve_checkpoint("gs://bucket/m")
  local = weights.staging_dir("gs://bucket/m")
  assert not [n for n in os.listdir(local) if ".tmp-" in n]
  dead = subprocess.Popen(["true"])
  dead.wait()  # a pid that has exited
  host = socket.gethostname()
  orphan = os.path.join(local, f"a.safetensors.tmp-{host}-{dead.pid}")
  live = os.path.join(local, f"config.json.tmp-{host}-{os.getppid()}")  # a running process's
  other = os.path.join(local, f"a.safetensors.tmp-{host}x-{dead.pid}")  # another host's
  for path in (orphan, live, other):
    with open(path, "wb") as f:
      f.write(b"partial")
  weights.resolve_checkpoint("gs://bucket/m")
  assert not os.path.exists(orphan) and os.path.exists(live) and os.path.exists(other)
  assert _read(local, "a.safetensors") == b"v1"


def test_a_config_only_stage_leaves_stale_weights_to_the_full_one(fake_gcs, tmp_path,
                                                                  monkeypatch):
  monkeypatch.setenv("DLLM_RL_CACHE", str(tmp_path / "cache"))
  for name in ("config.json", "model.safetensors"):
    _put(fake_gcs, f"bucket/m/{name}", b"v1", mtime=1_700_000_000)
  local = weights.resolve_checkpoint("gs://bucket/m")
  for name in ("config.json", "model.safetensors"):
    _put(fake_gcs, f"bucket/m/{name}", b"v2", mtime=1_700_000_100)
  weights.resolve_checkpoint("gs://bucket/m", config_only=True)  # what the planner stages
  assert [_read(local, n) for n in ("config.json", "model.safetensors")] == [b"v2", b"v1"]
  weights.resolve_checkpoint("gs://bucket/m")
  assert [_read(local, n) for n in ("config.json", "model.safetensors")] == [b"v2", b"v2"]


def test_files_gone_from_the_source_are_removed_from_the_copy(fake_gcs, tmp_path, monkeypatch):
  """Shards and their index replaced by one model.safetensors: the stale index (which the
  loader reads first) and shards go; a config-only stage removes nothing."""
  monkeypatch.setenv("DLLM_RL_CACHE", str(tmp_path / "cache"))
  shards = ["model.safetensors.index.json", "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors"]
  for name in ["config.json", *shards]:
    _put(fake_gcs, f"bucket/m/{name}", b"v1", mtime=1_700_000_000)
  local = weights.resolve_checkpoint("gs://bucket/m")
  for name in shards:
    fake_gcs.rm(f"bucket/m/{name}")
  _put(fake_gcs, "bucket/m/model.safetensors", b"merged", mtime=1_700_000_100)
  weights.resolve_checkpoint("gs://bucket/m", config_only=True)
  assert set(shards) < set(os.listdir(local))
  weights.resolve_checkpoint("gs://bucket/m")
  assert sorted(os.listdir(local)) == [weights.MARKER, "config.json", "model.safetensors"]
  with open(os.path.join(local, weights.MARKER)) as f:
    assert sorted(json.load(f)["files"]) == ["config.json", "model.safetensors"]


def test_planning_stages_only_the_top_level_json(fake_gcs, tmp_path, monkeypatch):
  monkeypatch.setenv("DLLM_RL_CACHE", str(tmp_path / "cache"))
  _put(fake_gcs, "bucket/m/config.json", b"{}")
  _put(fake_gcs, "bucket/m/model.safetensors", b"weights")
  local = weights.resolve_checkpoint("gs://bucket/m", config_only=True)
  assert sorted(os.listdir(local)) == ["config.json"]
  with pytest.raises(weights.WeightsUnavailable, match="gs://bucket/none is not a folder"):
    weights.resolve_checkpoint("gs://bucket/none")


def test_staged_gs_checkpoint_loads(fake_gcs, tmp_path, monkeypatch):
  monkeypatch.setenv("DLLM_RL_CACHE", str(tmp_path / "cache"))
  for name in ("config.json", "model.safetensors"):
    _put(fake_gcs, f"bucket/llada/{name}", open(os.path.join(LLADA, name), "rb").read())
  model = dllm_rl.load_pretrained("gs://bucket/llada")
  assert model.family == "llada"
  assert model.path == weights.staging_dir("gs://bucket/llada")


def test_an_object_name_leading_outside_the_staging_folder_is_refused(fake_gcs, tmp_path,
                                                                      monkeypatch):
  """An object named with ".." would be copied (or removed) outside the cache folder."""
  monkeypatch.setenv("DLLM_RL_CACHE", str(tmp_path / "cache"))
  _put(fake_gcs, "bucket/m/config.json", b"{}", mtime=1_700_000_000)
  listing = weights._listing
  monkeypatch.setattr(weights, "_listing", lambda root: {**listing(root),
                                                         "../../x.json": (2, 1_700_000_000)})
  with pytest.raises(weights.WeightsUnavailable, match=r"the object '\.\./\.\./x\.json' would be "
                     r"copied outside the staging folder"):
    weights.resolve_checkpoint("gs://bucket/m")
  assert not os.path.exists(tmp_path / "cache" / "weights" / "gs" / "x.json")


def test_a_gs_folder_of_a_runs_checkpoints_names_the_run_by_its_url(fake_gcs, tmp_path,
                                                                    monkeypatch):
  """model.hf_checkpoint / load_pretrained on a gs:// run folder or checkpoint step: the hint
  named the local staging copy (CACHE/weights/gs/bucket/run) as the run to export, which holds
  no run; it names the bucket's run, which `convert export --workdir` reads."""
  monkeypatch.setenv("DLLM_RL_CACHE", str(tmp_path / "cache"))
  _put(fake_gcs, "bucket/run/checkpoints/sft/4/state/data", b"x", mtime=1_700_000_000)
  export = "`python -m dllm_rl.convert export --workdir gs://bucket/run"
  for url, said in (
      ("gs://bucket/run/checkpoints/sft/4", "; gs://bucket/run/checkpoints/sft/4 is a training"
       f" run's sft checkpoint (Orbax), not an HF folder: export it with {export} --phase sft"
       " --step 4 --hf_dir OUT` and load OUT"),
      ("gs://bucket/run", f"; gs://bucket/run is a training run's --workdir: export its"
       f" checkpoint with {export} --hf_dir OUT` and load OUT")):
    with pytest.raises(FileNotFoundError) as err:
      dllm_rl.load_pretrained(url)
    assert str(err.value).endswith(said)
  from dllm_rl.models import convert  # the URL itself (a `convert import` folder's check)
  with pytest.raises(FileNotFoundError, match=f"export it with {export} --phase sft --step 4 "):
    convert.read_meta("gs://bucket/run/checkpoints/sft/4")
  assert weights.staged_source(weights.staging_dir("gs://bucket/run") + "/x") == "gs://bucket/run/x"
  assert weights.staged_source(str(tmp_path / "elsewhere")) is None


def test_a_gs_folder_that_holds_no_model_is_staged_in_outline(fake_gcs, tmp_path, monkeypatch):
  """A run's workdir given as model.hf_checkpoint: its checkpoints (an 8B run's: hundreds of
  GB) were all copied before the loader said it is a run; now only its top-level JSON files
  and its folders' names are, enough for that message, and no marker claims a full copy."""
  monkeypatch.setenv("DLLM_RL_CACHE", str(tmp_path / "cache"))
  for name in ("summary.json", "metrics.jsonl", "checkpoints/rl/8/state/data"):
    _put(fake_gcs, f"bucket/run/{name}", b"{}", mtime=1_700_000_000)
  with pytest.raises(FileNotFoundError, match="gs://bucket/run is a training run's --workdir"):
    dllm_rl.load_pretrained("gs://bucket/run")
  local = weights.staging_dir("gs://bucket/run")
  assert sorted(os.listdir(local)) == ["checkpoints", "summary.json"]
  assert os.listdir(os.path.join(local, "checkpoints")) == []
  _put(fake_gcs, "bucket/run/config.json", b"{}")  # a model after all: staged in full
  weights.resolve_checkpoint("gs://bucket/run")
  assert os.path.isfile(os.path.join(local, "checkpoints", "rl", "8", "state", "data"))
  assert os.path.isfile(os.path.join(local, weights.MARKER))
