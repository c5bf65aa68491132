"""HF checkpoint conversion CLI (LLaDA, SDAR, Dream, LLaDA2 MoE): import, export, round trip.

    python -m dllm_rl.convert import    --hf_dir HF_DIR --out CKPT_DIR [--dtype float32]
    python -m dllm_rl.convert export    --ckpt CKPT_DIR --hf_dir OUT_DIR [--dtype bfloat16]
                                        [--max_shard_bytes 5e9]
    python -m dllm_rl.convert roundtrip --hf_dir HF_DIR --tmp TMP_DIR

An imported checkpoint (``CKPT_DIR``) holds:

* ``model.json`` — ``{"format": "dllm_rl.hf_import/1", "family": "llada"|"sdar"|"dream"|"llada2",
  "model_config": {ModelConfig fields; dtypes as names}, "token_ids": {TokenIds
  fields}, "hf_config": the original config.json, "source": HF_DIR}``;
* ``params/0/`` — the ``nnx.State`` of parameters, saved with
  :class:`dllm_rl.infra.checkpoint.Checkpointer` as step 0 (meta = the same dict);
* ``hf_extra/`` — the HF folder's other small files (tokenizer, modeling code,
  generation config), copied back by ``export``.

The trainer loads it with :func:`load_imported`, which restores every array
straight onto its sharding. ``roundtrip`` imports, exports and checks that every
exported tensor equals the original byte for byte (exit 1 otherwise). Each
command prints its throughput (MB of tensors per second) and the peak RSS.
Bad input (missing folder, unsupported architecture, missing tensor, shape
mismatch, existing output) exits with status 2 and a message naming it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from dllm_rl.infra.checkpoint import Checkpointer
from dllm_rl.models import hf
from dllm_rl.models.transformer import ModelConfig, abstract_model
from dllm_rl.parallel.mesh import make_mesh
from dllm_rl.parallel.shard import param_shardings

FORMAT = "dllm_rl.hf_import/1"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")
_EXTRA_MAX_BYTES = 100_000_000  # tokenizer / code / generation config, never weights
_SKIP = ("config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")


def _peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _tensor_bytes(hf_dir: str) -> int:
  files, _ = hf.tensor_index(hf_dir)
  return sum(os.path.getsize(f) for f in set(files.values()))


def _meta(cfg: ModelConfig, ids: hf.TokenIds, family: str, hf_config: dict, source: str) -> dict:
  model_config = dataclasses.asdict(cfg)
  model_config.update(dtype=np.dtype(cfg.dtype).name, param_dtype=np.dtype(cfg.param_dtype).name)
  return {"format": FORMAT, "family": family, "model_config": model_config,
          "token_ids": dataclasses.asdict(ids), "hf_config": hf_config,
          "source": os.path.abspath(source)}


def import_hf(hf_dir: str, out_dir: str, *, dtype: str = "float32", mesh=None) -> dict[str, Any]:
  """HF folder → imported checkpoint in ``out_dir``; returns timing stats."""
  if os.path.exists(os.path.join(out_dir, "model.json")):
    raise FileExistsError(f"{out_dir} already holds an imported checkpoint; use a new folder")
  hf_config = hf.read_hf_config(hf_dir)
  t0 = time.perf_counter()
  cfg, ids, _, params, family = hf.load_checkpoint(hf_dir, mesh=mesh, dtype=dtype)  # LoadedModel
  jax.block_until_ready(params)
  t1 = time.perf_counter()
  meta = _meta(cfg, ids, family, hf_config, hf_dir)
  with Checkpointer(os.path.join(out_dir, "params"), keep=1,
                    async_save=False) as ckpt:
    ckpt.save(0, params, meta)
  extra = os.path.join(out_dir, "hf_extra")
  os.makedirs(extra, exist_ok=True)
  for name in sorted(os.listdir(hf_dir)):
    src = os.path.join(hf_dir, name)
    if (os.path.isfile(src) and name not in _SKIP and not name.endswith(_WEIGHT_SUFFIXES)
        and os.path.getsize(src) <= _EXTRA_MAX_BYTES):
      shutil.copy2(src, os.path.join(extra, name))
  with open(os.path.join(out_dir, "model.json"), "w") as f:
    json.dump(meta, f, indent=2)
  return {"family": family, "bytes": _tensor_bytes(hf_dir), "load_s": t1 - t0,
          "total_s": time.perf_counter() - t0}


class ImportedModel(NamedTuple):
  """A ``convert import`` folder loaded by :func:`load_imported`."""

  model_cfg: ModelConfig
  token_ids: hf.TokenIds
  graphdef: Any
  params: Any          # nnx.State placed on its shardings
  family: str
  hf_config: dict      # the source config.json


def is_imported(path: str) -> bool:
  """A folder written by ``python -m dllm_rl.convert import`` (Orbax params + model.json)."""
  return os.path.isfile(os.path.join(path, "model.json"))


def read_meta(ckpt_dir: str) -> dict[str, Any]:
  """The ``model.json`` of an imported folder (format checked): model_config, token_ids,
  family, hf_config, source."""
  path = os.path.join(ckpt_dir, "model.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} not found (not a folder written by `convert import`)")
  with open(path) as f:
    meta = json.load(f)
  if meta.get("format") != FORMAT:
    raise ValueError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
  return meta


def load_imported(ckpt_dir: str, *, mesh=None, param_dtype: str | None = None,
                  meta: dict[str, Any] | None = None) -> ImportedModel:
  """An imported checkpoint → :class:`ImportedModel`, params restored onto
  ``param_shardings`` on ``mesh`` (default: one device), in ``param_dtype`` (default: the
  dtype they were imported in). ``meta``: its :func:`read_meta`, when already read."""
  meta = meta if meta is not None else read_meta(ckpt_dir)
  mc = dict(meta["model_config"])
  mc.update(dtype=jnp.dtype(mc["dtype"]).type,
            param_dtype=jnp.dtype(param_dtype or mc["param_dtype"]).type)
  cfg, ids = ModelConfig(**mc), hf.TokenIds(**meta["token_ids"])
  mesh = mesh if mesh is not None else make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
  graphdef, abstract = abstract_model(cfg)
  target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, param_shardings(abstract, mesh))
  with Checkpointer(os.path.join(ckpt_dir, "params"), keep=1,
                    async_save=False) as ckpt:
    params, _ = ckpt.restore(target, step=0)
  return ImportedModel(cfg, ids, graphdef, params, meta["family"], meta["hf_config"])


def export_hf(ckpt_dir: str, hf_dir: str, *, dtype: str | None = None,
              max_shard_bytes: float = 5e9) -> dict[str, Any]:
  """Imported checkpoint → HF folder ``hf_dir`` (config.json from the import)."""
  if os.path.isdir(hf_dir) and any(n.endswith(".safetensors") or n == "config.json"
                                   for n in os.listdir(hf_dir)):
    raise FileExistsError(f"{hf_dir} already holds an HF checkpoint; use a new folder")
  t0 = time.perf_counter()
  cfg, ids, _, params, family, hf_config = load_imported(ckpt_dir)
  t1 = time.perf_counter()
  hf.export_checkpoint(params, cfg, ids, family, hf_dir, hf_config=hf_config,
                       max_shard_bytes=max_shard_bytes, dtype=dtype)
  t2 = time.perf_counter()
  extra = os.path.join(ckpt_dir, "hf_extra")
  if os.path.isdir(extra):
    for name in os.listdir(extra):
      shutil.copy2(os.path.join(extra, name), os.path.join(hf_dir, name))
  return {"family": family, "bytes": _tensor_bytes(hf_dir), "restore_s": t1 - t0,
          "write_s": t2 - t1, "total_s": time.perf_counter() - t0}


def compare_tensors(a_dir: str, b_dir: str) -> list[str]:
  """Differences between two HF folders' tensors (names, dtypes, shapes, bytes); [] = equal."""
  a_files, _ = hf.tensor_index(a_dir)
  b_files, _ = hf.tensor_index(b_dir)
  problems = [f"only in {a_dir}: {n}" for n in sorted(set(a_files) - set(b_files))]
  problems += [f"only in {b_dir}: {n}" for n in sorted(set(b_files) - set(a_files))]
  for name in sorted(set(a_files) & set(b_files)):
    with safe_open(a_files[name], framework="numpy") as fa, \
         safe_open(b_files[name], framework="numpy") as fb:
      sa, sb = fa.get_slice(name), fb.get_slice(name)
      if (sa.get_dtype(), sa.get_shape()) != (sb.get_dtype(), sb.get_shape()):
        problems.append(f"{name}: {sa.get_dtype()}{sa.get_shape()} vs "
                        f"{sb.get_dtype()}{sb.get_shape()}")
      elif fa.get_tensor(name).tobytes() != fb.get_tensor(name).tobytes():
        problems.append(f"{name}: bytes differ")
  return problems


def _source_dtype(hf_dir: str) -> str:
  files, _ = hf.tensor_index(hf_dir)
  name = sorted(files)[0]
  with safe_open(files[name], framework="numpy") as f:
    return np.dtype(hf.ST_DTYPES[f.get_slice(name).get_dtype()]).name


def _report(what: str, stats: dict[str, Any]) -> None:
  mb = stats["bytes"] / 1e6
  parts = ", ".join(f"{k} {v:.3f}" for k, v in stats.items() if k.endswith("_s") and k != "total_s")
  print(f"{what} [{stats['family']}]: {mb:.2f} MB in {stats['total_s']:.3f} s "
        f"({mb / max(stats['total_s'], 1e-9):.1f} MB/s; {parts}); "
        f"peak RSS {_peak_rss_mb():.0f} MB")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m dllm_rl.convert", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("import", help="HF folder -> Orbax params + model.json")
  p.add_argument("--hf_dir", required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  p = sub.add_parser("export", help="imported checkpoint -> HF folder")
  p.add_argument("--ckpt", required=True)
  p.add_argument("--hf_dir", required=True)
  p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                 help="tensor dtype written (default: the params' dtype)")
  p.add_argument("--max_shard_bytes", type=float, default=5e9)
  p = sub.add_parser("roundtrip", help="import, export and compare tensors byte for byte")
  p.add_argument("--hf_dir", required=True)
  p.add_argument("--tmp", required=True)
  args = parser.parse_args(argv)
  try:
    if args.command == "import":
      _report("import", import_hf(args.hf_dir, args.out, dtype=args.dtype))
    elif args.command == "export":
      _report("export", export_hf(args.ckpt, args.hf_dir, dtype=args.dtype,
                                  max_shard_bytes=args.max_shard_bytes))
    else:
      os.makedirs(args.tmp, exist_ok=True)
      work = tempfile.mkdtemp(prefix="roundtrip_", dir=args.tmp)
      ckpt, out = os.path.join(work, "ckpt"), os.path.join(work, "hf")
      _report("import", import_hf(args.hf_dir, ckpt))
      _report("export", export_hf(ckpt, out, dtype=_source_dtype(args.hf_dir)))
      problems = compare_tensors(args.hf_dir, out)
      if problems:
        print(f"roundtrip FAILED ({len(problems)} differences):\n  " + "\n  ".join(problems[:20]))
        return 1
      n = len(hf.tensor_index(out)[0])
      print(f"roundtrip OK: {n} tensors byte-identical ({out})")
  except (FileNotFoundError, FileExistsError, NotADirectoryError, ValueError, KeyError,
          json.JSONDecodeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


def run() -> None:
  """Console-script entry point (pyproject.toml): ``dllm-rl-convert``."""
  sys.exit(main())


if __name__ == "__main__":
  run()
