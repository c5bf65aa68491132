#!/usr/bin/env bash
#SBATCH --job-name=dllm_rl
#SBATCH --nodes=1
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --output=%x-%j.out
# Run dllm_rl on several GPU nodes under SLURM: one JAX process per node (default) or per GPU.
#
# Usage:
#   launch/slurm_gpu.sh --config FILE --workdir DIR [options] [-- OVERRIDES...]
#       outside an allocation: submits this script with sbatch (the options below become sbatch
#       options), after checking the config file and the overrides with PYTHON (python -m
#       dllm_rl.config.preflight: every key exists and parses; skipped, saying so, where PYTHON
#       cannot import dllm_rl); inside one (sbatch, salloc): starts the processes with srun
#   sbatch [sbatch options] launch/slurm_gpu.sh --config FILE --workdir DIR [-- OVERRIDES...]
#       the same, with the #SBATCH defaults above
# A config file that is not there, a flag without a value or given twice, --dry-run, --config
# or --workdir after `--`, or a number that is not one (the allocation's SLURM_* included)
# stop the script (status 2, naming it) before sbatch or srun, dry runs too.
#
# Examples:
#   launch/slurm_gpu.sh --nodes 4 --partition gpu --config configs/llada_gpu.py \
#       --workdir /shared/runs/llada-rl -- --config.rl.steps=500 \
#       --config.model.hf_checkpoint=DIR --config.task.options.train_file=FILE \
#       --config.task.options.test_file=FILE   (the config's three REQUIRED values)
#   launch/slurm_gpu.sh --dry-run --config configs/tiny_cpu.py --workdir /tmp/run
#
# Inside the allocation the first node (of scontrol show hostnames $SLURM_JOB_NODELIST) hosts
# the JAX coordinator, and every task runs
#   PYTHON -m dllm_rl.main --config=FILE --workdir=DIR --config.distributed.initialize=explicit
#     --config.distributed.coordinator_address=FIRST_NODE:PORT
#     --config.distributed.num_processes=$SLURM_NTASKS --config.distributed.process_id=$SLURM_PROCID
#     [--config.distributed.local_device_ids=$SLURM_LOCALID  (per-gpu only)]  OVERRIDES...
#
# Options (environment variable in brackets; a flag wins over its variable):
#   --config FILE          config file, relative to the checkout (or absolute, on a filesystem
#                          the nodes share)                           [DLLM_CONFIG]  required
#                          (FILE:ARG: its get_config(ARG), as dllm_rl.main reads it, e.g.
#                          configs/wd1.py:tiny)
#   --workdir DIR          run directory on a filesystem all nodes share  [DLLM_WORKDIR]  required
#   --nodes N              nodes                       [DLLM_NODES] the allocation's, else 1
#                          (nodes x GPUs must divide rl.batch_prompts, eval.batch_size and
#                          data.batch_size: configs/llada_gpu.py has 8 prompts, one node of 8)
#   --gpus-per-node G      GPUs per node               [DLLM_GPUS_PER_NODE] the allocation's
#                          (SLURM_GPUS_PER_NODE, which sbatch/salloc --gpus-per-node set), else 8
#                          (of one GPU type: TYPE:N,TYPE:N, several types, is refused)
#   --procs per-node|per-gpu  one process per node (it sees all the node's GPUs) or per GPU
#                                                      [DLLM_PROCS] per-node
#   --port P               coordinator port            [DLLM_PORT] 20000 + SLURM_JOB_ID % 10000
#   --cpus-per-task C      CPU cores of each process (srun gives a task 1 core otherwise:
#                          host work, compiles and reward workers on one core)
#                          [DLLM_CPUS_PER_TASK] the node's cores (SLURM_CPUS_ON_NODE) over its
#                          tasks
#   --python BIN           Python on the nodes (an activated venv's, say)  [DLLM_PYTHON] python3
#   --mem-fraction F       XLA_PYTHON_CLIENT_MEM_FRACTION of every process: the share of GPU
#                          memory JAX preallocates (JAX's own default, 0.75, leaves a quarter
#                          of an 80 GB GPU unused)    [XLA_PYTHON_CLIENT_MEM_FRACTION] 0.92
#   --partition P, --account A, --time T   sbatch options when submitting (sbatch also reads
#                          SBATCH_PARTITION, SBATCH_ACCOUNT, SBATCH_TIMELIMIT itself)
#   --dry-run              print the commands (sbatch, scontrol, srun), run nothing
#   -h, --help             this text
# Everything after `--` goes to dllm_rl.main in every process (e.g. --config.rl.steps=500).
# The checkout is this script's parent directory (or DLLM_REPO, which submission sets, since
# sbatch runs a spooled copy of the script; a DLLM_REPO naming another checkout than the one
# this script is in is used, and said on stderr).
set -euo pipefail

usage() { sed -n '/^# Run dllm_rl/,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
die() { echo "slurm_gpu.sh: $*" >&2; exit 2; }

# --help needs no checkout (a copy of this script, sbatch's spooled one, has none beside it):
# before the checkout is looked for, wherever it is among the options
for arg in "$@"; do
  case $arg in --) break ;; -h|--help) usage; exit 0 ;; esac
done

# The checkout: DLLM_REPO (submission sets it: sbatch runs a spooled copy of this script), else
# this script's parent folder, else the folder sbatch was called from.
HERE=$(dirname "${BASH_SOURCE[0]}")/..  # the checkout this script is in, if it is in one
if [[ -n ${DLLM_REPO:-} ]]; then
  REPO=$DLLM_REPO
  [[ -f $REPO/dllm_rl/main.py && -f $REPO/launch/common.sh ]] || die "DLLM_REPO=$REPO is not a" \
      "dllm_rl checkout (no dllm_rl/main.py there): unset it, or name the checkout"
  # another checkout than this script's (a DLLM_REPO left exported from an earlier one): said
  if [[ -f $HERE/dllm_rl/main.py && $(cd "$REPO" && pwd -P) != "$(cd "$HERE" && pwd -P)" ]]; then
    echo "slurm_gpu.sh: note: using the checkout DLLM_REPO=$REPO, not $(cd "$HERE" && pwd)" \
        "where this script is (unset DLLM_REPO to use that one)" >&2
  fi
elif [[ -f $HERE/dllm_rl/main.py ]]; then
  REPO=$(cd "$HERE" && pwd)
elif [[ -f ${SLURM_SUBMIT_DIR:-.}/dllm_rl/main.py ]]; then
  REPO=$SLURM_SUBMIT_DIR
else
  die "cannot find the dllm_rl checkout: set DLLM_REPO"
fi
# shellcheck source=launch/common.sh
source "$REPO/launch/common.sh"  # quote, run, need, whole_number, ...

CONFIG=${DLLM_CONFIG:-}
WORKDIR=${DLLM_WORKDIR:-}
NODES=${DLLM_NODES:-${SLURM_JOB_NUM_NODES:-1}}
GPUS_PER_NODE=${DLLM_GPUS_PER_NODE:-${SLURM_GPUS_PER_NODE:-8}}  # its TYPE: read off below
PROCS=${DLLM_PROCS:-per-node}
PORT=${DLLM_PORT:-}
CPUS_PER_TASK=${DLLM_CPUS_PER_TASK:-}
PYTHON=${DLLM_PYTHON:-python3}
MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
PARTITION="" ACCOUNT="" TIME=""
DRY_RUN=0
OVERRIDES=()
SUBMIT_ARGS=()  # the arguments, less --dry-run, for the script when it submits itself
ALL_ARGS=("$@")
for ((i = 0; i < ${#ALL_ARGS[@]}; i++)); do
  if [[ ${ALL_ARGS[i]} == -- ]]; then SUBMIT_ARGS+=("${ALL_ARGS[@]:i}"); break; fi
  [[ ${ALL_ARGS[i]} == --dry-run ]] || SUBMIT_ARGS+=("${ALL_ARGS[i]}")
done

while [[ $# -gt 0 ]]; do
  case $1 in
    --config) need "$@"; CONFIG=$2; shift 2 ;;
    --workdir) need "$@"; WORKDIR=$2; shift 2 ;;
    --nodes) need "$@"; NODES=$2; shift 2 ;;
    --gpus-per-node) need "$@"; GPUS_PER_NODE=$2; shift 2 ;;
    --procs) need "$@"; PROCS=$2; shift 2 ;;
    --port) need "$@"; PORT=$2; shift 2 ;;
    --cpus-per-task) need "$@"; CPUS_PER_TASK=$2; shift 2 ;;
    --python) need "$@"; PYTHON=$2; shift 2 ;;
    --mem-fraction) need "$@"; MEM_FRACTION=$2; shift 2 ;;
    --partition) need "$@"; PARTITION=$2; shift 2 ;;
    --account) need "$@"; ACCOUNT=$2; shift 2 ;;
    --time) need "$@"; TIME=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; OVERRIDES=("$@"); break ;;
    *) die "unknown argument '$1' (overrides for dllm_rl.main go after --; see --help)" ;;
  esac
done

[[ -n $CONFIG ]] || die "--config (or DLLM_CONFIG) is required, e.g. --config configs/llada_tpu.py"
[[ -n $WORKDIR ]] || die "--workdir (or DLLM_WORKDIR) is required (on a filesystem all nodes share)"
launcher_flags_before_separator ${OVERRIDES[@]+"${OVERRIDES[@]}"}
# Each numeric setting checked before use, named as what set it: the flag (or its variable),
# else the allocation's variable.
set_by() {  # FLAG VAR SLURM_VAR: what set FLAG's value (FLAG, VAR, else SLURM_VAR), named
  if given "$1" >/dev/null || [[ -n ${!2:-} || -z ${!3:-} ]]; then echo "$1 (or $2)"
  else echo "$3 (the allocation's; $1 overrides it)"; fi
}
whole_number "$(set_by --nodes DLLM_NODES SLURM_JOB_NUM_NODES)" "$NODES" 1
if ! given --gpus-per-node >/dev/null; then
  # sbatch --gpus-per-node=TYPE:N,TYPE:N (N of each type per node) was read as the last N: one
  # run's processes (one JAX job, compiled for one GPU) need GPUs of one type
  GPUS_VAR=SLURM_GPUS_PER_NODE
  [[ -z ${DLLM_GPUS_PER_NODE:-} ]] || GPUS_VAR=DLLM_GPUS_PER_NODE
  [[ $GPUS_PER_NODE != *,* ]] || die "$GPUS_VAR=$GPUS_PER_NODE lists GPUs of several types:" \
      "a run needs GPUs of one type; allocate one (e.g. --gpus-per-node=${GPUS_PER_NODE%%,*})," \
      "or give --gpus-per-node G"
  GPUS_PER_NODE=${GPUS_PER_NODE##*:}  # "h100:4" (--gpus-per-node=TYPE:N) -> 4
fi
whole_number "$(set_by --gpus-per-node DLLM_GPUS_PER_NODE SLURM_GPUS_PER_NODE)" \
    "$GPUS_PER_NODE" 1
[[ $MEM_FRACTION =~ ^(0?\.[0-9]*[1-9][0-9]*|1(\.0*)?)$ ]] || die "--mem-fraction (or" \
    "XLA_PYTHON_CLIENT_MEM_FRACTION) must be in (0, 1], got '$MEM_FRACTION'"
[[ -z $PORT || ($PORT =~ ^[1-9][0-9]{0,4}$ && $PORT -le 65535) ]] || die "--port (or" \
    "DLLM_PORT) must be a port number from 1 to 65535, got '$PORT'"
case $PROCS in
  per-node) TASKS_PER_NODE=1 ;;
  per-gpu) TASKS_PER_NODE=$GPUS_PER_NODE ;;
  *) die "--procs must be per-node or per-gpu, got '$PROCS'" ;;
esac
if [[ -n $CPUS_PER_TASK ]]; then
  whole_number "--cpus-per-task (or DLLM_CPUS_PER_TASK)" "$CPUS_PER_TASK" 1
elif [[ -n ${SLURM_CPUS_ON_NODE:-} ]]; then
  whole_number "SLURM_CPUS_ON_NODE (the node's cores; --cpus-per-task overrides it)" \
      "$SLURM_CPUS_ON_NODE" 1
fi
if [[ -z $PORT && -n ${SLURM_JOB_ID:-} ]]; then
  whole_number "SLURM_JOB_ID (the port is 20000 + it % 10000 unless --port)" "$SLURM_JOB_ID"
fi

CONFIG_FILE=$(config_file "$REPO" "$CONFIG")  # FILE of FILE:ARG; an absolute path as it is
config_file_exists "$CONFIG_FILE" "$CONFIG"

# The first host of a SLURM node list: scontrol, or (dry run) a parse of "gpu[007-008],gpu010".
first_host() {
  if [[ $DRY_RUN == 0 ]]; then
    local hosts  # no "| head -n1": with pipefail, scontrol's SIGPIPE would fail the script
    hosts=$(scontrol show hostnames "$1")
    echo "${hosts%%$'\n'*}"
  else
    local head=${1%%,*}
    if [[ $head == *\[* ]]; then
      local range=${1#*\[}
      echo "${head%%\[*}${range%%[-,\]]*}"
    else
      echo "$head"
    fi
  fi
}

srun_step() {
  local nodelist=$1 port=$2
  echo "+ scontrol show hostnames $(quote "$nodelist")"
  local host
  host=$(first_host "$nodelist")  # a command substitution ignores set -e: check what came back
  [[ -n $host ]] || die "scontrol show hostnames '$nodelist' gave no host for the coordinator"
  local fixed=("$PYTHON" -m dllm_rl.main --config="$CONFIG" --workdir="$WORKDIR"
               --config.distributed.initialize=explicit
               --config.distributed.coordinator_address="$host:$port")
  # Single-quoted for bash -c: each task expands its own SLURM_* variables.
  local task_cmd
  task_cmd="exec $(quote_all "${fixed[@]}")"
  task_cmd+=' --config.distributed.num_processes=$SLURM_NTASKS'
  task_cmd+=' --config.distributed.process_id=$SLURM_PROCID'
  [[ $PROCS == per-node ]] || task_cmd+=' --config.distributed.local_device_ids=$SLURM_LOCALID'
  [[ ${#OVERRIDES[@]} == 0 ]] || task_cmd+=" $(quote_all "${OVERRIDES[@]}")"
  # each task's cores: given, else the node's share (srun's own default is one core)
  local cpus=$CPUS_PER_TASK
  if [[ -z $cpus && -n ${SLURM_CPUS_ON_NODE:-} ]]; then
    cpus=$((SLURM_CPUS_ON_NODE / TASKS_PER_NODE))
    [[ $cpus -ge 1 ]] || cpus=1
  fi
  [[ -n $cpus ]] || cpus="CPUS_ON_NODE/$TASKS_PER_NODE"  # a dry run outside an allocation
  run srun --nodes="$NODES" --ntasks=$((NODES * TASKS_PER_NODE)) \
      --ntasks-per-node="$TASKS_PER_NODE" --gpus-per-node="$GPUS_PER_NODE" \
      --cpus-per-task="$cpus" --kill-on-bad-exit=1 --chdir="$REPO" \
      --export=ALL,XLA_PYTHON_CLIENT_MEM_FRACTION="$MEM_FRACTION" bash -c "$task_cmd"
}

if [[ -n ${SLURM_JOB_ID:-} ]]; then
  [[ -n ${SLURM_JOB_NODELIST:-} ]] || die "SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not"
  srun_step "$SLURM_JOB_NODELIST" "${PORT:-$((20000 + SLURM_JOB_ID % 10000))}"
else
  [[ $DRY_RUN == 1 ]] || command -v sbatch >/dev/null || die "sbatch not found (not a SLURM host?)"
  # sbatch --export splits its value at commas: DLLM_REPO would reach the job cut short
  [[ $REPO != *,* ]] || die "the checkout's path $REPO has a comma, which sbatch --export cannot" \
      "pass on: use a path without one (a link to it will do)"
  # The config and the overrides, checked before the job waits in the queue (hours, may be).
  [[ ! -f $CONFIG_FILE ]] || preflight "$PYTHON" "$REPO" "$CONFIG" 1 \
      ${OVERRIDES[@]+"${OVERRIDES[@]}"}
  # shellcheck disable=SC2054  # --export=ALL,VAR=value: one sbatch option, commas and all
  SBATCH=(sbatch --nodes="$NODES" --gpus-per-node="$GPUS_PER_NODE"
          --ntasks-per-node="$TASKS_PER_NODE" --export=ALL,DLLM_REPO="$REPO"
          --chdir="$REPO")
  [[ -z $PARTITION ]] || SBATCH+=(--partition="$PARTITION")
  [[ -z $ACCOUNT ]] || SBATCH+=(--account="$ACCOUNT")
  [[ -z $TIME ]] || SBATCH+=(--time="$TIME")
  run "${SBATCH[@]}" "$REPO/launch/slurm_gpu.sh" ${SUBMIT_ARGS[@]+"${SUBMIT_ARGS[@]}"}
  if [[ $DRY_RUN == 1 ]]; then
    PORT_NOTE=", PORT = 20000 + its job id % 10000"
    [[ -z $PORT ]] || PORT_NOTE=""
    echo "# then, inside the allocation (FIRST_NODE = its first host$PORT_NOTE):"
    srun_step FIRST_NODE "${PORT:-PORT}"
  fi
fi
