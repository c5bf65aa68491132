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
# The file that --config CONFIG names, as dllm_rl.main reads it from REPO: CONFIG (relative to
# REPO unless absolute), or FILE of FILE:ARG (ml_collections' convention: get_config("ARG"))
# where no file is named CONFIG itself, as dllm_rl.config.load_config_file decides.
# Usage: config_file REPO CONFIG
config_file() {
  local repo=$1 config=$2
  [[ $config == /* ]] || config=$repo/$config
  if [[ ! -e $config && $2 == *:* ]]; then config=${config%:*}; fi
  echo "$config"
}
# The config file and the overrides checked with PYTHON (python -m dllm_rl.config.preflight, a
# fraction of a second: keys, types, mesh.data against SLICES) before anything is created or
# queued; problems stop the script (status 2). A PYTHON that cannot run the check here (missing,
# no dllm_rl to import, or a config file importing a package it lacks: any status but 0 and 2)
# leaves the checks to the workers, saying so and why (the check's last line).
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
    *) said=${said%$'\n'}
       said=${said##*$'\n'}  # the last line: why
       echo "${0##*/}: note: the config and overrides are checked on the workers only: $python" \
            "cannot check them here (${said#note: })" >&2 ;;
  esac
}
