#!/usr/bin/env bash
# Every GPU-side check in one run, for a machine with an NVIDIA GPU (Chapter 1
# onwards): configure with CUDA, build, run the GPU tests (label cuda), the
# kernel benchmarks, and PyTorch's equivalent casts where torch is installed,
# then write a short report. Depends on: CMake, nvcc, the Debian packages of
# ./mpt.sh; torch is optional.
#
#   tools/gpu_report.sh [OUT_DIR]      (default: build-gpu/report)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-gpu}
out=${1:-$build/report}
mkdir -p "$out"
report="$out/report.txt"
: >"$report"
say() { echo "$*" | tee -a "$report"; }

say "# mpt GPU report, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$report"

if ! cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMPT_CUDA=ON -DMPT_BENCHMARKS=ON >"$out/configure.log" 2>&1; then
  say "configure FAILED (see configure.log)"; exit 1
fi
if ! cmake --build "$build" -j "$(nproc)" >"$out/build.log" 2>&1; then
  say "build FAILED (see build.log)"; tail -30 "$out/build.log" | tee -a "$report"; exit 1
fi
say "build: ok"

say ""
say "## GPU tests (ctest -L cuda)"
ctest --test-dir "$build" -L cuda --output-on-failure >"$out/ctest-cuda.log" 2>&1
status=$?
grep -E "tests passed|tests failed|Skipped|Failed|Passed" "$out/ctest-cuda.log" | tee -a "$report"

say ""
say "## Kernel benchmarks"
for b in "$build"/tests/bench/bench_*_cuda; do
  [[ -x $b ]] || continue
  "$b" 2>&1 | tee -a "$report"
done

say ""
say "## PyTorch's casts on the same device (if torch is installed)"
python3 - <<'PY' 2>&1 | tee -a "$report"
try:
    import torch
except Exception as e:  # torch is optional
    print(f"torch not importable ({e.__class__.__name__}); skipped")
    raise SystemExit(0)
if not torch.cuda.is_available():
    print("torch has no CUDA device; skipped")
    raise SystemExit(0)
n = 1 << 26
x = torch.randn(n, device="cuda") * 1000
def ms(f, reps=21):
    f(); f()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = []
    for _ in range(reps):
        s.record(); f(); e.record(); e.synchronize(); t.append(s.elapsed_time(e))
    return sorted(t)[reps // 2]
y = torch.empty_like(x)
copy = ms(lambda: y.copy_(x))
print(f"torch {torch.__version__}, n = {n}; copy_ fp32: {2 * 4 * n / copy / 1e6:.1f} GB/s")
cases = [("fp32 -> fp16", lambda: x.half(), 6), ("fp32 -> bf16", lambda: x.bfloat16(), 6)]
if hasattr(torch, "float8_e4m3fn"):
    cases.append(("fp32 -> e4m3 (sat by clamp)", lambda: x.clamp(-448, 448).to(torch.float8_e4m3fn), 5))
for name, f, b in cases:
    t = ms(f)
    print(f"{name:28s} {t:8.3f} ms {b * n / t / 1e6:8.1f} GB/s {copy / t * b / 8:6.2f} x copy")
PY
say ""
say "ctest exit status: $status"
exit $status
