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
