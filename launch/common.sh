# shellcheck shell=bash
# Shared by the launch scripts (sourced, not run): print each command before running it,
# quoted so that the printed line can be pasted into a shell; with DRY_RUN=1 only print.
# Shell-quotes one word only where needed, so printed commands stay readable and runnable.
quote() {
  if [[ $1 =~ ^[A-Za-z0-9_./:=@,+%-]+$ ]]; then printf '%s' "$1"
  elif [[ $1 != *\'* ]]; then printf "'%s'" "$1"
  elif [[ $1 != *[\$\`\"\\!]* ]]; then printf '"%s"' "$1"
  else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
quote_all() { local w out=(); for w in "$@"; do out+=("$(quote "$w")"); done; echo "${out[*]}"; }
run() {
  echo "+ $(quote_all "$@")"
  if [[ $DRY_RUN == 0 ]]; then "$@"; fi
}
# The config file and the overrides checked with PYTHON (python -m dllm_rl.config.preflight, a
# fraction of a second: keys, types, mesh.data against SLICES) before anything is created or
# queued; problems stop the script (status 2). A PYTHON that cannot run the check here (missing,
# or no dllm_rl to import: any status but 0 and 2) leaves the checks to the workers, saying so.
# Usage: preflight PYTHON REPO CONFIG SLICES OVERRIDES...
preflight() {
  local python=$1 repo=$2 config=$3 slices=$4 said status=0
  shift 4
  said=$(cd "$repo" && "$python" -m dllm_rl.config.preflight "$config" "$slices" "$@" 2>&1) \
      || status=$?
  case $status in
    0) ;;
    2) echo "$said" >&2
       die "$config with these overrides: see the errors above ($python -m" \
           "dllm_rl.config.preflight); nothing was created or submitted" ;;
    *) echo "${0##*/}: note: $python cannot import dllm_rl here: the config and overrides are" \
           "checked on the workers only" >&2 ;;
  esac
}
