"""Benchmark: the masked sampler's cache modes (and the official LLaDA ``generate``) on an
HF LLaDA checkpoint folder.

    python -m dllm_rl.benchmarks.sampler --checkpoint DIR [--init-random]
        [--batch 16 --prompt 32 --gen 128 --steps 64 --block 32] [--repeats 5]
        [--official-llada LLaDA_REPO --official-modeling dLLM-RL_REPO
         --official-python /tmp/torchvenv/bin/python]
        [--accuracy-config configs/tiny_cpu.py --accuracy-workdir WORKDIR [--config.KEY=VALUE ...]]
        [--out results.json]

Speed: greedy ``low_confidence`` with ``stop_at_eos`` off (the official code does not stop
at EOS either), one jitted sampler per ``sampler.cache`` mode, timed after compilation.
Rounds alternate the modes (and the official ``generate``, run by a persistent subprocess)
so that machine load hits all of them alike; medians are reported. For each mode: tokens/s
(B·L per call), model calls/s (denoising steps, each one forward of whatever width), FLOP/s
from an analytic matmul count of what the mode computes (dllm_rl/train/flops.py, refreshes
included), as a fraction of this machine's matmul peak (median of jitted 1024³ float32
matmuls, measured in the same run), and the fraction of tokens equal to the exact sampler's.
With the official code: its tokens/s and the number of rows where the exact sampler's tokens
equal the official ones up to and including the official row's first EOS.

``--init-random`` writes a random LLaDA checkpoint to ``--checkpoint`` first (sizes from
--d-model/--layers/--heads/--mlp/--vocab; default: the issue-12 shapes, 3.4M parameters),
once: a folder that already holds one is reused at the same sizes and refused at others.

Official code: ``--official-llada`` is a checkout (or bare git dir) of ML-GSAI/LLaDA
(``generate.py``), ``--official-modeling`` one of Gen-Verse/dLLM-RL
(``models/llada/modeling_llada.py`` and ``configuration_llada.py``); they are copied to a
temporary folder at run time and run by ``--official-python`` (a venv with torch and
transformers, never this project's); nothing of theirs is part of this repository.

Accuracy: with ``--accuracy-config`` (e.g. the embedded default, configs/tiny_cpu.py) and a
workdir holding its trained checkpoint (``python -m dllm_rl.main --config=... --workdir=...``),
the held-out greedy test accuracy of each cache mode on the same checkpoint, at the config's
sampler shape and, with ``--accuracy-block-lens``, at other block lengths. Asserts nothing.
``--config.KEY=VALUE`` words apply to ``--accuracy-config`` as to ``dllm_rl.main`` (the
training run's overrides: a checkpoint trained at other model sizes is named before the speed
part, with the overrides that fit it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from dllm_rl.benchmarks.common import check_flags, check_model_sizes, description, matmul_peak

MODES = ("none", "prefix", "dual")


# ----------------------------------------------------------------------------- FLOP count

def call_flops(model_cfg, cfg, batch: int, prompt: int) -> float:
  """Model FLOPs of one call of the sampler ``cfg`` (a ``SamplerConfig``; every block at its
  full step budget, the prefix/dual refreshes of ``cache_refresh`` included):
  dllm_rl/train/flops.py's count, the one the runs' own ``mfu`` uses."""
  from dllm_rl.train.flops import sampler_flops
  return sampler_flops(model_cfg, cfg, batch, prompt)


# ----------------------------------------------------------------------------- helpers

def write_random_checkpoint(path: str, args) -> None:
  """A random LLaDA-architecture HF folder (mask = vocab − 1, EOS = pad = vocab − 2)."""
  import jax

  from dllm_rl.models import hf, hf_export
  from dllm_rl.models import transformer as T

  cfg = T.ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers,
                      n_heads=args.heads, n_kv_heads=args.heads,
                      head_dim=args.d_model // args.heads, mlp_hidden=args.mlp,
                      init_std=args.init_std)
  _, params = T.init_model(cfg, jax.random.key(args.seed))
  ids = hf.TokenIds(mask_id=args.vocab - 1, eos_id=args.vocab - 2, pad_id=args.vocab - 2,
                    bos_id=None, block_size=None)
  hf_export.export_checkpoint(params, cfg, ids, "llada", path)
  print(f"wrote a random LLaDA checkpoint ({T.count_params(params) / 1e6:.2f}M params) to {path}")


# --init-random's flags and the config.json keys write_random_checkpoint stores them under
_RANDOM_SIZES = (("d-model", "d_model"), ("layers", "n_layers"), ("heads", "n_heads"),
                 ("mlp", "mlp_hidden_size"), ("vocab", "vocab_size"))


def init_random_problem(path: str, args) -> str | None:
  """Why ``--init-random`` cannot use ``--checkpoint path``, or None. A missing or empty folder
  is written; one already written is reused (the checkpoint is written once), but only when
  its config.json holds the sizes the flags ask for: the sizes of another one were silently
  measured instead."""
  if not os.path.isdir(path) or not os.listdir(path):
    return None
  try:
    with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
      held = json.load(fh)
  except (OSError, ValueError) as err:
    return (f"--checkpoint {path}: not empty and no readable config.json ({type(err).__name__});"
            " --init-random writes a new folder: name a new one")
  diff = [f"{key} {held.get(key)} vs --{flag} {getattr(args, flag.replace('-', '_'))}"
          for flag, key in _RANDOM_SIZES if held.get(key) != getattr(args, flag.replace("-", "_"))]
  if diff:
    return (f"--checkpoint {path} already holds a checkpoint of other sizes ({', '.join(diff)});"
            " --init-random reuses a folder it wrote only at the same sizes: name a new folder,"
            " or give its sizes")
  from dllm_rl.models import hf
  try:  # a write cut short leaves config.json beside missing or truncated weights
    hf.weight_files(path)
  except (OSError, ValueError) as err:
    return (f"--checkpoint {path} holds config.json but not its whole weights ({err}); a write"
            " was cut short: delete the folder or name a new one")
  return None


def _read_source(repo: str, rel: str) -> bytes:
  """A file of a checkout, or of a bare git dir at HEAD."""
  path = os.path.join(repo, rel)
  if os.path.isfile(path):
    with open(path, "rb") as fh:
      return fh.read()
  return subprocess.run(["git", "--git-dir", repo, "show", f"HEAD:{rel}"], check=True,
                        capture_output=True).stdout


class Official:
  """The official ``generate`` in a persistent subprocess (line-delimited JSON)."""

  def __init__(self, python: str, llada_repo: str, modeling_repo: str, checkpoint: str,
               threads: int):
    self.tmp = tempfile.mkdtemp(prefix="llada_official_")
    with open(os.path.join(self.tmp, "generate.py"), "wb") as fh:
      fh.write(_read_source(llada_repo, "generate.py"))
    pkg = os.path.join(self.tmp, "llada_official")
    os.makedirs(pkg)
    open(os.path.join(pkg, "__init__.py"), "w").close()
    for name in ("modeling_llada.py", "configuration_llada.py"):
      with open(os.path.join(pkg, name), "wb") as fh:
        fh.write(_read_source(modeling_repo, f"models/llada/{name}"))
    driver = os.path.join(os.path.dirname(os.path.abspath(__file__)), "official_llada_driver.py")
    self.proc = subprocess.Popen([python, driver, self.tmp, checkpoint, str(threads)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    self.info = self._read()

  def _read(self) -> dict:
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError("the official generate driver exited (see its stderr above)")
    return json.loads(line)

  def run(self, prompt, *, steps: int, gen: int, block: int, mask_id: int) -> dict:
    req = {"prompt": prompt.tolist(), "steps": steps, "gen_length": gen, "block_length": block,
           "mask_id": mask_id}
    self.proc.stdin.write(json.dumps(req) + "\n")
    self.proc.stdin.flush()
    return self._read()

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.stdin.write("\n")
      self.proc.stdin.flush()
      self.proc.wait(timeout=60)
    shutil.rmtree(self.tmp, ignore_errors=True)


def rows_equal_to_first_eos(ours, official, eos_id: int) -> int:
  """Rows whose tokens equal the official row up to and including its first EOS."""
  import numpy as np

  same = 0
  for a, o in zip(ours, official):
    hits = np.flatnonzero(o == eos_id)
    n = hits[0] + 1 if hits.size else o.size
    same += int(np.array_equal(a[:n], o[:n]))
  return same


# ----------------------------------------------------------------------------- sections

def speed(args) -> dict:
  import dataclasses
  import functools

  import jax
  import jax.numpy as jnp
  import numpy as np

  from dllm_rl.models import hf
  from dllm_rl.sampling import sampler as S
  from dllm_rl.train.flops import forward_flops

  model_cfg, ids, graphdef, params, family = hf.load_checkpoint(args.checkpoint, dtype=args.dtype)
  if family != "llada":
    raise SystemExit(f"{args.checkpoint}: a {family} checkpoint; this benchmarks the masked"
                     " sampler")
  b, p, l = args.batch, args.prompt, args.gen
  rng = np.random.default_rng(args.seed)
  prompt = rng.integers(0, min(ids.mask_id, ids.eos_id or ids.mask_id), (b, p)).astype(np.int32)
  base = S.SamplerConfig(completion_len=l, steps=args.steps, block_len=args.block,
                         temperature=0.0, remasking="low_confidence", stop_at_eos=False)
  fns, outs, times = {}, {}, {m: [] for m in args.modes}
  for mode in args.modes:
    fns[mode] = jax.jit(functools.partial(S.sample, graphdef, cfg=dataclasses.replace(
        base, cache=mode, cache_refresh=args.cache_refresh), mask_id=ids.mask_id,
        eos_id=ids.eos_id))
    t0 = time.perf_counter()
    jax.block_until_ready(fns[mode](params, jnp.asarray(prompt), jnp.ones((b, p), bool),
                                    jax.random.key(0)))
    print(f"compiled {mode!r} in {time.perf_counter() - t0:.1f}s", flush=True)
  official = None
  if args.official_llada:
    official = Official(args.official_python, args.official_llada, args.official_modeling,
                        args.checkpoint, args.threads)
    print(f"official generate: {official.info}", flush=True)
    official.run(prompt, steps=args.steps, gen=l, block=args.block, mask_id=ids.mask_id)  # warm-up
    times["official"] = []
  peaks = []
  try:
    for r in range(args.repeats):
      peaks.append(matmul_peak())
      for mode in args.modes:
        t0 = time.perf_counter()
        out = fns[mode](params, jnp.asarray(prompt), jnp.ones((b, p), bool), jax.random.key(0))
        outs[mode] = np.asarray(out.completion_BL)  # blocks until done
        times[mode].append(time.perf_counter() - t0)
        print(f"round {r}: {mode} {times[mode][-1]:.2f}s ({b * l / times[mode][-1]:.0f}"
              " tokens/s)", flush=True)  # each as it lands: a cut run keeps what it timed
      if official is not None:
        res = official.run(prompt, steps=args.steps, gen=l, block=args.block, mask_id=ids.mask_id)
        times["official"].append(res["seconds"])
        outs["official"] = np.asarray(res["output"])[:, p:]
        print(f"round {r}: official {times['official'][-1]:.2f}s", flush=True)
  finally:
    if official is not None:
      official.close()
  peak = float(np.median(peaks))
  med = {k: float(np.median(v)) for k, v in times.items()}
  result = {"shape": dict(batch=b, prompt=p, gen=l, steps=args.steps, block=args.block),
            "matmul_peak_gflops": peak / 1e9, "modes": {}, "load_avg": os.getloadavg()}
  for mode in args.modes:
    flops = call_flops(model_cfg, dataclasses.replace(
        base, cache=mode, cache_refresh=args.cache_refresh), b, p)
    result["modes"][mode] = {
        "seconds": med[mode], "tokens_per_s": b * l / med[mode],
        "model_calls_per_s": args.steps / med[mode], "gflop_per_call": flops / 1e9,
        "gflops": flops / med[mode] / 1e9, "fraction_of_peak": flops / med[mode] / peak,
        "token_agreement_with_exact": float((outs[mode] == outs["none"]).mean())
        if "none" in outs else None}
  if official is not None:
    n = p + l  # the official code: every step a full forward, head on all N rows
    flops = b * args.steps * forward_flops(model_cfg, n)
    result["official"] = {"seconds": med["official"], "tokens_per_s": b * l / med["official"],
                          "torch": official.info.get("torch"), "gflop_per_call": flops / 1e9,
                          "fraction_of_peak": flops / med["official"] / peak}
    if "none" in outs:
      result["official"]["exact_rows_equal_to_first_eos"] = rows_equal_to_first_eos(
          outs["none"], outs["official"], ids.eos_id)
      for mode in args.modes:
        result["modes"][mode]["speedup_vs_official"] = med["official"] / med[mode]
  return result


def accuracy(args) -> dict:
  import dataclasses

  from dllm_rl.train import evaluation
  from dllm_rl.train.context import build_context
  from dllm_rl.train.eval_mode import label, load_policy, resolve_target

  config = args.accuracy_cfg  # loaded, overridden and checked by _check_accuracy_flags
  ctx = build_context(config, args.accuracy_workdir)
  ref = resolve_target(config, args.accuracy_workdir)  # eval.phase / eval.checkpoint_step
  ref, graphdef, params = load_policy(ctx, ref)
  out = {"weights": label(ref), "by_block_len": {}}
  for block_len in [ctx.sampler_cfg.block_len] + list(args.accuracy_block_lens):
    blocks = ctx.sampler_cfg.completion_len // block_len
    steps = max(ctx.sampler_cfg.steps // blocks, 1) * blocks
    row = {}
    for mode in args.modes:
      cfg = dataclasses.replace(ctx.sampler_cfg, block_len=block_len, steps=steps, cache=mode,
                                cache_refresh=args.cache_refresh)
      row[mode] = evaluation.greedy_accuracy(
          graphdef, params, task=ctx.task, tokenizer=ctx.tokenizer,
          examples=ctx.test.examples, arrays=ctx.test.arrays, cfg=cfg,
          batch_size=config.eval.batch_size)["accuracy"]
    out["by_block_len"][f"block {block_len}, {steps} steps"] = row
  out["cache_refresh"] = args.cache_refresh
  out["test_prompts"] = len(ctx.test.examples)
  return out


def _check_accuracy_flags(ap, args, overrides: list[str]) -> None:
  """``ap.error`` for an --accuracy-config that does not load or validate with the
  ``--config.KEY=VALUE`` ``overrides``, a missing --accuracy-workdir, a checkpoint there that
  the config does not describe (other model sizes: named with the overrides that fit it), or an
  --accuracy-block-lens value not dividing the completion. Sets ``args.accuracy_cfg``."""
  from dllm_rl.config import cli, load_config_file
  from dllm_rl.config.overrides import apply_overrides
  from dllm_rl.errors import ConfigError
  from dllm_rl.train import layout_errors
  from dllm_rl.train.eval_mode import resolve_target
  from dllm_rl.train.validate import validate

  if not os.path.isdir(args.accuracy_workdir):
    ap.error(f"--accuracy-workdir {args.accuracy_workdir}: not a folder (the config's run)")
  try:
    config = load_config_file(args.accuracy_config)
  except (ConfigError, OSError) as err:
    ap.error(f"--accuracy-config {args.accuracy_config}: {err}")
  errors = apply_overrides(config, cli.split_overrides(overrides)[1])
  try:
    validate(config)
  except ConfigError as err:
    errors += getattr(err, "errors", [err])
  if errors:
    ap.error(f"--accuracy-config {args.accuracy_config}: " + "; ".join(map(str, errors)))
  l = config.data.completion_len
  for block_len in args.accuracy_block_lens:
    if l % block_len:
      ap.error(f"--accuracy-block-lens: {block_len} does not divide the config's "
               f"data.completion_len {l}")
  try:
    ref = resolve_target(config, args.accuracy_workdir)
  except ConfigError as err:
    ap.error(f"--accuracy-workdir {args.accuracy_workdir}: {err}")
  trained = ref and layout_errors.saved_config(ref.directory, ref.step)
  changes = layout_errors.config_changes(trained, config) if trained else []
  if changes:
    said = ", ".join(f"{k}={was!r} (--accuracy-config: {now!r})" for k, was, now in changes)
    fix = " ".join(f"--config.{k}={layout_errors.flag_text(was)}" for k, was, _ in changes)
    ap.error(f"--accuracy-workdir {args.accuracy_workdir}: its {ref.label} checkpoint was"
             f" trained with {said}: pass {fix} (or the --config file it was trained with)")
  args.accuracy_cfg = config


def main(argv=None) -> None:
  argv = list(sys.argv[1:] if argv is None else argv)
  overrides = [a for a in argv if a.startswith("--config.")]
  ap = argparse.ArgumentParser(prog="python -m dllm_rl.benchmarks.sampler",
                               description=description(__doc__),
                               epilog="Any --config.KEY=VALUE applies to --accuracy-config (the"
                                      " overrides its run was trained with).")
  ap.add_argument("--checkpoint", help="HF LLaDA folder (written first with --init-random)")
  ap.add_argument("--init-random", action="store_true")
  ap.add_argument("--d-model", type=int, default=256)
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--heads", type=int, default=8)
  ap.add_argument("--mlp", type=int, default=688)
  ap.add_argument("--vocab", type=int, default=512)
  ap.add_argument("--init-std", type=float, default=0.02)
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--prompt", type=int, default=32)
  ap.add_argument("--gen", type=int, default=128)
  ap.add_argument("--steps", type=int, default=64)
  ap.add_argument("--block", type=int, default=32)
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                  help="compute dtype of this project's sampler (the official code: float32)")
  ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
  ap.add_argument("--cache-refresh", type=int, default=0,
                  help="sampler.cache_refresh of the prefix/dual modes")
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--threads", type=int, default=2, help="torch threads of the official code")
  ap.add_argument("--official-llada", default="")
  ap.add_argument("--official-modeling", default="")
  ap.add_argument("--official-python", default="/tmp/torchvenv/bin/python")
  ap.add_argument("--accuracy-config", default="")
  ap.add_argument("--accuracy-workdir", default="")
  ap.add_argument("--accuracy-block-lens", type=int, nargs="*", default=[])
  ap.add_argument("--out", default="")
  args = ap.parse_args([a for a in argv if not a.startswith("--config.")])
  if overrides and not args.accuracy_config:
    ap.error(f"{overrides[0]}: --config.KEY=VALUE overrides apply to --accuracy-config;"
             " give it (and --accuracy-workdir)")
  if bool(args.official_llada) != bool(args.official_modeling):
    ap.error("--official-llada and --official-modeling go together")
  check_flags(ap, args, positive=("d-model", "layers", "heads", "mlp", "batch", "prompt", "gen",
                                  "steps", "block", "repeats", "threads", "accuracy-block-lens"),
              nonnegative=("cache-refresh",))
  if not args.checkpoint and not args.accuracy_config:
    ap.error("nothing to measure: give --checkpoint (speed) and/or --accuracy-config (accuracy)")
  if args.accuracy_config and not args.accuracy_workdir:
    ap.error("--accuracy-config needs --accuracy-workdir (the run folder of its checkpoint)")
  if args.accuracy_config:  # found before the speed part's minutes
    _check_accuracy_flags(ap, args, overrides)
  check_model_sizes(ap, args)
  if args.gen % args.block or args.steps % (args.gen // args.block):
    ap.error(f"--gen {args.gen} must be a multiple of --block {args.block}, and --steps "
             f"{args.steps} a multiple of the {args.gen // args.block} blocks")
  if args.steps // (args.gen // args.block) > args.block:
    ap.error(f"--steps {args.steps} is {args.steps // (args.gen // args.block)} steps per block"
             f" of {args.block} tokens: at most one step per token (steps <= --gen {args.gen})")
  if args.checkpoint and args.init_random:
    problem = init_random_problem(args.checkpoint, args)
    if problem:
      ap.error(problem)
  if args.checkpoint and not args.init_random and not os.path.isfile(
      os.path.join(args.checkpoint, "config.json")):
    ap.error(f"--checkpoint {args.checkpoint}: no config.json there (--init-random writes a "
             "random LLaDA checkpoint to it)")

  import jax

  result = {"jax": jax.__version__, "backend": jax.default_backend(),
            "cpu_count": os.cpu_count()}
  if args.checkpoint:
    if args.init_random and not os.path.isfile(os.path.join(args.checkpoint, "config.json")):
      write_random_checkpoint(args.checkpoint, args)
    result["speed"] = speed(args)
  if args.accuracy_config:
    result["accuracy"] = accuracy(args)
  print(json.dumps(result, indent=2))
  if args.out:
    with open(args.out, "w") as fh:
      json.dump(result, fh, indent=2)


if __name__ == "__main__":
  main(sys.argv[1:])
