#!/usr/bin/env bash
# One call of the `device` tool's lent GPU (a 15-minute lease, one command ≤ 10 min): install
# the carried wheels, record versions, run the study's GPU profile and then the single-GPU
# benchmarks (launch/gpu_check.sh) under their own limits, and pack what they wrote into
# $OUT (the tool returns ≤ 8 files from it).
#
#   bash launch/gpu_lease.sh STUDY_S BENCH_S      (wheels in .whl/, see below)
#
# e.g. `bash launch/gpu_lease.sh 520 0` with timeout_s 590: the 7 default-lr main arms of the
# GPU profile took 495 s in one call on 2026-12-04 (docs/results_gpu_chain_quick/).
#
# Wheels: the lent machine (Python 3.12) has jax 0.11.2, flax 0.12.10, optax, orbax and chex
# but no registry. Its own flax must be used: our flax 0.12.8 pin fails to import on jax 0.11.2
# (docs/gpu.md). The pinned pure-Python packages it lacks travel as wheels in .whl/
# (git-ignored; carry it), fetched here with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#     ml-collections==1.1.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
#     antlr4-python3-runtime==4.13.2 tensorboardX==2.6.5
# and installed into a fresh /tmp/site (a warm machine keeps the last call's).
# State lives in /tmp/gpu_lease so that a second call on the still-warm machine resumes the
# study from its finished arms: /tmp survives between calls, the repository's copy does not
# (on 2026-12-04 a second call's .gpu_out/ inside the repository was gone and the SFT start
# ran again). Give the call's timeout_s at least STUDY_S + BENCH_S + 60: the tool's timeout
# kills everything, packing included, and a cut call returns no files. Results are packed
# after each part, so a cut benchmark part still leaves the study's.
set -u
case ${1:-} in -h|--help) sed -n '2,/^set -u/{/^#/p}' "$0" | cut -c3-; exit 0 ;; esac
STUDY_S=${1:-400}
BENCH_S=${2:-150}
# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh" || exit 1  # whole_number (its die: usage, below)
# Checked before anything runs (a typo would otherwise spend the lease doing nothing).
usage() { echo "usage: bash launch/gpu_lease.sh STUDY_S BENCH_S (whole seconds); $1" >&2; exit 2; }
die() { usage "$*"; }
[ $# -le 2 ] || usage "got $# arguments"
# (no leading 0: bash arithmetic reads 08 as octal, an error after the install; nor 10 digits
# or more, which the arithmetic wraps)
whole_number "STUDY_S (seconds)" "$STUDY_S"
whole_number "BENCH_S (seconds)" "$BENCH_S"
# (anything but 1 ran without deterministic ops, silently: "true" too)
[[ ${GPU_LEASE_DETERMINISTIC:-0} =~ ^[01]$ ]] \
  || usage "GPU_LEASE_DETERMINISTIC must be 0 or 1, got '$GPU_LEASE_DETERMINISTIC'"
for var in GPU_CHECK_PARTS GPU_LEASE_PARTS; do
  for name in ${!var:-}; do
    case $name in staircase|sampler|rl_step_mfu|moe|study) ;;
      *) usage "$var: unknown part '$name' (staircase, sampler, rl_step_mfu, moe, study)" ;;
    esac
  done
done
cd "$(dirname "$0")/.." || exit 1
STATE=${GPU_LEASE_STATE:-/tmp/gpu_lease}
mkdir -p "$STATE"
# (less checkpoints, caches and the runs' empty lock files, dllm_rl.train.modes.LOCK_FILE)
pack() {  # what the parts wrote so far, into $OUT (the device tool brings it back)
  [ -n "${OUT:-}" ] || return 0
  tar czf "$OUT/gpu_lease.tgz" --exclude='*checkpoint*' --exclude='llada_1b' \
    --exclude='*.safetensors' --exclude='ckpt*' --exclude='xla_cache*' --exclude='jax_cache' \
    --exclude='.dllm_rl.lock' \
    -C "$(dirname "$STATE")" "$(basename "$STATE")"
  cp "$STATE/env.txt" "$OUT/"
  cat "$STATE"/*/summary.txt > "$OUT/summary.txt" 2>/dev/null
}
export PYTHONUNBUFFERED=1 PYTHON=${PYTHON:-python3}
if [ -d .whl ]; then
  rm -rf /tmp/site
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD
fi
# A Python without the stack (PYTHON unset on a machine whose python3 lacks jax, no .whl/)
# ran every part into an ImportError and still exited 0: stop here, before the lease's time.
# Probed first, without the deterministic-ops flag below: its check read a failed import as
# "XLA rejected --xla_gpu_deterministic_ops".
if ! "$PYTHON" - > "$STATE/env.txt" 2>&1 <<'EOF'
import platform, jax, flax, optax, chex, orbax.checkpoint, ml_collections, numpy
print("python", platform.python_version(), "jax", jax.__version__, "flax", flax.__version__,
      "optax", optax.__version__, "chex", chex.__version__, "numpy", numpy.__version__)
print("devices", jax.devices())
EOF
then
  echo "gpu_lease.sh: PYTHON=$PYTHON cannot import the stack (jax, flax, optax, chex, orbax," \
    "ml_collections, numpy): $(tail -n 1 "$STATE/env.txt"); set PYTHON, or carry .whl/" >&2
  pack
  exit 3
fi
# GPU_LEASE_DETERMINISTIC=1: XLA's deterministic GPU ops, so that a later lease retrains the
# same SFT start (a lease keeps nothing: an SFT start retrained on 2026-12-04 reached test
# 0.469 against the first's 0.320 at the same step). Checked before any part: a flag XLA does
# not know aborts every jax program, so it is dropped, and said so with the program's last
# error line, if a tiny program fails with it (the stack imported above, so not for a missing
# jax). The program is a bf16 matmul and its gradient: deterministic mode changes how XLA
# picks GEMM kernels (compiling for an absent H100 with the flag, no GEMM config was found:
# docs/gpu.md "Next lease"), so a GPU whose GEMMs it cannot compile drops the flag here too.
if [ "${GPU_LEASE_DETERMINISTIC:-0}" = 1 ]; then
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_deterministic_ops=true"
  "$PYTHON" -c "import jax, jax.numpy as jnp; x = jnp.ones((256, 256), jnp.bfloat16)
jax.grad(lambda w: (x @ w).astype(jnp.float32).sum())(x).block_until_ready()" \
    > "$STATE/deterministic.txt" 2>&1 \
    || { WHY=$(tail -n 1 "$STATE/deterministic.txt")
         echo "XLA failed a bf16 matmul with --xla_gpu_deterministic_ops ($WHY): running" \
           "without it" >> "$STATE/env.txt"  # (printed with env.txt below)
         export XLA_FLAGS="${XLA_FLAGS% --xla_gpu_deterministic_ops=true}"; }
fi
echo "XLA_FLAGS=${XLA_FLAGS:-}" >> "$STATE/env.txt"
cat "$STATE/env.txt"
nproc >> "$STATE/env.txt"; lscpu | grep -m1 "Model name" >> "$STATE/env.txt"
# The lease-sized study: the main arms at the profile's default lr (rl.lr = 1e-5; the full
# study adds the lr grid's other two values), resumed from finished arms on a second call.
LEASE_ARMS='grpo@lr1e-5,stabledrl@lr1e-5,clip_only@*,selfnorm_only@*'
export GPU_CHECK_STABILITY_ARMS=${GPU_CHECK_STABILITY_ARMS:-$LEASE_ARMS}
# The arms are worth running only from an SFT start that reached its target (the Countdown
# start never did, docs/gpu.md): once the shared start's summary appears, a start
# below sft.target_accuracy stops the study and hands its time to the benchmarks (the sampler,
# the staircase kernels and the MoE grouped matmul), unless GPU_LEASE_PARTS is set.
SFT_SUMMARY="$STATE/study_check/study/sft/seed0/summary.json"
T0=$SECONDS
if [ "$STUDY_S" -gt 0 ]; then
  GPU_CHECK_PARTS=study GPU_CHECK_LIMIT_S=$STUDY_S setsid bash launch/gpu_check.sh \
    "$STATE/study_check" &
  STUDY_PID=$!
  CHECKED=
  while kill -0 "$STUDY_PID" 2>/dev/null; do
    if [ -z "$CHECKED" ] && [ -s "$SFT_SUMMARY" ]; then
      CHECKED=1
      VERDICT=$("$PYTHON" -c "
import json, os, sys
val = json.load(open(sys.argv[1])).get('sft_val_accuracy')
with open(os.path.join(os.path.dirname(sys.argv[1]), 'config_sft.json')) as fh:
  target = json.load(fh)['sft']['target_accuracy']
print('ok' if val is not None and val >= target else f'weak {val} < {target}')
" "$SFT_SUMMARY" 2>&1 | tail -n 1)
      echo "SFT start: $VERDICT ($((SECONDS - T0)) s)" | tee -a "$STATE/env.txt"
      if [ "$VERDICT" != ok ]; then
        # the whole session: timeout(1) puts the study in a process group of its own
        pkill -TERM -s "$STUDY_PID"; sleep 5; pkill -KILL -s "$STUDY_PID"
        BENCH_S=$((BENCH_S + STUDY_S - (SECONDS - T0)))
        export GPU_CHECK_PARTS=${GPU_LEASE_PARTS:-sampler staircase moe}
      fi
    fi
    sleep 5
  done
  wait "$STUDY_PID" 2>/dev/null
fi
echo "study part: $((SECONDS - T0)) s" | tee -a "$STATE/env.txt"
pack
T0=$SECONDS
[ "$BENCH_S" -gt 0 ] && GPU_CHECK_LIMIT_S=$BENCH_S bash launch/gpu_check.sh "$STATE/bench"
echo "bench part: $((SECONDS - T0)) s" | tee -a "$STATE/env.txt"
pack
if [ -n "${OUT:-}" ]; then ls -la "$OUT"; fi
