#!/usr/bin/env bash
# Run dllm_rl on every worker (host) of a Cloud TPU slice: one process per TPU VM.
#
# Usage:
#   launch/tpu_pod.sh --name NAME --zone ZONE --workdir gs://BUCKET/RUN [options] [-- OVERRIDES...]
#
# Examples:
#   launch/tpu_pod.sh --name my-v4 --zone us-central2-b --accelerator-type v4-32 \
#       --create --setup --stage-weights GSAI-ML/LLaDA-8B-Instruct \
#       --workdir gs://my-bucket/llada-rl -- --config.rl.steps=500 \
#       --config.task.options.train_file=gs://my-bucket/gsm8k/train.jsonl \
#       --config.task.options.test_file=gs://my-bucket/gsm8k/test.jsonl
#     (configs/llada_tpu.py's three REQUIRED values: the weights and the two JSONL files)
#   launch/tpu_pod.sh --dry-run --name my-v4 --zone us-central2-b --workdir gs://b/run
#   launch/tpu_pod.sh --name ms --zone us-east5-a --accelerator-type v5p-64 --slices 2 \
#       --create --setup --workdir gs://my-bucket/ms -- --config.mesh.data=2 \
#       --config.rl.batch_prompts=64 ...
#     (multislice: 2 v5p-64 slices over the data-center network; the mesh's data axis spans
#     them, so mesh.data must be a multiple of 2; plan it first with python -m dllm_rl.plan
#     --topology=v5p-64 --slices=2 and the same overrides)
#
# Steps, each printed as "+ command" before it runs (with --dry-run only printed; gcloud is
# then not needed):
#   1. --create  gcloud compute tpus tpu-vm create NAME --zone --accelerator-type --version;
#                with --slices N > 1 (multislice needs queued resources): gcloud compute tpus
#                queued-resources create NAME --node-count N --node-prefix NAME (slices NAME-0
#                .. NAME-<N-1>), then its state is read every 30 s until ACTIVE
#                [TPU_POLL_SECONDS] (up to 5 failed reads in a row [TPU_POLL_TRIES])
#   2. --setup   tar this checkout, gcloud ... scp it to every worker (--worker=all), unpack it
#                into REMOTE_DIR and build REMOTE_DIR/.venv on Python >= 3.11 (the TPU VM
#                image's python3 may be 3.10): python3 -m pip install --user uv, then
#                `uv venv --python PYTHON_VERSION .venv` (a Python the worker lacks is fetched
#                by uv: no sudo, no apt) and `uv pip install -r requirements-tpu.txt
#                -r requirements-gcs.txt -e .[tpu,gcs]` into it (the pinned versions, jax[tpu],
#                gcsfs for gs:// workdirs, the package and its dllm-rl* commands)
#   3. --stage-weights SPEC  gcloud ... ssh --worker=all --command="cd REMOTE_DIR && PYTHON -m
#                dllm_rl.data weights SPEC": every worker fetches the checkpoint (a hub id such as
#                GSAI-ML/LLaDA-8B-Instruct into its Hugging Face cache, a gs:// folder into
#                ~/.cache/dllm_rl/weights) before the run, which then gets
#                --config.model.hf_checkpoint=SPEC (an override after -- still wins) and
#                HF_HUB_OFFLINE=1, so no worker reaches the hub while the slice waits
#   4. run       gcloud compute tpus tpu-vm ssh NAME --worker=all --command="cd REMOTE_DIR &&
#                PYTHON -m dllm_rl.main --config=CONFIG --workdir=WORKDIR OVERRIDES..."
#   Steps 2-4 run on every slice (NAME-0 .. with --slices N > 1; step 4 on all at once: the
#   job starts when every worker of every slice has joined it; Ctrl-C stops them all; the
#   first slice to fail is named and its status is the script's; the others' sessions are
#   stopped TPU_FAIL_GRACE_SECONDS (600) later if JAX has not ended their runs by then).
#   Before step 1, the config file and the overrides are checked here with DLLM_LOCAL_PYTHON
#   (default: this checkout's .venv/bin/python; python -m dllm_rl.config.preflight): every
#   key exists and parses, and mesh.data is a multiple of --slices. A config file that is not
#   in this checkout, a flag without a value or given twice, --dry-run, --config or --workdir
#   after `--`, or a number that is not one stop the script (status 2, naming it), dry runs too.
#
# Options (environment variable in brackets; a flag wins over its variable):
#   --name NAME              TPU name                                [TPU_NAME]   required
#   --zone ZONE              zone, e.g. us-central2-b                [TPU_ZONE]   required
#   --project PROJECT        GCP project (default: gcloud's)         [TPU_PROJECT]
#   --accelerator-type TYPE  slice type for --create                 [TPU_ACCELERATOR_TYPE] v5p-64
#                            (the slice configs/llada_tpu.py is planned for: check a config
#                            with python -m dllm_rl.plan --config=... --topology=TYPE first)
#   --runtime-version V      TPU VM software version for --create    [TPU_RUNTIME_VERSION]
#                            default: the one Cloud TPU names for the generation: v6e-N
#                            v2-alpha-tpuv6e, v5p-N v2-alpha-tpuv5, v5litepod-N (v5e; gcloud
#                            does not know v5e-N) v2-alpha-tpuv5-lite, v4 and older
#                            tpu-ubuntu2204-base
#   --workdir DIR            run directory every host can reach (gs://...)  [DLLM_WORKDIR]
#                                                                    required
#   --config FILE            config file, relative to the checkout   [DLLM_CONFIG]
#                                                                    configs/llada_tpu.py
#                            (FILE:ARG: its get_config(ARG), as dllm_rl.main reads it, e.g.
#                            configs/wd1.py:tiny)
#   --remote-dir DIR         checkout on the workers (relative to home)  [DLLM_REMOTE_DIR] dllm_rl
#   --python BIN             Python that runs dllm_rl on the workers, relative to REMOTE_DIR
#                            or absolute                             [DLLM_PYTHON] .venv/bin/python
#                            (the venv --setup builds)
#   --python-version V       the venv's Python for --setup (>= 3.11) [DLLM_PYTHON_VERSION] 3.11
#   --create                 create the slice first
#   --spot                   with --create: a Spot slice
#   --slices N               TPU multislice: N slices of --accelerator-type  [TPU_SLICES] 1
#                            (at most 1024, as python -m dllm_rl.plan --slices)
#                            (NAME is then the queued resource, the slices NAME-0 ..)
#   --setup                  copy this checkout to every worker and build its venv (step 2)
#   --env VAR=VALUE          set VAR for the run on every worker (step 4; repeatable), e.g.
#                            --env LIBTPU_INIT_ARGS=--xla_tpu_enable_collective_pipeliner=false
#   --stage-weights SPEC     fetch checkpoint SPEC on every worker first (step 3)
#                                                                    [DLLM_STAGE_WEIGHTS]
#   --dry-run                print the commands, run nothing
#   -h, --help               this text
# Everything after `--` goes to dllm_rl.main on every worker (e.g. --config.rl.steps=500).
#
# All workers run the same command. config.distributed.initialize=auto (the default) detects the
# Cloud TPU VM and calls jax.distributed.initialize(), which reads the slice's workers and this
# worker's index from the TPU metadata server (and, multislice, the slices from the MEGASCALE_*
# variables the queued resource sets). Delete the slice when done:
#   gcloud compute tpus tpu-vm delete NAME --zone ZONE
#   (multislice: gcloud compute tpus queued-resources delete NAME --zone ZONE --force)
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
die() { echo "tpu_pod.sh: $*" >&2; exit 2; }

# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # quote, run, need, whole_number, ...

NAME=${TPU_NAME:-}
ZONE=${TPU_ZONE:-}
PROJECT=${TPU_PROJECT:-}
ACCELERATOR_TYPE=${TPU_ACCELERATOR_TYPE:-v5p-64}
RUNTIME_VERSION=${TPU_RUNTIME_VERSION:-}  # default: by generation, below
WORKDIR=${DLLM_WORKDIR:-}
CONFIG=${DLLM_CONFIG:-configs/llada_tpu.py}
REMOTE_DIR=${DLLM_REMOTE_DIR:-dllm_rl}
PYTHON=${DLLM_PYTHON:-.venv/bin/python}
PYTHON_VERSION=${DLLM_PYTHON_VERSION:-3.11}
UV_SPEC=uv==0.13.9  # installed with the worker's python3 to build the venv
STAGE_WEIGHTS=${DLLM_STAGE_WEIGHTS:-}
SLICES=${TPU_SLICES:-1}
POLL_S=${TPU_POLL_SECONDS:-30}  # how often a queued resource's state is read (tests: 0)
POLL_TRIES=${TPU_POLL_TRIES:-5}  # reads of the state that may fail in a row (network, quota)
FAIL_GRACE_S=${TPU_FAIL_GRACE_SECONDS:-600}  # after a slice fails, the others' time to end
CREATE=0 SPOT=0 SETUP=0 DRY_RUN=0
OVERRIDES=()
USER_ENV=()  # --env VAR=VALUE, for the run on every worker

while [[ $# -gt 0 ]]; do
  case $1 in
    --name) need "$@"; NAME=$2; shift 2 ;;
    --zone) need "$@"; ZONE=$2; shift 2 ;;
    --project) need "$@"; PROJECT=$2; shift 2 ;;
    --accelerator-type) need "$@"; ACCELERATOR_TYPE=$2; shift 2 ;;
    --runtime-version) need "$@"; RUNTIME_VERSION=$2; shift 2 ;;
    --workdir) need "$@"; WORKDIR=$2; shift 2 ;;
    --config) need "$@"; CONFIG=$2; shift 2 ;;
    --remote-dir) need "$@"; REMOTE_DIR=$2; shift 2 ;;
    --python) need "$@"; PYTHON=$2; shift 2 ;;
    --python-version) need "$@"; PYTHON_VERSION=$2; shift 2 ;;
    --create) CREATE=1; shift ;;
    --spot) SPOT=1; shift ;;
    --slices) need "$@"; SLICES=$2; shift 2 ;;
    --setup) SETUP=1; shift ;;
    --stage-weights) need "$@"; STAGE_WEIGHTS=$2; shift 2 ;;
    --env) need_value "$@"  # repeatable
      [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env $2: expected VAR=VALUE (a variable name," \
          "then '=')"
      USER_ENV+=("$2"); shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; OVERRIDES=("$@"); break ;;
    *) die "unknown argument '$1' (overrides for dllm_rl.main go after --; see --help)" ;;
  esac
done

[[ -n $NAME ]] || die "--name (or TPU_NAME) is required"
[[ -n $ZONE ]] || die "--zone (or TPU_ZONE) is required"
[[ -n $WORKDIR ]] || die "--workdir (or DLLM_WORKDIR) is required"
[[ $PYTHON_VERSION =~ ^3\.(1[1-9]|[2-9][0-9])(\.[0-9]+)?$ ]] \
    || die "--python-version $PYTHON_VERSION: dllm_rl needs Python >= 3.11 (e.g. 3.11, 3.12)"
whole_number "--slices (or TPU_SLICES)" "$SLICES" 1
# dllm_rl.parallel.topology.MAX_SLICES, the planner's bound (a test checks they agree): ~5x the
# largest multislice job made public; a mistyped count built a name per slice, then started a
# gcloud session per slice at once
MAX_SLICES=1024
[[ $SLICES -le $MAX_SLICES ]] || die "--slices (or TPU_SLICES) $SLICES: at most $MAX_SLICES" \
    "slices (the planner's bound, dllm_rl.parallel.topology.MAX_SLICES)"
whole_number TPU_POLL_SECONDS "$POLL_S"
whole_number TPU_POLL_TRIES "$POLL_TRIES" 1
whole_number TPU_FAIL_GRACE_SECONDS "$FAIL_GRACE_S"
launcher_flags_before_separator ${OVERRIDES[@]+"${OVERRIDES[@]}"}
if [[ $CREATE == 0 ]]; then  # they say what --create makes: without it they did nothing, silently
  for flag in --accelerator-type --runtime-version; do
    ! given "$flag" >/dev/null || die "$flag applies only with --create (the slice $NAME is" \
        "used as it was created)"
  done
  [[ $SPOT == 0 ]] || die "--spot applies only with --create (the slice $NAME is used as it was" \
      "created)"
fi
# --setup unpacks the checkout into it and rebuilds its .venv (uv venv --clear): home itself
# would get the checkout's files and lose a ~/.venv of its own
case ${REMOTE_DIR%/} in
  ''|.|'~'|'$HOME') die "--remote-dir '$REMOTE_DIR': name a folder of its own (--setup" \
      "unpacks the checkout there and rebuilds its .venv), e.g. dllm_rl" ;;
esac
[[ $CONFIG != /* ]] || die "--config $CONFIG: name it relative to the checkout (the workers read" \
    "it from their copy of it, --remote-dir)"
[[ $WORKDIR == gs://* ]] || echo "tpu_pod.sh: warning: --workdir=$WORKDIR is not gs://...;" \
    "every worker then writes its own local copy" >&2

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# What --setup's tarball leaves out of this checkout (not what .gitignore keeps out of the
# repository): repository data, environments and caches wherever they are; at the top, run
# directories (checkpoints), wheels and builds.
LEFT_OUT_ANYWHERE=(.git .venv __pycache__ .pytest_cache .import_linter_cache '*.egg-info')
LEFT_OUT_AT_TOP=(runs 'workdir*' .whl build)
left_out() {  # NAME DEPTH: whether a folder NAME, DEPTH folders below the top, is left out
  local pattern patterns=("${LEFT_OUT_ANYWHERE[@]}")
  [[ $2 != 0 ]] || patterns+=("${LEFT_OUT_AT_TOP[@]}")
  for pattern in "${patterns[@]}"; do
    # shellcheck disable=SC2053  # the pattern is meant to match as a glob
    [[ $1 != $pattern ]] || return 0
  done
  return 1
}
LOCAL_PYTHON=${DLLM_LOCAL_PYTHON:-$REPO/.venv/bin/python}  # runs the config check (preflight)
CONFIG_FILE=$(config_file "$REPO" "$CONFIG")  # FILE of FILE:ARG
config_file_exists "$CONFIG_FILE" "$CONFIG"
# The workers read it from their copy of this checkout (--setup's tarball): ../x.py is not there,
# nor a file in a folder the tarball leaves out, nor the target of a link to either.
CONFIG_REAL=$CONFIG_FILE
if [[ -L $CONFIG_FILE ]]; then
  CONFIG_REAL=$(readlink -f "$CONFIG_FILE") || die "--config $CONFIG: cannot resolve the link"
fi
CONFIG_DIR=$(cd "$(dirname "$CONFIG_REAL")" && pwd -P)
REPO_REAL=$(cd "$REPO" && pwd -P)
[[ $CONFIG_DIR/ == "$REPO_REAL"/* ]] || die "--config $CONFIG:" \
    "$CONFIG_DIR/${CONFIG_REAL##*/} is outside the checkout, which is what the workers get:" \
    "move it into the checkout"
CONFIG_REL=$CONFIG_DIR/
CONFIG_REL=${CONFIG_REL#"$REPO_REAL"/}
IFS=/ read -r -a CONFIG_PARTS <<< "$CONFIG_REL"
for i in "${!CONFIG_PARTS[@]}"; do
  if left_out "${CONFIG_PARTS[$i]}" "$i"; then
    die "--config $CONFIG: $CONFIG_DIR/${CONFIG_REAL##*/} is in ${CONFIG_PARTS[$i]}/, which" \
        "--setup's tarball leaves out: the workers would not have it; move it elsewhere in" \
        "the checkout"
  fi
done
[[ $DRY_RUN == 1 ]] || command -v gcloud >/dev/null \
    || die "gcloud not found (install the Google Cloud CLI)"
# The config and the overrides, checked here before any slice is created or reached (a typo'd
# key, or a mesh.data the slices do not divide, would otherwise stop the workers after setup).
preflight "$LOCAL_PYTHON" "$REPO" "$CONFIG" "$SLICES" ${OVERRIDES[@]+"${OVERRIDES[@]}"}

# The TPU software version Cloud TPU documents for each generation (cloud.google.com/tpu/docs/
# runtimes); gcloud's v5e accelerator types are v5litepod-N.
if [[ $CREATE == 1 ]]; then
  [[ $ACCELERATOR_TYPE != v5e-* ]] || die "--accelerator-type $ACCELERATOR_TYPE: gcloud names" \
      "v5e slices v5litepod-N (N chips), e.g. --accelerator-type v5litepod-${ACCELERATOR_TYPE#v5e-}"
  if [[ -z $RUNTIME_VERSION ]]; then
    case $ACCELERATOR_TYPE in
      v6e-*) RUNTIME_VERSION=v2-alpha-tpuv6e ;;
      v5p-*) RUNTIME_VERSION=v2-alpha-tpuv5 ;;
      v5litepod-*) RUNTIME_VERSION=v2-alpha-tpuv5-lite ;;
      *) RUNTIME_VERSION=tpu-ubuntu2204-base ;;
    esac
  fi
fi

GCLOUD_LOCATION=(--zone="$ZONE")
[[ -z $PROJECT ]] || GCLOUD_LOCATION+=(--project="$PROJECT")

NODES=("$NAME")  # the slices: one, or NAME-0 .. NAME-<SLICES-1> of the queued resource
if [[ $SLICES -gt 1 ]]; then
  NODES=()
  for ((i = 0; i < SLICES; i++)); do NODES+=("$NAME-$i"); done
fi

if [[ $CREATE == 1 && $SLICES == 1 ]]; then
  CREATE_ARGS=(--accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION")
  [[ $SPOT == 0 ]] || CREATE_ARGS+=(--spot)
  run gcloud compute tpus tpu-vm create "$NAME" "${GCLOUD_LOCATION[@]}" "${CREATE_ARGS[@]}"
elif [[ $CREATE == 1 ]]; then
  CREATE_ARGS=(--accelerator-type="$ACCELERATOR_TYPE" --runtime-version="$RUNTIME_VERSION"
               --node-count="$SLICES" --node-prefix="$NAME")
  [[ $SPOT == 0 ]] || CREATE_ARGS+=(--spot)
  run gcloud compute tpus queued-resources create "$NAME" "${GCLOUD_LOCATION[@]}" \
      "${CREATE_ARGS[@]}"
  STATE_CMD=(gcloud compute tpus queued-resources describe "$NAME" "${GCLOUD_LOCATION[@]}"
             --format="value(state.state)")
  echo "+ $(quote_all "${STATE_CMD[@]}")  (every $POLL_S s until ACTIVE)"
  FAILED_READS=0
  while [[ $DRY_RUN == 0 ]]; do
    if ! STATE=$("${STATE_CMD[@]}"); then
      FAILED_READS=$((FAILED_READS + 1))
      [[ $FAILED_READS -lt $POLL_TRIES ]] || die "could not read the state of queued resource" \
          "$NAME ($FAILED_READS tries in a row); it may still be provisioning: see gcloud" \
          "compute tpus queued-resources describe $NAME, then rerun without --create"
      echo "tpu_pod.sh: could not read the state of $NAME (try $FAILED_READS of" \
          "$POLL_TRIES); reading it again in $POLL_S s" >&2
      sleep "$POLL_S"
      continue
    fi
    FAILED_READS=0
    case $STATE in
      ACTIVE) break ;;
      FAILED|SUSPENDED|SUSPENDING) die "queued resource $NAME is $STATE (gcloud compute tpus" \
          "queued-resources describe $NAME says why)" ;;
    esac
    sleep "$POLL_S"
  done
fi

if [[ $SETUP == 1 ]]; then
  TARBALL=${TMPDIR:-/tmp}/dllm_rl-$NAME.tgz
  EXCLUDES=()
  for name in "${LEFT_OUT_ANYWHERE[@]}"; do EXCLUDES+=("--exclude=$name"); done
  for name in "${LEFT_OUT_AT_TOP[@]}"; do EXCLUDES+=("--exclude=./$name"); done
  run tar -czf "$TARBALL" "${EXCLUDES[@]}" -C "$REPO" .
  for node in "${NODES[@]}"; do
    run gcloud compute tpus tpu-vm scp "$TARBALL" "$node:dllm_rl.tgz" "${GCLOUD_LOCATION[@]}" \
        --worker=all
  done
  SETUP_CMD="mkdir -p $(quote "$REMOTE_DIR") && tar -xzf dllm_rl.tgz -C $(quote "$REMOTE_DIR")"
  SETUP_CMD+=" && cd $(quote "$REMOTE_DIR")"
  SETUP_CMD+=" && python3 -m pip install -q --user $(quote "$UV_SPEC")"
  SETUP_CMD+=" && python3 -m uv venv -q --clear --python $(quote "$PYTHON_VERSION") .venv"
  SETUP_CMD+=" && python3 -m uv pip install -q --python .venv/bin/python"
  SETUP_CMD+=" -r requirements-tpu.txt -r requirements-gcs.txt -e $(quote ".[tpu,gcs]")"
  CHECK_VENV="import sys, dllm_rl; assert sys.version_info >= (3, 11), sys.version"
  SETUP_CMD+=" && .venv/bin/python -c $(quote "$CHECK_VENV")"
  for node in "${NODES[@]}"; do
    run gcloud compute tpus tpu-vm ssh "$node" "${GCLOUD_LOCATION[@]}" --worker=all \
        --command "$SETUP_CMD"
  done
fi

RUN_ENV=()
if [[ -n $STAGE_WEIGHTS ]]; then
  STAGE_CMD="cd $(quote "$REMOTE_DIR") && $(quote_all "$PYTHON" -m dllm_rl.data weights \
      "$STAGE_WEIGHTS")"
  for node in "${NODES[@]}"; do
    run gcloud compute tpus tpu-vm ssh "$node" "${GCLOUD_LOCATION[@]}" --worker=all \
        --command "$STAGE_CMD"
  done
  OVERRIDES=(--config.model.hf_checkpoint="$STAGE_WEIGHTS" ${OVERRIDES[@]+"${OVERRIDES[@]}"})
  RUN_ENV=(HF_HUB_OFFLINE=1)
fi

RUN_ENV+=(${USER_ENV[@]+"${USER_ENV[@]}"})  # after HF_HUB_OFFLINE=1: an --env of it wins
ENV_WORDS=""  # VAR=value assignments before the command; only the value quoted, so they stay ones
for assignment in ${RUN_ENV[@]+"${RUN_ENV[@]}"}; do
  ENV_WORDS+="${assignment%%=*}=$(quote "${assignment#*=}") "
done
MAIN_CMD="cd $(quote "$REMOTE_DIR") && $ENV_WORDS$(quote_all "$PYTHON" -m dllm_rl.main \
    --config="$CONFIG" --workdir="$WORKDIR" ${OVERRIDES[@]+"${OVERRIDES[@]}"})"
if [[ $SLICES == 1 ]]; then
  run gcloud compute tpus tpu-vm ssh "$NAME" "${GCLOUD_LOCATION[@]}" --worker=all \
      --command "$MAIN_CMD"
  exit
fi
PIDS=()  # every slice at once (each waits in jax.distributed for the others), then each status
# Stops the session (process group) of every slice whose run has not ended (not the ended ones:
# their ids may be another's now); with arguments, a line per slice says so, ending with them
# (NODE in them: the slice's name).
stop_open_sessions() {
  local note="$*"
  for i in ${PIDS[@]+"${!PIDS[@]}"}; do
    [[ -z ${ENDED[$i]:-} ]] || continue
    kill -TERM -- "-${PIDS[$i]}" 2>/dev/null || true
    [[ $# == 0 ]] || echo "tpu_pod.sh: stopped slice ${NODES[$i]}'s session" \
        "${note//NODE/${NODES[$i]}}" >&2
  done
}
# Each slice's session in its own process group (set -m): a script's background commands ignore
# SIGINT otherwise, so Ctrl-C left them running and the script waiting for them. Ctrl-C (or
# SIGTERM) now stops every session, whole (gcloud and its ssh processes), and exits 130.
# shellcheck disable=SC2329  # run by the trap below
stop_slices() {
  trap - INT TERM
  echo "tpu_pod.sh: interrupted: stopping the slices' sessions" >&2
  stop_open_sessions
  exit 130
}
trap stop_slices INT TERM
set -m
for node in "${NODES[@]}"; do
  SSH=(gcloud compute tpus tpu-vm ssh "$node" "${GCLOUD_LOCATION[@]}" --worker=all
       --command "$MAIN_CMD")
  echo "+ $(quote_all "${SSH[@]}") &"
  if [[ $DRY_RUN == 0 ]]; then "${SSH[@]}" </dev/null & PIDS+=($!); fi
done
# The sessions as they end (not in slice order): the first slice to fail is named first, and
# its status is the script's. The other slices' processes then stop on their own once JAX's
# distributed service notices the lost one (its heartbeat timeout, 100 s by default), so each
# has FAIL_GRACE_S to end and show its error; a session still open after that is stopped.
STATUS=0 FAILED_AT=0 LEFT=${#PIDS[@]}
ENDED=()
while [[ $LEFT -gt 0 ]]; do
  for i in "${!PIDS[@]}"; do
    [[ -z ${ENDED[$i]:-} ]] && ! kill -0 "${PIDS[$i]}" 2>/dev/null || continue
    code=0; wait "${PIDS[$i]}" || code=$?
    ENDED[$i]=1; LEFT=$((LEFT - 1))
    [[ $code != 0 ]] || continue
    echo "tpu_pod.sh: slice ${NODES[$i]} exited $code" >&2
    if [[ $STATUS == 0 ]]; then
      STATUS=$code FAILED_AT=$SECONDS
      [[ $LEFT == 0 ]] || echo "tpu_pod.sh: the other slices' runs get $FAIL_GRACE_S s to end" \
          "(TPU_FAIL_GRACE_SECONDS); their sessions are stopped after that" >&2
    fi
  done
  if [[ $STATUS != 0 && $LEFT -gt 0 && $((SECONDS - FAILED_AT)) -ge $FAIL_GRACE_S ]]; then
    stop_open_sessions "$FAIL_GRACE_S s after the failure; if its processes still run:" \
        "gcloud compute tpus tpu-vm ssh NODE --zone=$ZONE --worker=all" \
        "--command='pkill -f dllm_rl.main'"
    wait || true
    break
  fi
  # Slept in the background and waited for: under set -m a foreground command takes the
  # terminal, so Ctrl-C would reach the sleep alone and bash would exit without the trap,
  # leaving every session running; the wait builtin returns at once for the trap instead.
  if [[ $LEFT -gt 0 ]]; then sleep 1 & wait $! || true; fi
done
exit "$STATUS"
