#!/usr/bin/env bash
# Single-GPU check (issue 12), one script under one time limit. Not run yet: no GPU was
# available when it was written; its figures go in README.md once it has run.
#
#   bash launch/gpu_check.sh [OUT_DIR]        (GPU_CHECK_LIMIT_S=540 by default)
#
# 1. staircase attention: compiled Pallas kernel vs dense reference vs
#    jax.nn.dot_product_attention, forward and forward+backward, L = 1k..16k, bfloat16;
# 2. masked sampler tokens/s per sampler.cache mode at ~1B shapes (random checkpoint);
# 3. RL step MFU at ~1B shapes.
# Each part gets a share of the limit; a part that runs out is cut and said so.
set -u
OUT=${1:-${OUT:-/tmp/gpu_check}}
LIMIT=${GPU_CHECK_LIMIT_S:-540}
PY=${PYTHON:-python}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1 || true
run() {  # run NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  echo "== $name (limit ${secs}s)" | tee -a "$OUT/summary.txt"
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && echo "   $name: cut at ${secs}s" | tee -a "$OUT/summary.txt"
  tail -n 25 "$OUT/$name.log" | tee -a "$OUT/summary.txt"
}
run staircase $((LIMIT * 2 / 5)) "$PY" -m dllm_rl.benchmarks.staircase \
  --lengths 1024 2048 4096 8192 16384 --impl pallas --dtype bfloat16 --repeats 5
run sampler $((LIMIT * 3 / 10)) "$PY" -m dllm_rl.benchmarks.sampler \
  --checkpoint "$OUT/llada_1b" --init-random --d-model 2048 --layers 16 --heads 16 \
  --mlp 5632 --vocab 32768 --batch 32 --prompt 256 --gen 256 --steps 128 --block 32 \
  --repeats 3 --dtype bfloat16 --out "$OUT/sampler.json"
run rl_step_mfu $((LIMIT * 3 / 10)) "$PY" -m dllm_rl.benchmarks.rl_step_mfu --steps 5
echo "done; logs in $OUT"
