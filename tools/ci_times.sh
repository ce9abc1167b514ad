#!/usr/bin/env bash
# All chapters — where a build's time went: the stages ./mpt.sh timed, the
# slowest compiles and links (the build's own record, tools/compile_time.sh),
# and the slowest tests with their limits (CTest's own timing record,
# Testing/Temporary/CTestCostData.txt, and the limits from ctest --show-only).
# Depends on: bash, awk, sort, ctest, python3 (to read ctest's JSON).
#
#   tools/ci_times.sh BUILD_DIR [N]    the N slowest of each (default 15)
#
# A test over 300 s is marked: the budget (README, "CI and its budget") is at most
# 5 minutes a test.
set -euo pipefail
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: tools/ci_times.sh BUILD_DIR [N]" >&2; exit 2; }
build=$1
n=${2:-15}
[[ -d $build ]] || { echo "ci_times: $build is not a directory (a build directory, e.g. build or build/asan)" >&2; exit 2; }
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "ci_times: N must be a positive integer, not '$n'" >&2; exit 2; }
build=$(cd "$build" && pwd)

echo "== $build"
if [[ -f $build/stage-times.tsv ]]; then
  echo "-- stages (./mpt.sh; wall seconds)"
  awk -F'\t' '{ printf "  %-28s %8.1f s\n", $1, $2; total += $2 } END { printf "  %-28s %8.1f s (%.1f min)\n", "total", total, total / 60 }' \
    "$build/stage-times.tsv"
fi

if [[ -f $build/build-times.tsv ]]; then
  # The last record of each output counts (a rebuild appends).
  awk -F'\t' '{ t[$4] = $1; k[$4] = $2 } END { for (o in t) print t[o] "\t" k[o] "\t" o }' "$build/build-times.tsv" |
    sort -t$'\t' -k1,1gr >"$build/.build-times.sorted"
  awk -F'\t' '
    { s[$2] += $1; c[$2]++ }
    END { printf "-- build: %d compiles %.0f s, %d links %.0f s (summed over jobs; wall is less with -j)\n",
                 c["compile"], s["compile"], c["link"], s["link"] }' "$build/.build-times.sorted"
  echo "-- the $n slowest compiles and links (s)"
  head -n "$n" "$build/.build-times.sorted" | awk -F'\t' -v root="$build/" '{ o = $3; sub(root, "", o); printf "  %7.1f  %-7s %s\n", $1, $2, o }'
  rm -f "$build/.build-times.sorted"
else
  echo "-- build: no record ($build/build-times.tsv; configure with -DMPT_BUILD_TIMES=ON, as ./mpt.sh does)"
fi

cost=$build/Testing/Temporary/CTestCostData.txt
if [[ ! -f $cost ]]; then
  echo "-- tests: no record ($cost; run ctest in $build first)"
  exit 0
fi
# Each test's limit (TIMEOUT), from the test list CTest itself reads.
limits=$(ctest --test-dir "$build" --show-only=json-v1 2>/dev/null | python3 -c '
import json, sys
for t in json.load(sys.stdin).get("tests", []):
    limit = next((p["value"] for p in t.get("properties", []) if p["name"] == "TIMEOUT"), "")
    print(t["name"], limit)
' || true)
# CTestCostData.txt: "name runs average-seconds" per test, then "---" and the failed ones.
awk -v lim="$limits" -v n="$n" '
  BEGIN { split(lim, rows, "\n"); for (i in rows) { split(rows[i], f, " "); limit[f[1]] = f[2] } }
  /^---/ { exit }
  # A test the build no longer defines (renamed, removed) keeps its line in
  # the record of a long-lived build directory: left out of the sum.
  NF >= 3 && ($1 in limit) { t[$1] = $3; total += $3; count++ }
  NF >= 3 && !($1 in limit) { stale++ }
  END {
    printf "-- tests: %d, %.0f s summed (%.1f min; wall is less with -j)\n", count, total, total / 60
    printf "-- (a running average per test over every ctest run in this directory: one that ran\n"
    printf "--  under load reads high; the budget is measured on a clean clone)\n"
    if (stale) printf "-- %d tests in the record are no longer defined: left out\n", stale
    printf "-- the %d slowest tests (s, limit s)\n", n
    cmd = "sort -k1,1gr | head -n " n
    for (name in t) printf "%.1f %s %s\n", t[name], name, (name in limit ? limit[name] : "?") | cmd
    close(cmd)
  }' "$cost" | awk '
  /^--/ { print; next }
  { mark = ($1 > 300) ? "   <-- over 5 min" : ""; printf "  %7.1f  %-44s limit %5s%s\n", $1, $2, $3, mark }'
