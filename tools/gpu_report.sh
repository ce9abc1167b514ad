#!/usr/bin/env bash
# All chapters — every GPU-side check in one run, on a machine with an NVIDIA
# GPU, from a bundle that tools/gpu_prepare.sh built elsewhere: nothing is
# built here, so the machine needs only the driver (plus, for the optional
# parts, compute-sanitizer and a Python with torch).
# Depends on: bash, coreutils (timeout), the bundle; optional: nvidia-smi,
# compute-sanitizer, python3 with torch (tools/gpu_torch_compare.py).
#
#   tools/gpu_report.sh [BUNDLE_DIR] [OUT_DIR]
#     (defaults: build-gpu/gpu-bundle, and $OUT or build-gpu/report)
#
#   tools/gpu_report.sh --self-test
#     (no GPU needed: runs the report on a bundle of programs that hang, with
#     a short budget and an nvidia-smi and a compute-sanitizer that hang too,
#     and fails unless it ends within that budget; CTest gpu_report_budget)
#
# It writes at most 8 files under OUT_DIR, report.txt first (the summary),
# and ends within its budget, 7 minutes (MPT_GPU_REPORT_BUDGET seconds, if
# set). Why that holds: every command that could take long or hang (the
# bundle's programs, nvidia-smi, compute-sanitizer, python3, find,
# ldconfig) runs through step(), under `timeout -k` with a limit of at most
# its own and of what is left of the budget less the kill grace: TERM at
# the limit, KILL (to its whole process group) 5 s later, so a step ends by
# the deadline even if it ignores TERM. A step with less than a few seconds
# left is not started, and the report says so. What runs outside step()
# reads and writes small local files only. A watchdog re-runs the script
# under `timeout -k 5 (budget + 30)`, should anything unforeseen still hang.
#   report.txt     the summary: device, tests, sanitizers, benchmarks, PyTorch
#   nvidia-smi.txt the device as nvidia-smi sees it
#   tests.log      every GPU test's output (the NCCL test's too)
#   sanitizer.log  compute-sanitizer memcheck and racecheck on small cases
#   bench.log      the kernel benchmarks, each beside a device-to-device copy
#   torch.log      the same operations through PyTorch: bits and times
#   large.log      the cases past 2^31 elements (MPT_GPU_LARGE=1)
# The NCCL backend's test (Chapter 5) needs libnccl.so.2, which is not in the
# bundle (about 200 MB): it is looked for in MPT_NCCL_LIBRARY, in the
# installed PyTorch's NCCL wheel (python3: nvidia.nccl) or anywhere under
# Python's site-packages, and in the loader's cache; where none is found the
# report says "NCCL not found" and the test is not run (not a failure).
# Exit status 0 when every GPU test ran and passed and no sanitizer found an
# error; 1 otherwise — in particular when every test skipped (no usable GPU:
# that is a failure here, not a pass).
set -uo pipefail
cd "$(dirname "$0")/.."

readonly budget=${MPT_GPU_REPORT_BUDGET:-420}  # seconds: 7 minutes
[[ $budget =~ ^[0-9]+$ ]] && ((budget >= 20)) ||
  { echo "gpu_report: MPT_GPU_REPORT_BUDGET must be a whole number of seconds >= 20, got '$budget'" >&2; exit 2; }
readonly kill_grace=5  # seconds between a step's TERM and its KILL
readonly margin=3      # seconds kept for what follows the last step (the summary lines)

if [[ ${1:-} == --self-test ]]; then
  # Two runs of the report, each with a budget of 20 s: one where
  # nvidia-smi ignores TERM and never ends, one where the first GPU test
  # does. Each must end within its budget, kill what hung (its whole
  # process group), say what timed out and what was left out, and exit 1.
  self=$(mktemp -d)
  trap 'rm -rf "$self"' EXIT
  hang='#!/usr/bin/env bash
trap "" TERM
while :; do sleep 1; done'
  quick='#!/usr/bin/env bash
echo "fake 0, 0, 0, 9.0"; exit 0'
  fail() { echo "gpu_report --self-test: FAIL: $*"; cat "$self/out/report.txt" 2>/dev/null; exit 1; }
  put() { printf '%s\n' "$2" >"$self/$1" && chmod +x "$self/$1"; }
  test_budget=20
  for hung in nvidia-smi test; do
    rm -rf "$self/bundle" "$self/path" "$self/out"
    mkdir -p "$self/bundle/bin" "$self/path"
    if [[ $hung == nvidia-smi ]]; then put path/nvidia-smi "$hang"; else put path/nvidia-smi "$quick"; fi
    if [[ $hung == test ]]; then put bundle/bin/test_ch01_hang_cuda "$hang"; else put bundle/bin/test_ch01_quick_cuda "$quick"; fi
    put bundle/bin/test_ch02_quick_cuda "$quick"
    put bundle/bin/bench_ch01_hang_cuda "$hang"
    put bundle/bin/gpu_ops_dump "$hang"
    put path/compute-sanitizer "$hang"
    t0=$(date +%s)
    PATH="$self/path:$PATH" MPT_GPU_REPORT_BUDGET=$test_budget bash "$0" "$self/bundle" "$self/out" >/dev/null 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
    ((secs <= test_budget)) || fail "$hung hanging: took $secs s with a budget of $test_budget s"
    ((rc == 1)) || fail "$hung hanging: exit status $rc; expected 1"
    grep -q "timed out" "$self/out/report.txt" || fail "$hung hanging: report.txt does not say what timed out"
    grep -q "not run, the time budget is spent" "$self/out/report.txt" ||
      fail "$hung hanging: report.txt does not say which steps were left out"
    pgrep -f "$self/" >/dev/null && fail "$hung hanging: a hanging program outlived its step"
    echo "gpu_report --self-test: $hung hanging, budget $test_budget s: ended in $secs s, exit status 1"
  done
  exit 0
fi

# The watchdog: the script again, under a hard limit past its budget.
if [[ -z ${MPT_GPU_REPORT_WATCHED:-} ]]; then
  MPT_GPU_REPORT_WATCHED=1 exec timeout -k 5 $((budget + 30)) bash "$0" "$@"
fi

bundle=${1:-build-gpu/gpu-bundle}
out=${2:-${OUT:-build-gpu/report}}
bin=$bundle/bin
[[ -d $bin ]] || { echo "gpu_report: $bin does not exist; make it with tools/gpu_prepare.sh" >&2; exit 2; }
mkdir -p "$out" || { echo "gpu_report: cannot create $out" >&2; exit 2; }
report=$out/report.txt
: >"$report"
start=$(date +%s)
readonly deadline=$((start + budget))
status=0
say() { printf '%s\n' "$*" | tee -a "$report"; }
elapsed() { echo $(($(date +%s) - start)); }
# left: the seconds a step started now may run and still be killed by the
# deadline (its limit, the kill grace and the margin all fit).
left() { echo $((deadline - $(date +%s) - kill_grace - margin)); }
# in_budget NEED: true when at least NEED seconds are left for a step (the
# least it needs to be worth starting; a quarter of the budget at most, so
# that a short budget still starts something); otherwise the report says it
# was left out.
in_budget() {
  local need=$1
  ((need > budget / 4)) && need=$((budget / 4))
  (($(left) >= need))
}
# step LIMIT CMD...: CMD under timeout -k, for at most LIMIT seconds and at
# most what is left; its exit status (124: timed out, 137: killed after it).
step() {
  local limit=$1 l
  shift
  l=$(left)
  ((l < limit)) && limit=$l
  ((limit < 1)) && return 124
  timeout -k "$kill_grace" "$limit" "$@"
}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

say "# mpt GPU report, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
[[ -f $bundle/MANIFEST.txt ]] && sed -n '2,4p' "$bundle/MANIFEST.txt" | tee -a "$report"

# --- the device -----------------------------------------------------------------------
say ""
say "## Device"
if command -v nvidia-smi >/dev/null; then
  step 10 nvidia-smi >"$out/nvidia-smi.txt" 2>&1
  rc=$?
  case $rc in
    0) ;;
    124 | 137) say "nvidia-smi: timed out" ;;
    *) say "nvidia-smi: exit status $rc" ;;
  esac
  step 10 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader >"$scratch/smi" 2>&1
  rc=$?
  tee -a "$report" <"$scratch/smi"
  ((rc == 0)) || say "nvidia-smi --query-gpu: exit status $rc"
else
  say "nvidia-smi not found"
fi

# --- the GPU tests ------------------------------------------------------------------------
say ""
say "## GPU tests"
: >"$out/tests.log"
ran=0 passed=0 failed=0 skipped=0
for t in "$bin"/test_*_cuda; do
  [[ -x $t ]] || continue
  name=$(basename "$t")
  [[ $name == *_large_n_cuda ]] && continue  # its own step below
  [[ $name == test_ch05_nccl_cuda ]] && continue  # its own step below (it needs libnccl)
  if ! in_budget 30; then say "$name: not run, the time budget is spent"; continue; fi
  t0=$(date +%s)
  {
    echo "=== $name"
    step 150 "$t"
  } >>"$out/tests.log" 2>&1
  rc=$?
  secs=$(($(date +%s) - t0))
  case $rc in
    0) result=passed; ((ran++, passed++)) ;;
    77) result=skipped; ((skipped++)) ;;
    124 | 137) result="FAILED (timed out after $secs s)"; ((ran++, failed++)) ;;
    *) result="FAILED (exit status $rc)"; ((ran++, failed++)) ;;
  esac
  say "$(printf '%-32s %-28s %4d s' "$name" "$result" "$secs")"
done
if ((ran == 0)); then
  why=$(grep -m1 -h 'SKIPPED' "$out/tests.log" | sed 's/^SKIPPED [^:]*: //')
  say "FAIL: every GPU test skipped: no usable GPU (${why:-no test ran})"
  status=1
elif ((failed > 0)); then
  say "FAIL: $failed of $ran GPU tests failed (see tests.log)"
  status=1
else
  if ((skipped > 0)); then say "all $passed GPU tests that ran passed ($skipped skipped)"; else say "all $passed GPU tests passed"; fi
fi

# --- the NCCL backend (Chapter 5): libnccl.so.2 from this machine ----------------------------
say ""
say "## NCCL backend"
# find_nccl: the path of a libnccl.so.2 on this machine, or nothing.
find_nccl() {
  if [[ -n ${MPT_NCCL_LIBRARY:-} && -f $MPT_NCCL_LIBRARY ]]; then echo "$MPT_NCCL_LIBRARY"; return; fi
  if command -v python3 >/dev/null; then
    local p dir
    # PyTorch's wheels depend on nvidia-nccl-cuXX: nvidia/nccl/lib/libnccl.so.2.
    p=$(step 30 python3 -c 'import nvidia.nccl as m, os; print(os.path.join(list(m.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
    if [[ -n $p && -f $p ]]; then echo "$p"; return; fi
    while read -r dir; do
      [[ -d $dir ]] || continue
      p=$(step 20 find "$dir" -maxdepth 5 -name 'libnccl.so.2' -print -quit 2>/dev/null)
      if [[ -n $p ]]; then echo "$p"; return; fi
    done < <(step 30 python3 -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
  fi
  step 20 ldconfig -p 2>/dev/null | awk '$1 == "libnccl.so.2" {print $NF; exit}'
}
nccl_test=$bin/test_ch05_nccl_cuda
if [[ ! -x $nccl_test ]]; then
  say "test_ch05_nccl_cuda is not in the bundle (nccl.h was not found where it was built): not run"
elif ! in_budget 30; then
  say "test_ch05_nccl_cuda: not run, the time budget is spent"
else
  nccl=$(find_nccl)
  if [[ -z $nccl ]]; then
    say "$(printf '%-32s %s' test_ch05_nccl_cuda "not run: NCCL not found (MPT_NCCL_LIBRARY, python3's nvidia.nccl, site-packages, ldconfig)")"
  else
    t0=$(date +%s)
    {
      echo "=== test_ch05_nccl_cuda (MPT_NCCL_LIBRARY=$nccl)"
      MPT_NCCL_LIBRARY=$nccl step 120 "$nccl_test"
    } >"$scratch/nccl.log" 2>&1
    rc=$?
    cat "$scratch/nccl.log" >>"$out/tests.log"
    secs=$(($(date +%s) - t0))
    case $rc in
      0) result=passed ;;
      77) if grep -q 'NCCL not found' "$scratch/nccl.log"; then result="not run: NCCL not found ($nccl does not open)"; else result=skipped; fi ;;
      124 | 137) result="FAILED (timed out after $secs s)"; status=1 ;;
      *) result="FAILED (exit status $rc)"; status=1 ;;
    esac
    say "$(printf '%-32s %-28s %4d s' test_ch05_nccl_cuda "$result" "$secs")"
    version=$(grep -m1 '^NCCL ' "$scratch/nccl.log")
    [[ -n $version ]] && say "$version"
  fi
fi

# --- compute-sanitizer on small cases -------------------------------------------------------
say ""
say "## compute-sanitizer (small cases)"
: >"$out/sanitizer.log"
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [[ -z $sanitizer ]]; then
  say "compute-sanitizer not found: not run"
elif ((ran == 0)); then
  say "not run: no GPU test could run on this machine"
else
  # TOOL PROGRAM DOCTEST-FILTER: small test cases that still launch every kernel family.
  checks=(
    "memcheck test_ch01_casts_cuda *pinned*,*bad arguments*"
    "memcheck test_ch01_range_report_cuda *tiny*,*hand-counted*,*range_counts_into*"
    "memcheck test_ch02_gemm_cuda *MLP*,*empty*"
    "memcheck test_ch02_scaler_cuda *tensor table*,*never cleared*,*inverse_scale*,*whole GradScaler*"
    "racecheck test_ch01_range_report_cuda *hand-counted*"
    "racecheck test_ch02_gemm_cuda *MLP*"
    "racecheck test_ch02_scaler_cuda *whole GradScaler*"
    "memcheck test_ch03_norms_cuda *small case of every kernel*,*empty sizes*"
    "racecheck test_ch03_norms_cuda *small case of every kernel*"
    "memcheck test_ch04_softmax_cuda *small case of every kernel*,*empty sizes*"
    "racecheck test_ch04_softmax_cuda *small case of every kernel*"
    "memcheck test_ch06_gemm_tc_cuda *MLP*,*empty sizes*"
    "racecheck test_ch06_gemm_tc_cuda *MLP*"
    "memcheck test_ch07_fp8_cuda *hand-made*,*all-zero block*,*bad arguments*"
    "racecheck test_ch07_fp8_cuda *hand-made*,*all-zero block*"
  )
  for c in "${checks[@]}"; do
    read -r tool prog filter <<<"$c"
    [[ -x $bin/$prog ]] || { say "$tool $prog: not in the bundle"; continue; }
    if ! in_budget 30; then say "$tool $prog: not run, the time budget is spent"; continue; fi
    echo "=== $tool $prog -tc=$filter" >"$scratch/one.log"
    step 90 "$sanitizer" --tool "$tool" --error-exitcode 3 "$bin/$prog" "-tc=$filter" >>"$scratch/one.log" 2>&1
    rc=$?
    cat "$scratch/one.log" >>"$out/sanitizer.log"
    summary=$(grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' "$scratch/one.log" | tail -1)
    if [[ -z $summary && $rc -ne 0 && $rc -ne 124 && $rc -ne 137 ]]; then
      # No summary at all: the tool could not instrument the program (some
      # sandboxed GPU runtimes do not allow it). Say so; it is not a finding.
      say "$tool $prog: compute-sanitizer could not run here (exit status $rc, no summary; see sanitizer.log); the other checks are left out"
      break
    fi
    case $rc in
      0) say "$tool $prog: clean ($summary)" ;;
      124 | 137) say "$tool $prog: timed out"; status=1 ;;
      *) say "$tool $prog: FAILED, exit status $rc ($summary)"; status=1 ;;
    esac
  done
fi

# --- the kernel benchmarks -----------------------------------------------------------------
say ""
say "## Kernel benchmarks (each beside a device-to-device cudaMemcpy measured in the same run)"
: >"$out/bench.log"
for b in "$bin"/bench_*_cuda; do
  [[ -x $b ]] || continue
  name=$(basename "$b")
  if ! in_budget 30; then say "$name: not run, the time budget is spent"; continue; fi
  echo "=== $name" >>"$out/bench.log"
  step 90 "$b" >>"$out/bench.log" 2>&1
  rc=$?
  case $rc in
    0) say "$name: see bench.log" ;;
    77) say "$name: skipped (no usable GPU)" ;;
    124 | 137) say "$name: timed out" ;;
    *) say "$name: FAILED, exit status $rc" ;;
  esac
done
# The lines that carry the figures, for the summary.
grep -hE 'GB/s|TFLOP|x memcpy|roofline' "$out/bench.log" | head -80 | tee -a "$report" >/dev/null
# Chapter 6's presets: the whole table (each preset's replayed step beside
# the cost model's estimate).
if grep -q '^=== bench_ch06_presets_cuda' "$out/bench.log"; then
  say ""
  say "### Chapter 6: each preset's Transformer step, replayed (bench_ch06_presets_cuda)"
  awk '/^=== bench_ch06_presets_cuda/ {on = 1; next} /^=== / {on = 0} on' "$out/bench.log" | head -40 |
    tee -a "$report" >/dev/null
fi

# --- PyTorch on the same operations -----------------------------------------------------------
say ""
say "## The same operations through PyTorch"
: >"$out/torch.log"
if ((ran == 0)); then
  say "not run: no GPU test could run on this machine"
elif ! in_budget 60; then
  say "not run: the time budget is spent"
elif [[ ! -x $bin/gpu_ops_dump ]]; then
  say "gpu_ops_dump is not in the bundle: not run"
else
  {
    step 60 "$bin/gpu_ops_dump" "$scratch/dump" && step 90 python3 tools/gpu_torch_compare.py "$scratch/dump"
  } >"$out/torch.log" 2>&1
  rc=$?
  cat "$out/torch.log" >>"$report"
  case $rc in
    0) ;;
    124 | 137) say "the comparison timed out (see torch.log)" ;;
    *) say "the comparison stopped with exit status $rc (see torch.log)" ;;
  esac
fi

# --- sizes past 2^31 -------------------------------------------------------------------------------
say ""
say "## Past 2^31 elements"
large=$bin/test_ch02_large_n_cuda
if [[ ! -x $large ]]; then
  say "test_ch02_large_n_cuda is not in the bundle: not run"
elif ((ran == 0)); then
  say "not run: no GPU test could run on this machine"
elif ! in_budget 90; then
  say "not run: the time budget is spent"
else
  MPT_GPU_LARGE=1 step 180 "$large" >"$out/large.log" 2>&1
  rc=$?
  case $rc in
    0) say "passed: a cast of 2^31 + 21 elements and a GEMM with N = INT_MAX" ;;
    77) say "skipped: $(grep -m1 SKIPPED "$out/large.log")" ;;
    124 | 137) say "FAILED: timed out"; status=1 ;;
    *) say "FAILED, exit status $rc (see large.log)"; status=1 ;;
  esac
fi

say ""
say "finished in $(elapsed) s; exit status $status"
exit $status
