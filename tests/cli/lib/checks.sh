# What the CLI test scripts share: a scratch folder removed on exit, and counted checks.
# Source it after the script's own setup: source "$(dirname "$0")/lib/checks.sh"
# Then: check "what" COMMAND..., exit_is CODE COMMAND..., and at the end: finish NAME.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
checks=0

check() {  # check DESCRIPTION COMMAND...: counts a check, reports it when COMMAND fails
  local what=$1
  shift
  checks=$((checks + 1))
  if ! "$@"; then
    echo "FAIL: $what"
    failures=$((failures + 1))
  fi
}

exit_is() {  # exit_is CODE COMMAND...: COMMAND exits with CODE (its output is dropped)
  local want=$1
  shift
  "$@" >/dev/null 2>&1
  [ $? -eq "$want" ]
}

finish() {  # finish NAME: prints the tally; the script's status is whether every check passed
  echo "$1: $((checks - failures)) of $checks checks passed"
  [ "$failures" -eq 0 ]
}
