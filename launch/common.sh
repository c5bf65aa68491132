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
# The helpers below stop the script with its own die (status 2) before anything is created,
# queued or started.
# Stops unless FLAG has a value: a word, not empty and not another flag (`--workdir --dry-run`
# took --dry-run for the workdir, and the launch ran for real).
# Usage: need_value "$@" (in the argument loop, at FLAG)
need_value() {
  [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value"
  [[ $2 != --* ]] || die "$1 needs a value, not the flag '$2'"
}
GIVEN=()  # FLAG=VALUE of each flag need has taken
given() {  # FLAG: whether need has taken FLAG (and its value, printed)
  local flag_value
  for flag_value in ${GIVEN[@]+"${GIVEN[@]}"}; do
    if [[ ${flag_value%%=*} == "$1" ]]; then echo "${flag_value#*=}"; return 0; fi
  done
  return 1
}
# need_value, and FLAG not given before: of two values, which was meant? (the last one won)
# Usage: need "$@" (in the argument loop, at FLAG)
need() {
  need_value "$@"
  local was
  if was=$(given "$1"); then die "$1 given twice ('$was', then '$2'): give it once"; fi
  GIVEN+=("$1=$2")
}
# Stops unless VALUE, setting WHAT (a flag and its variable, or a variable), is a whole number
# >= LEAST (0) of at most 9 digits: bash arithmetic reads a word as a variable (unset: a crash
# under set -u; set: its value), 08 as bad octal, and wraps a number too large.
whole_number() {  # WHAT VALUE [LEAST]
  [[ $2 =~ ^(0|[1-9][0-9]{0,8})$ && $2 -ge ${3:-0} ]] \
      || die "$1: expected a whole number >= ${3:-0}, got '$2'"
}
# Stops unless the overrides for dllm_rl.main (the words after --) leave out the launcher's own
# --dry-run (it went to dllm_rl.main: the launch ran for real) and --config / --workdir (absl
# keeps the last one: the workers ran a config, or wrote to a folder, other than the launcher's,
# whose config check had read its own).
# Usage: launcher_flags_before_separator OVERRIDES...
launcher_flags_before_separator() {
  local word
  for word in "$@"; do
    case $word in
      --dry-run) die "--dry-run after '--' would go to dllm_rl.main, not stop the launch: put" \
          "it before '--'" ;;
      --config|--config=*|--workdir|--workdir=*) die "$word after '--': give ${word%%=*} before" \
          "'--' (the launcher passes its own to dllm_rl.main, where a second one replaces it)" ;;
    esac
  done
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
# Stops unless FILE, the config file of --config CONFIG (config_file), is a file: in a dry run
# too, which otherwise printed commands that fail on the workers.
# Usage: config_file_exists FILE CONFIG
config_file_exists() {
  [[ ! -d $1 ]] || die "config file $1 is a folder (--config $2): name a config file in it"
  [[ -f $1 ]] || die "config file $1 not found (--config $2)"
}
# The config file and the overrides checked with PYTHON (python -m dllm_rl.config.preflight, a
# fraction of a second: keys, types, mesh.data against SLICES) before anything is created or
# queued; problems stop the script (status 2). A PYTHON that cannot run the check here (missing,
# no dllm_rl to import, or a config file importing a package it lacks: any status but 0 and 2)
# leaves the checks to the workers, saying so and why (the check's last line). On status 0 what
# the check said (its warnings: a setting the run does not read) is shown, and the launch goes on.
# Usage: preflight PYTHON REPO CONFIG SLICES OVERRIDES...
preflight() {
  local python=$1 repo=$2 config=$3 slices=$4 said status=0
  shift 4
  said=$(cd "$repo" && "$python" -m dllm_rl.config.preflight "$config" "$slices" "$@" 2>&1) \
      || status=$?
  case $status in
    0) [[ -z $said ]] || echo "$said" >&2 ;;
    2) echo "$said" >&2
       die "$config with these overrides: see the errors above ($python -m" \
           "dllm_rl.config.preflight); nothing was created or submitted" ;;
    *) said=${said%$'\n'}
       said=${said##*$'\n'}  # the last line: why
       echo "${0##*/}: note: the config and overrides are checked on the workers only: $python" \
            "cannot check them here (${said#note: })" >&2 ;;
  esac
}
