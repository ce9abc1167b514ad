#!/usr/bin/env bash
# Chapter 05 — a rank that fails must end the whole job within seconds, with
# its message and a non-zero status, never a hang. Runs dist_faults CASE
# under mpiexec with 2 ranks and checks the status, the message and the time.
#
#   faults.sh PROGRAM CASE MPIEXEC [ARGS...]
# Depends on: bash, timeout (coreutils), grep.
set -uo pipefail
program=$1 case=$2
shift 2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s)
# 60 s is the hard limit of the job itself: a hang is caught here, and named.
timeout 60 "$@" -n 2 "$program" "$case" 3 >"$out" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
fail() { echo "faults.sh $case: $1 (exit $rc after ${elapsed} s); the job printed:"; cat "$out"; exit 1; }
[[ $rc -ne 124 ]] || fail "the job hung: killed after 60 s"
case $case in
  none)
    [[ $rc -eq 0 ]] || fail "the control case must exit 0"
    grep -q "every rank finished" "$out" || fail "rank 0 did not report the end"
    ;;
  throw)
    [[ $rc -ne 0 ]] || fail "a rank threw but the job exited 0"
    grep -q "mpt: rank 1 of 2: a planted failure in step 3" "$out" || fail "rank 1's message is missing"
    ;;
  kill)
    [[ $rc -ne 0 ]] || fail "a rank was killed but the job exited 0"
    ;;
  disagree)
    [[ $rc -ne 0 ]] || fail "the ranks disagreed but the job exited 0"
    # Whichever rank reports first (the other may be stopped before it prints).
    grep -Eq "mpt: rank ([01]) of 2: the ranks disagree on a collective: this rank calls all_reduce\(f32 x 64, max\) as collective #4 \(tag [34]\), rank [01] calls all_reduce\(f32 x 64, max\) as collective #4 \(tag [34]\)" "$out" ||
      fail "no rank's message names both calls and their tags"
    ;;
  leave)
    [[ $rc -ne 0 ]] || fail "a rank left but the job exited 0"
    grep -q "did not complete within 3 s" "$out" || fail "the waiting rank's message is missing"
    ;;
  *) echo "faults.sh: unknown case '$case'"; exit 2 ;;
esac
# "Within seconds": the timeout case waits its 3 s; every other ends sooner.
((elapsed <= 20)) || fail "the job took more than 20 s to end"
echo "faults.sh $case: ok (exit $rc after ${elapsed} s)"
