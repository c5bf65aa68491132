#!/usr/bin/env bash
# Single-GPU check (issue 12), one script under one time limit. First run on a lent H200
# on 2026-12-04 (through launch/gpu_lease.sh): docs/gpu.md.
#
#   bash launch/gpu_check.sh [OUT_DIR]        (GPU_CHECK_LIMIT_S=540 by default)
#   GPU_CHECK_PARTS=study GPU_CHECK_LIMIT_S=590 bash launch/gpu_check.sh [OUT_DIR]  (the study)
#
# 1. staircase attention: compiled Pallas kernels (Triton and Mosaic GPU:
#    GPU_CHECK_STAIRCASE_IMPLS, default 'pallas mosaic_gpu') vs dense reference vs
#    jax.nn.dot_product_attention, forward and forward+backward, L = 1k..16k, bfloat16;
# 2. masked sampler tokens/s per sampler.cache mode at ~1B shapes (random checkpoint);
# 3. RL step MFU at ~1B shapes;
# 4. the MoE experts' grouped matmul (model.moe_dispatch) at one LLaDA2.0-mini layer's shapes,
#    bfloat16: the tiled dispatch (never yet run on a GPU; also at tiles of 256 and 512 rows),
#    JAX's Mosaic GPU kernels (mosaic_gpu, never yet run on a GPU) and XLA's ragged dot (its
#    dense expansion is expected to fail out of memory there: the row then says so);
# 5. (only when GPU_CHECK_PARTS names it: it needs the whole limit) the study's main arms at
#    --scale=gpu --quick (dllm_rl/config/testbeds.py: gpu; ~85M parameters, 128-token
#    completions in blocks of 32, the official estimator; on one H200 the 11 main arms take
#    ~11 min and the 7 at the default lr 8 min by the times measured there: python -m
#    dllm_rl.study.sizing gpu --quick --measured=docs/results_gpu_chain_quick), reports in
#    $OUT/study/{stability,steprs}.md.
# Each part gets a share of the limit (the study: 3/4 stability, 1/4 StepRS); a part that
# runs out is cut and said so (the study resumes from its finished arms when rerun with the
# same OUT_DIR).
set -u
case ${1:-} in -h|--help) sed -n '2,/^set -u/{/^#/p}' "$0" | cut -c3-; exit 0 ;; esac
OUT=${1:-${OUT:-/tmp/gpu_check}}
LIMIT=${GPU_CHECK_LIMIT_S:-540}
PY=${PYTHON:-python}
PARTS=" ${GPU_CHECK_PARTS:-staircase sampler rl_step_mfu moe} "
# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh" || exit 1  # whole_number (its die: below); run is ours
# Checked before anything runs: a typo would otherwise spend a lease doing nothing.
die() { echo "gpu_check.sh: $*" >&2; exit 2; }
# (an option was taken for OUT_DIR, and mkdir failed on it; a second argument was dropped)
[[ $OUT != -* ]] || die "unknown option '$OUT': OUT_DIR is the only argument, and the" \
    "settings are GPU_CHECK_* variables (see --help)"
[ $# -le 1 ] || die "got $# arguments: OUT_DIR is the only one (see --help)"
whole_number "GPU_CHECK_LIMIT_S (seconds)" "$LIMIT" 1
for name in $PARTS; do
  case $name in staircase|sampler|rl_step_mfu|moe|study) ;;
    *) die "GPU_CHECK_PARTS: unknown part '$name' (staircase, sampler, rl_step_mfu, moe," \
           "study; separated by spaces)" ;;
  esac
done
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 1  # absolute: the script cd's below
cd "$(dirname "$0")/.." || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1 || true
# Each part's summary (its limit, whether it was cut, its log's last 25 lines) goes to
# NAME.summary, and summary.txt is rebuilt from them: once each, in the parts' order. (It was
# appended to: a rerun with the same OUT_DIR, as gpu_lease.sh's on a warm machine, replaced
# the logs but added another copy of every part's summary.)
SECTIONS="staircase sampler rl_step_mfu moe study_stability study_steprs"
summarize() {
  local name
  for name in $SECTIONS; do
    [ ! -f "$OUT/$name.summary" ] || cat "$OUT/$name.summary"
  done > "$OUT/summary.txt"
}
run() {  # run NAME SECONDS CMD... (common.sh's run, which only prints and runs, is not used)
  local name=$1 secs=$2; shift 2
  echo "== $name (limit ${secs}s)" | tee "$OUT/$name.summary"
  summarize
  timeout -k 45 "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && echo "   $name: cut at ${secs}s" | tee -a "$OUT/$name.summary"
  tail -n 25 "$OUT/$name.log" | tee -a "$OUT/$name.summary"
  summarize
}
# The study's arms (shell patterns) and extra flags (e.g. --config.KEY=VALUE for a dry run).
STABILITY_ARMS=${GPU_CHECK_STABILITY_ARMS:-'grpo@*,stabledrl@*,clip_only@*,selfnorm_only@*'}
STEPRS_ARMS=${GPU_CHECK_STEPRS_ARMS:-'centered,steprs,steprs_calibrated'}
read -r -a STUDY_FLAGS <<< "${GPU_CHECK_STUDY_FLAGS:-}"
part() { [[ "$PARTS" == *" $1 "* ]]; }
# The benchmarks share the limit by weight among the parts named: one part alone gets all of it.
declare -A WEIGHT=([staircase]=3 [sampler]=4 [rl_step_mfu]=3 [moe]=1)
WEIGHTS=0
for name in "${!WEIGHT[@]}"; do part "$name" && WEIGHTS=$((WEIGHTS + WEIGHT[$name])); done
share() { echo $((LIMIT * WEIGHT[$1] / (WEIGHTS > 0 ? WEIGHTS : 1))); }
# The staircase kernels timed: Triton (pallas) and the Mosaic GPU port (never yet run on a
# GPU; a kernel that fails prints its error and the others still run).
read -r -a STAIRCASE_IMPLS <<< "${GPU_CHECK_STAIRCASE_IMPLS:-pallas mosaic_gpu}"
part staircase && run staircase "$(share staircase)" "$PY" -m dllm_rl.benchmarks.staircase \
  --lengths 1024 2048 4096 8192 16384 --impl "${STAIRCASE_IMPLS[@]}" --dtype bfloat16 \
  --repeats 5
part sampler && run sampler "$(share sampler)" "$PY" -m dllm_rl.benchmarks.sampler \
  --checkpoint "$OUT/llada_1b" --init-random --d-model 2048 --layers 16 --heads 16 \
  --mlp 5632 --vocab 32768 --batch 32 --prompt 256 --gen 256 --steps 128 --block 32 \
  --repeats 3 --dtype bfloat16 --out "$OUT/sampler.json"
part rl_step_mfu && run rl_step_mfu "$(share rl_step_mfu)" "$PY" \
  -m dllm_rl.benchmarks.rl_step_mfu --steps 5
part moe && run moe "$(share moe)" "$PY" -m dllm_rl.benchmarks.grouped_matmul --rows 32768 \
  --experts 256 --d-model 2048 --hidden 512 --dtype bfloat16 --dispatch tiled mosaic_gpu \
  ragged_dot --tiles 256 512
# GPU_CHECK_STEPRS_ARMS=none: the stability study alone, with the whole limit
STABILITY_S=$((LIMIT * 3 / 4)); [ "$STEPRS_ARMS" = none ] && STABILITY_S=$LIMIT
part study && run study_stability "$STABILITY_S" "$PY" -m dllm_rl.study stability \
  --scale=gpu --quick --arms="$STABILITY_ARMS" "${STUDY_FLAGS[@]}" \
  --workdir="$OUT/study" --results="$OUT/study/stability.md"
[ "$STEPRS_ARMS" = none ] || { part study && run study_steprs $((LIMIT / 4)) "$PY" \
  -m dllm_rl.study steprs --scale=gpu --quick --arms="$STEPRS_ARMS" "${STUDY_FLAGS[@]}" \
  --workdir="$OUT/study" --results="$OUT/study/steprs.md"; }
echo "done; logs in $OUT"
