# What the CLI tests (tests/cli_*.sh) share; sourced after `set -uo pipefail` and GRASS set:
# a temporary directory removed on exit ($tmp), the pass and fail counts, `expect` (one grass
# command against its exit code and a substring of its output) and `finish` (the summary line and
# the test's exit status).
: "${GRASS:?set GRASS to the grass binary}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
passes=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { passes=$((passes + 1)); }

# expect <exit code> <substring of stdout or stderr, or ""> -- <grass args...>: the output goes to
# $tmp/stdout and $tmp/err; a user error (exit 2) must be one line on stderr.
expect() {
  local want_code=$1 want_msg=$2
  shift 3
  "$GRASS" "$@" >"$tmp/stdout" 2>"$tmp/err"
  local code=$?
  if [ "$code" != "$want_code" ]; then
    fail "grass $* exited $code, expected $want_code"; cat "$tmp/stdout" "$tmp/err"; return
  fi
  if [ -n "$want_msg" ] && ! grep -qF -- "$want_msg" "$tmp/stdout" "$tmp/err"; then
    fail "grass $*: output lacks \"$want_msg\":"; cat "$tmp/stdout" "$tmp/err"; return
  fi
  if [ "$want_code" = 2 ] && [ "$(wc -l <"$tmp/err")" != 1 ]; then
    fail "grass $*: expected one error line:"; cat "$tmp/err"; return
  fi
  pass
}

# finish <name>: the summary, and a failing status when anything failed
finish() {
  echo "$1: $passes passed, $failures failed"
  [ "$failures" = 0 ]
}
