#!/usr/bin/env bash
# Chapter 05 — the gradient all-reduce benchmarks, all three parts, under mpiexec.
# Depends on: bash, coreutils (timeout), awk, mpiexec; the program bench_ch05_allreduce.
#
#   bench_ch05_allreduce.sh PROGRAM [--quick] [--repeats=R] [--width=W] [--layers=L] [--batch=B]
#
# (1) and (2) at 2 ranks, (3) at world sizes 1, 2 and 4, every job under a
# hard time limit (MPT_BENCH_LIMIT seconds, default 300). MPT_MPIEXEC is the
# mpiexec command line (default: mpiexec --allow-run-as-root --oversubscribe
# --bind-to none, what CI, running as root on 2 cores, needs).
set -euo pipefail
if [[ $# -lt 1 || ! -x $1 ]]; then
  echo "bench_ch05_allreduce.sh: the first argument must be the bench_ch05_allreduce program, not '${1:-}'" >&2
  exit 2
fi
program=$1
shift
read -r -a mpiexec <<<"${MPT_MPIEXEC:-mpiexec --allow-run-as-root --oversubscribe --bind-to none}"
limit=${MPT_BENCH_LIMIT:-300}

job() {  # job N ARGS...: the program at N ranks, killed after $limit s
  local n=$1
  shift
  local rc=0
  timeout --kill-after=5 "$limit" "${mpiexec[@]}" -n "$n" "$program" "$@" || rc=$?
  if [[ $rc -ne 0 ]]; then
    [[ $rc -eq 124 || $rc -eq 137 ]] && echo "bench_ch05_allreduce.sh: mpiexec -n $n $* ran past ${limit} s and was killed" >&2
    [[ $rc -ne 124 && $rc -ne 137 ]] && echo "bench_ch05_allreduce.sh: mpiexec -n $n $* failed (status $rc)" >&2
    exit 1
  fi
}

job 2 --part=reduce "$@"
echo
job 2 --part=overlap "$@"
echo
worlds=$(for n in 1 2 4; do job "$n" --part=world "$@"; done)
echo "time per step by world size, the same global batch split over the ranks (strong scaling)"
echo
echo "$worlds" | awk '
  { ms = $(NF-4); if (NR == 1) first = ms
    printf "%s  x world 1: %.2f\n", $0, ms / first }'
echo
echo "one machine with $(nproc) cores has no network and no GPU: at world size 4 the ranks share the cores"
echo "(oversubscribed), so the times show what the cores allow, not how data parallelism scales across machines"
