#!/usr/bin/env bash
# Chapters 01 onwards — the harness shared by the CLI check scripts
# (cli_checks.sh, scaler_checks.sh): a scratch folder, the captured
# stdout/stderr/exit status of the last run, and the expect_* assertions.
# Depends on: bash, grep, cmp, diff, wc.
#
# Sourced, not run: the caller sets MPT (the mpt program) and CASE (the case
# name, for failure messages) first, then defines its own run() that sets
# ARGS and RC and writes "$OUT" and "$ERR".

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
OUT=$WORK/out
ERR=$WORK/err
RC=0
ARGS=""

fail() {
  echo "FAIL [$CASE] mpt $ARGS: $*"
  echo "--- exit status: $RC"
  echo "--- stdout:"
  head -c 4000 "$OUT"
  echo "--- stderr:"
  head -c 4000 "$ERR"
  exit 1
}

expect_rc() { [ "$RC" -eq "$1" ] || fail "exit status $RC, expected $1"; }
expect_out() { grep -qF -- "$1" "$OUT" || fail "stdout lacks '$1'"; }
expect_out_regex() { grep -qE -- "$1" "$OUT" || fail "stdout has no line matching /$1/"; }
expect_err() { grep -qF -- "$1" "$ERR" || fail "stderr lacks '$1'"; }
expect_out_exactly() {
  printf '%s\n' "$1" >"$WORK/expected"
  cmp -s "$WORK/expected" "$OUT" || fail "stdout differs from the expected:
$(diff "$WORK/expected" "$OUT")"
}

# A usage error: status 2, nothing on stdout, exactly one line on stderr
# that starts with "mpt" and contains every given string.
# run ARGS...: run $MPT with nothing on its standard input; stdout in $OUT,
# stderr in $ERR, the status in RC. A script that needs stdin defines its own.
run() {
  ARGS="$*"
  "$MPT" "$@" </dev/null >"$OUT" 2>"$ERR"
  RC=$?
}

expect_usage_error() {
  expect_rc 2
  [ ! -s "$OUT" ] || fail "stdout is not empty"
  local lines
  lines=$(wc -l <"$ERR")
  [ "$lines" -eq 1 ] || fail "stderr has $lines lines, expected exactly one"
  grep -q '^mpt' "$ERR" || fail "stderr does not start with 'mpt'"
  local s
  for s in "$@"; do expect_err "$s"; done
}

need_python() { command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }; }
