"""Runs the official LLaDA ``generate`` for :mod:`dllm_rl.benchmarks.sampler`, in its own
Python (a venv with torch + transformers; this file imports nothing from dllm_rl).

    <torch python> official_llada_driver.py SOURCE_DIR CHECKPOINT_DIR THREADS

SOURCE_DIR holds a local copy of the official code, laid out by the benchmark at run time
(never committed here): ``generate.py`` (ML-GSAI/LLaDA) and a package ``llada_official/``
with ``modeling_llada.py`` and ``configuration_llada.py``. The model is loaded once with
``LLaDAModelLM.from_pretrained(CHECKPOINT_DIR)`` in float32; then every stdin line is a JSON
request ``{"prompt": [[ids]], "steps", "gen_length", "block_length", "mask_id"}`` answered on
stdout by one JSON line ``{"seconds": wall time of generate, "output": [[ids]]}`` (greedy,
``low_confidence``, no CFG, no attention mask). An empty line ends the driver.
"""

import json
import sys
import time


def _arguments(argv: list[str]) -> tuple[str, str, int]:
  """SOURCE_DIR, CHECKPOINT_DIR and THREADS from ``argv`` (``sys.argv``). ``--help`` prints
  this module's docstring and exits 0; other arguments than those three print it with the
  problem on stderr and exit 2 (was: an IndexError / ValueError traceback)."""
  args = argv[1:]
  if any(a in ("-h", "--help") for a in args):
    print(__doc__)
    raise SystemExit(0)
  problem = None
  if len(args) != 3:
    problem = f"expected SOURCE_DIR CHECKPOINT_DIR THREADS, got {len(args)} argument(s)"
  elif not args[2].isdigit() or int(args[2]) < 1:
    problem = f"THREADS must be a positive integer, got {args[2]!r}"
  if problem:
    print(f"{__doc__}\nerror: {problem}", file=sys.stderr)
    raise SystemExit(2)
  return args[0], args[1], int(args[2])


def main() -> None:
  source, checkpoint, threads = _arguments(sys.argv)
  sys.path.insert(0, source)
  import torch

  torch.set_num_threads(threads)
  from generate import generate  # the official sampler
  from llada_official.modeling_llada import LLaDAModelLM

  model = LLaDAModelLM.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()
  print(json.dumps({"ready": True, "torch": torch.__version__, "threads": threads}), flush=True)
  for line in sys.stdin:
    if not line.strip():
      break
    req = json.loads(line)
    prompt = torch.tensor(req["prompt"], dtype=torch.long)
    t0 = time.perf_counter()
    out = generate(model, prompt, steps=req["steps"], gen_length=req["gen_length"],
                   block_length=req["block_length"], temperature=0.0, cfg_scale=0.0,
                   remasking="low_confidence", mask_id=req["mask_id"])
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "output": out.tolist()}), flush=True)


if __name__ == "__main__":
  main()
