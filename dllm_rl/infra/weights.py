"""Where a checkpoint's files come from: a local folder, a gs:// folder, or a Hugging Face hub id.

``resolve_checkpoint(spec)`` returns a local folder that the loaders read:

* an existing local folder: itself (absolute);
* a URL (``gs://bucket/ckpt/LLaDA-8B-Instruct``, any scheme the path layer reaches): its files
  are copied, through :mod:`dllm_rl.paths`, to ``$DLLM_RL_CACHE/weights/<scheme>/<bucket>/<path>``
  (``DLLM_RL_CACHE`` defaults to ``~/.cache/dllm_rl``). Each copy is renamed into place with its
  source's modification time (for gs://, the object's update time, new on every upload), so a
  later call copies again exactly the files whose size or modification time changed (a re-upload
  of same-shaped weights has the same sizes) and the ones missing, and removes those an earlier
  call copied that the source no longer has; ``.dllm_rl_staged.json`` (written last) marks a
  complete copy and records each file's source size and time;
* a hub id ``org/name`` (optionally ``org/name@revision``): ``huggingface_hub.snapshot_download``
  into the hub cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``),
  from the cache alone when ``HF_HUB_OFFLINE=1``.

A spec is read as a hub id only when it is not a URL, no file or folder of that name exists, and
it is exactly two names joined by one ``/`` (letters, digits, ``.``, ``_``, ``-``), so a
mistyped local path that looks like ``org/name`` reaches the hub and fails there with a message
that says it was neither. Anything that cannot be had raises :class:`WeightsUnavailable` saying
how to get it (without network: ``hf download ID --local-dir DIR`` elsewhere, then the folder
copied here).
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
from typing import Callable

from dllm_rl import paths
from dllm_rl.errors import short_reason

HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)"
                    r"(?:@(?P<revision>[\w./-]+))?$")
MARKER = ".dllm_rl_staged.json"
# What a loader reads from a hub repository (no *.bin / *.pth duplicates of the safetensors).
WEIGHT_PATTERNS = ("*.json", "*.safetensors", "*.py", "*.txt", "*.model", "*.jinja", "*.tiktoken")
CONFIG_PATTERNS = ("*.json", "*.py")  # enough to plan a run (config.json, modeling code)
_CHUNK = 64 << 20


class WeightsUnavailable(FileNotFoundError):
  """A checkpoint spec that names no local folder and could not be fetched (the message says
  how to fetch it)."""


def cache_root() -> str:
  """``$DLLM_RL_CACHE`` or ``~/.cache/dllm_rl``: where gs:// checkpoints are staged."""
  return os.path.expanduser(os.environ.get("DLLM_RL_CACHE") or "~/.cache/dllm_rl")


def hub_id(spec: str) -> tuple[str, str | None] | None:
  """(repo id, revision) when ``spec`` reads as a hub id (see the module doc), else None."""
  if paths.is_url(spec) or os.path.exists(spec):
    return None
  match = HUB_ID.match(spec)
  return (match["repo"], match["revision"]) if match else None


def fetch_command(spec: str) -> str:
  """The command that puts ``spec`` where :func:`resolve_checkpoint` finds it offline."""
  return f"dllm-rl-data weights {spec}"


def how_to_fetch(repo: str, revision: str | None, cache: str) -> str:
  """What to do when the hub repository ``repo`` cannot be had here (``cache``: this machine's
  hub cache): fetch it on a machine with network and bring it here, as a folder given
  instead of the id or as the hub cache's folder. Running ``dllm-rl-data weights`` again
  here, offline, would fail the same way."""
  revision_flag = f" --revision {revision}" if revision else ""
  return (f"on a machine with network run `hf download {repo}{revision_flag} --local-dir DIR`,"
          " copy DIR here and give that folder instead of the id, or copy the hub cache's "
          f"models--{repo.replace('/', '--')} folder from there into {cache} here; or give a "
          "gs:// URL")


def _shown_cache() -> str:
  """The hub cache folder huggingface_hub uses here (its default spelled out)."""
  default = os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface", "hub")
  return os.path.expanduser(hub_cache() or default)


def _listing(root) -> dict[str, tuple[int, int]]:
  """relative path → (size, modification time in whole seconds) of every file under the epath
  ``root``."""
  out, todo = {}, [root]
  while todo:
    for child in todo.pop().iterdir():
      if child.is_dir():
        todo.append(child)
      else:
        info = child.stat()
        out[os.fspath(child.relative_to(root))] = (info.length, info.mtime)
  return out


def _is_copy_of(local: str, size: int, mtime: int) -> bool:
  """Whether ``local`` is :func:`stage`'s copy of the source version (size, mtime): each copy
  gets its source's mtime before it is renamed into place, so file and stamp change together
  (a crash or a concurrent stager leaves the old pair or the new one). A copy from before the
  stamp (its mtime is when it was written) or a local file edited since fails the check."""
  try:
    info = os.stat(local)
  except FileNotFoundError:
    return False
  return stat.S_ISREG(info.st_mode) and info.st_size == size and int(info.st_mtime) == mtime


def _staged_names(dst: str) -> set[str]:
  """The files the marker in ``dst`` lists (its current or its sizes-only format); none when
  there is no readable marker."""
  try:
    with open(os.path.join(dst, MARKER)) as f:
      files = json.load(f)["files"]
  except (OSError, ValueError, KeyError, TypeError):
    return set()
  return set(files) if isinstance(files, dict) else set()


def _inside(dst: str, rel: str) -> str | None:
  """``dst``/``rel``, or None when ``rel`` leads outside ``dst`` (an object name with "..")."""
  path = os.path.normpath(os.path.join(dst, rel))
  return path if path.startswith(os.path.join(os.path.normpath(dst), "")) else None


def _remove(path: str) -> None:
  try:
    os.remove(path)
  except FileNotFoundError:  # removed by a concurrent stager
    pass


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


def _tmp(path: str) -> str:
  """The temporary name ``path`` is written under before its rename:
  ``<path>.tmp-<host>-<pid>`` (concurrent stagers never see a half-written file; the host
  tells whose stager it was on a cache shared between hosts)."""
  return f"{path}.tmp-{socket.gethostname()}-{os.getpid()}"


def _remove_orphans(dst: str) -> None:
  """Remove the :func:`_tmp` files under ``dst`` written on this host by a stager that is no
  longer running (killed mid-copy: up to a shard's size each). Other hosts' are left alone."""
  host = socket.gethostname()
  for folder, _, names in os.walk(dst):
    for name in names:
      head, sep, owner = name.rpartition(".tmp-")
      owner_host, _, pid = owner.rpartition("-")
      if sep and head and owner_host == host and pid.isdigit() and not _pid_alive(int(pid)):
        _remove(os.path.join(folder, name))


def staging_dir(url: str, cache: str | None = None) -> str:
  """The local folder a URL's files are copied to."""
  scheme, rest = url.split("://", 1)
  return os.path.join(cache or cache_root(), "weights", scheme, *rest.strip("/").split("/"))


def staged_source(path: str, cache: str | None = None) -> str | None:
  """The URL whose :func:`staging_dir` copy ``path`` is or lies in (``CACHE/weights/gs/b/run``
  → ``gs://b/run``), None for a path outside the staging folders: what a message about a
  staged folder names, since the copy is not where the user's files are."""
  root = os.path.join(os.path.abspath(cache or cache_root()), "weights")
  rel = os.path.relpath(os.path.abspath(path), root)
  scheme, *rest = rel.split(os.sep)
  if rel.startswith(os.pardir) or not rest or scheme == os.curdir:
    return None
  return f"{scheme}://{'/'.join(rest)}"


def stage(url: str, *, cache: str | None = None, config_only: bool = False) -> str:
  """Copy the folder at ``url`` to :func:`staging_dir` (only files that are not already a copy
  of the source's version, :func:`_is_copy_of`), remove the files the last marker lists that
  the source no longer has, and return it. ``config_only``: the top-level ``*.json`` files
  only; nothing removed, no marker. A folder without ``config.json`` or ``model.json`` on top
  (no model) is staged in outline: its top-level ``*.json`` files and its folders, empty."""
  paths.check_backend(url)
  src = paths.resolve(url)
  if not src.is_dir():
    raise WeightsUnavailable(f"{url} is not a folder (expected a checkpoint folder with "
                             "config.json and *.safetensors, or a `convert import` output)")
  listing = _listing(src)
  folders = sorted({k.split("/", 1)[0] for k in listing if "/" in k})
  # Not a model folder (neither config.json nor a `convert import`'s model.json on top: a run's
  # workdir, one of its Orbax steps, a PEFT folder, a wrong prefix): the top-level JSON files
  # and folder names are all the loader reads to say what it is instead; a run's checkpoints
  # could take hours to copy before that message.
  outline = not config_only and not {"config.json", "model.json"} & set(listing)
  if config_only or outline:
    listing = {k: v for k, v in listing.items() if "/" not in k and k.endswith(".json")}
  dst = staging_dir(url, cache)
  _remove_orphans(dst)
  for name in folders if outline else ():
    if (local := _inside(dst, name)) is not None:
      os.makedirs(local, exist_ok=True)
  for rel, (size, mtime) in sorted(listing.items()):
    local = _inside(dst, rel)
    if local is None:
      raise WeightsUnavailable(f"{url}: the object {rel!r} would be copied outside the staging"
                               f" folder {dst}; rename it in the bucket")
    if _is_copy_of(local, size, mtime):
      continue
    os.makedirs(os.path.dirname(local), exist_ok=True)
    tmp = _tmp(local)
    try:
      with src.joinpath(rel).open("rb") as fin, open(tmp, "wb") as fout:
        for chunk in iter(lambda: fin.read(_CHUNK), b""):
          fout.write(chunk)
      os.utime(tmp, (mtime, mtime))  # the stamp _is_copy_of checks, renamed in with the bytes
      os.replace(tmp, local)
    except BaseException:
      _remove(tmp)  # a failed copy leaves no partial file of up to a shard's size behind
      raise
  if not (config_only or outline):
    # a file an earlier stage copied that the source no longer has (a sharded checkpoint
    # replaced by one model.safetensors: the loader would read the stale index and shards)
    for rel in sorted(_staged_names(dst) - set(listing)):
      gone = _inside(dst, rel)
      if gone is not None:
        _remove(gone)
    files = {rel: {"size": size, "mtime": mtime} for rel, (size, mtime) in listing.items()}
    tmp = _tmp(os.path.join(dst, MARKER))
    with open(tmp, "w") as f:
      json.dump({"source": url, "files": files}, f, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(dst, MARKER))
  return dst


def hub_cache() -> str | None:
  """The hub cache huggingface_hub uses, read from the environment now (None = its default)."""
  if os.environ.get("HF_HUB_CACHE"):
    return os.environ["HF_HUB_CACHE"]
  return os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None


def offline() -> bool:
  return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _complete(folder: str) -> bool:
  names = os.listdir(folder)
  return "config.json" in names and (any(n.endswith(".safetensors") for n in names)
                                     or "model.json" in names)


def from_hub(repo: str, revision: str | None = None, *, config_only: bool = False,
             download: Callable[..., str] | None = None) -> str:
  """The local snapshot of hub repository ``repo`` (downloaded unless cached; cache only when
  ``HF_HUB_OFFLINE=1``). ``download``: ``huggingface_hub.snapshot_download`` or a stand-in."""
  if download is None:
    from huggingface_hub import snapshot_download as download
  spec = repo + (f"@{revision}" if revision else "")
  local_only = offline()
  try:
    folder = download(repo, revision=revision, cache_dir=hub_cache(),
                      local_files_only=local_only,
                      allow_patterns=list(CONFIG_PATTERNS if config_only else WEIGHT_PATTERNS))
  except Exception as err:  # network stacks raise many types; every one means "not here"
    cache = _shown_cache()
    why = (f"is not in the hub cache ({cache}; HF_HUB_OFFLINE=1 downloads nothing). With "
           f"network here: `HF_HUB_OFFLINE=0 {fetch_command(spec)}`. Without, "
           if local_only else
           f"could not be downloaded ({short_reason(err)}). Without network here, ")
    raise WeightsUnavailable(
        f"{spec!r} is not a local folder, and as a Hugging Face hub id it {why}"
        f"{how_to_fetch(repo, revision, cache)}") from err
  if not config_only and not _complete(folder):  # (a download that failed keeps the cache's)
    online = "HF_HUB_OFFLINE=0 " if local_only else ""
    raise WeightsUnavailable(
        f"{spec!r}: the hub cache holds an incomplete snapshot ({folder} has no config.json or "
        f"no *.safetensors; *.bin weights are not read). With network here: `{online}"
        f"{fetch_command(spec)}` fetches the rest. Without, "
        f"{how_to_fetch(repo, revision, _shown_cache())}")
  return folder


def resolve_checkpoint(spec: str, *, config_only: bool = False,
                       download: Callable[..., str] | None = None) -> str:
  """A local folder holding the checkpoint ``spec`` names (module doc). ``config_only``: only
  what planning needs (config.json and the other top-level JSON files)."""
  spec = os.fspath(spec)
  if paths.is_url(spec):
    return stage(spec, config_only=config_only)
  spec = os.path.expanduser(spec)
  if os.path.isdir(spec):
    return os.path.abspath(spec)
  found = hub_id(spec)
  if found is not None:
    return from_hub(*found, config_only=config_only, download=download)
  what = "is a file, not a folder" if os.path.exists(spec) else "does not exist"
  raise WeightsUnavailable(f"{spec!r} {what}; give a checkpoint folder (config.json + "
                           "*.safetensors, or a `convert import` output), a gs:// folder, or a "
                           "hub id such as GSAI-ML/LLaDA-8B-Instruct")
