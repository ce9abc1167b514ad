#!/usr/bin/env bash
# All chapters — tools/gpu_report.sh checked where it can be: on a machine
# whose GPU tests cannot run, the report must fail (exit 1) and say that
# every GPU test skipped, write report.txt first and at most 8 files, and
# finish well inside its budget. On a machine where they do run, this check
# has nothing to prove and exits 77 (CTest: Skipped).
# Depends on: bash, tools/gpu_report.sh, a bundle (the gpu-bundle target).
#
#   report_checks.sh BUNDLE_DIR OUT_DIR
set -u
bundle=$1
out=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*"; echo "--- report.txt:"; cat "$out/report.txt" 2>/dev/null; exit 1; }

# A GPU test that runs here means a usable GPU: nothing to check.
probe=$(ls "$bundle"/bin/test_*_cuda 2>/dev/null | head -1)
[[ -n $probe ]] || fail "the bundle $bundle has no GPU test"
"$probe" -tc='*no test has this name*' >/dev/null 2>&1
[[ $? -eq 77 ]] || { echo "a GPU is usable here: the report's no-GPU failure cannot be checked"; exit 77; }

rm -rf "$out"
t0=$(date +%s)
bash "$root/tools/gpu_report.sh" "$bundle" "$out" >/dev/null 2>&1
rc=$?
secs=$(($(date +%s) - t0))
[[ $rc -eq 1 ]] || fail "exit status $rc where every GPU test skipped; expected 1 (a failure, not a pass)"
[[ -s $out/report.txt ]] || fail "no report.txt"
grep -q '^FAIL: every GPU test skipped: no usable GPU' "$out/report.txt" || fail "report.txt does not say that every test skipped"
grep -q '^# mpt GPU report' "$out/report.txt" || fail "report.txt does not start with its title"
files=$(find "$out" -type f | wc -l)
((files <= 8)) || fail "$files files under $out; at most 8"
((secs < 420)) || fail "took $secs s; the budget is 7 minutes"
# Every test of the bundle was tried and reported as skipped.
for t in "$bundle"/bin/test_*_cuda; do
  name=$(basename "$t")
  [[ $name == *_large_n_cuda ]] && continue
  if [[ $name == test_ch05_nccl_cuda ]]; then
    # Its own step: skipped, or not run where this machine has no libnccl.so.2.
    grep -qE "^$name +(skipped|not run: NCCL not found)" "$out/report.txt" || fail "$name is not reported as skipped or NCCL not found"
    continue
  fi
  grep -qE "^$name +skipped" "$out/report.txt" || fail "$name is not reported as skipped"
done
echo "gpu_report.sh without a GPU: exit 1, 'every GPU test skipped', $files files, $secs s"
