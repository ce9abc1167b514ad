#!/usr/bin/env bash
# All chapters — the command registry of `mpt` (src/cli/command.hpp), checked
# as a user sees it: every registered family's subcommands are there, in
# order-key order, and each answers --help.
# Depends on: cli_lib.sh (the shared harness), bash, awk, cmp, diff.
#
# Usage: commands_checks.sh PATH/TO/mpt CASE COMMAND...: the COMMANDs are the
# top-level subcommands `mpt --help` must list, in that order
# (MPT_CLI_COMMAND_ORDER in tests/cli/CMakeLists.txt). Exit 0 pass, 1 fail.
set -u

MPT=$1
CASE=$2
shift 2
EXPECTED=("$@")
. "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"

# run ARGS...: run mpt with nothing on its standard input.
run() {
  ARGS="$*"
  "$MPT" "$@" </dev/null >"$OUT" 2>"$ERR"
  RC=$?
}

# The names in the "Subcommands:" section of the help text in "$OUT": the
# lines indented by two spaces (a name too long for its column has its
# description on the next line, indented further).
listed_subcommands() {
  awk '/^Subcommands:$/ { on = 1; next } on && NF == 0 { exit } on && /^  [^ ]/ { print $1 }' "$OUT"
}

case "$CASE" in

help_lists_commands_in_order)
  [ "${#EXPECTED[@]}" -gt 0 ] || fail "no expected commands given"
  run --help
  expect_rc 0
  printf '%s\n' "${EXPECTED[@]}" >"$WORK/expected"
  listed_subcommands >"$WORK/listed"
  cmp -s "$WORK/expected" "$WORK/listed" || fail "the subcommands in --help are not the expected ones, in order:
$(diff "$WORK/expected" "$WORK/listed")"
  # The error line for a missing subcommand names the same, in the same order.
  run
  expect_usage_error "valid subcommands: $(printf '%s\n' "${EXPECTED[@]}" | paste -sd, | sed 's/,/, /g')"
  ;;

every_command_answers_help)
  # Every subcommand, nested ones too, prints its own help and exits 0.
  queue=("${EXPECTED[@]}")
  checked=0
  while [ "${#queue[@]}" -gt 0 ]; do
    cmd=${queue[0]}
    queue=("${queue[@]:1}")
    # shellcheck disable=SC2086  # a nested command is several words
    run $cmd --help
    expect_rc 0
    [ ! -s "$ERR" ] || fail "help wrote to stderr"
    expect_out "Usage: mpt $cmd "
    for sub in $(listed_subcommands); do queue+=("$cmd $sub"); done
    checked=$((checked + 1))
  done
  echo "$checked subcommands answer --help"
  ;;

*)
  echo "unknown case '$CASE'"
  exit 1
  ;;
esac
exit 0
