#!/usr/bin/env bash
# All chapters — prepares, on a machine with nvcc and the project's Debian
# packages, everything a GPU machine needs to check the kernels without
# building anything there: the GPU tests, the GPU benchmarks and the dump
# program of the PyTorch comparison, for sm_80 and sm_90 (machine code for
# both, and sm_90's PTX, which a newer GPU's driver compiles at the first
# launch; sm_80's PTX would only add bytes: every 8.x GPU runs sm_80's
# code, and the bundle must stay under 64 MiB), each linked against
# the CUDA runtime, libstdc++ and libgcc statically, in one folder (the
# bundle) that one copy can carry. tools/gpu_report.sh runs it on the GPU.
# Chapter 5's NCCL test (test_ch05_nccl_cuda, built where nccl.h is found)
# is in the bundle too, without libnccl (about 200 MB): it opens
# libnccl.so.2 at run time, and gpu_report.sh finds one on the GPU machine
# (the installed PyTorch's NCCL wheel) or reports "NCCL not found".
# Depends on: bash, CMake, nvcc (or the build's CUDA toolkit), ldd, du,
# sha256sum, git.
#
#   tools/gpu_prepare.sh [BUILD_DIR]       configure BUILD_DIR (default build-gpu)
#                                          if needed, build the bundle
#                                          (BUILD_DIR/gpu-bundle) and check it
#   tools/gpu_prepare.sh --check BUNDLE    check a bundle that exists: every
#                                          program needs only the C library,
#                                          the total stays under 64 MiB; writes
#                                          BUNDLE/MANIFEST.txt (the gpu-bundle
#                                          build target calls this)
#
# Then, on the GPU machine, from the repository root:
#   tools/gpu_report.sh BUILD_DIR/gpu-bundle OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."

readonly limit_bytes=$((64 * 1024 * 1024))
# What a machine with only the NVIDIA driver surely has: the C library's
# parts and the loader. libcuda.so.1 (the driver) is opened at run time by
# the static CUDA runtime, so ldd does not list it.
readonly allowed='^(linux-vdso\.so\.1|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|ld-linux-x86-64\.so\.2|/lib64/ld-linux-x86-64\.so\.2)$'

die() {
  echo "gpu_prepare: $*" >&2
  exit 1
}

check_bundle() {
  local bundle=$1
  [[ -d $bundle/bin ]] || die "$bundle/bin does not exist; build the bundle first (tools/gpu_prepare.sh BUILD_DIR)"
  local programs=("$bundle"/bin/*)
  [[ -e ${programs[0]} ]] || die "$bundle/bin holds no programs"
  local p lib bad=0
  for p in "${programs[@]}"; do
    [[ -x $p ]] || die "$p is not executable"
    # Every dependency resolved here and in the allowed set.
    while read -r lib; do
      [[ -z $lib ]] && continue
      if [[ ! $lib =~ $allowed ]]; then
        echo "gpu_prepare: $(basename "$p") needs $lib, which a machine with only the driver may lack" >&2
        bad=1
      fi
    done < <(ldd "$p" 2>&1 | awk '/not a dynamic executable/ {next} /not found/ {print $1 " (not found)"; next} {print $1}')
  done
  ((bad == 0)) || die "link the CUDA runtime and libstdc++ statically (-DMPT_CUDA_STATIC_RUNTIME=ON)"
  local bytes
  bytes=$(du -sb "$bundle" | awk '{print $1}')
  ((bytes < limit_bytes)) || die "the bundle is $bytes bytes; it must stay under $limit_bytes (64 MiB) to be carried"
  {
    echo "mpt GPU bundle"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
    echo "architectures: ${MPT_CUDA_ARCHITECTURES:-80-real 90}"
    echo "size: $bytes bytes"
    echo "programs (sha256, bytes, name):"
    for p in "${programs[@]}"; do
      printf '  %s  %9d  %s\n' "$(sha256sum "$p" | cut -c1-16)" "$(stat -c %s "$p")" "$(basename "$p")"
    done
  } >"$bundle/MANIFEST.txt"
  echo "gpu_prepare: $bundle: ${#programs[@]} programs, $bytes bytes, each needs only the C library and the driver"
}

if [[ ${1:-} == --check ]]; then
  [[ $# -eq 2 ]] || die "usage: tools/gpu_prepare.sh --check BUNDLE_DIR"
  check_bundle "$2"
  exit 0
fi
[[ $# -le 1 ]] || die "usage: tools/gpu_prepare.sh [BUILD_DIR] | --check BUNDLE_DIR"
build=${1:-build-gpu}

if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMPT_CUDA=ON -DMPT_CUDA_STATIC_RUNTIME=ON \
    -DMPT_TESTS=ON -DMPT_BENCHMARKS=ON -DMPT_DOCS=OFF -DMPT_NOTEBOOKS=OFF \
    "-DCMAKE_CUDA_ARCHITECTURES=80-real;90" >"${TMPDIR:-/tmp}/gpu_prepare_configure.log" 2>&1 ||
    { tail -20 "${TMPDIR:-/tmp}/gpu_prepare_configure.log" >&2; die "configure failed"; }
fi
grep -qE '^CMAKE_CUDA_COMPILER:(FILEPATH|STRING)=/' "$build/CMakeCache.txt" ||
  die "$build has no CUDA compiler: nvcc is needed here (it looks on PATH and in /usr/local/cuda/bin)"
grep -qE '^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=80-real;90$' "$build/CMakeCache.txt" ||
  die "$build is configured for other CUDA architectures; reconfigure with -DCMAKE_CUDA_ARCHITECTURES='80-real;90' (or remove $build)"
grep -q '^MPT_CUDA_STATIC_RUNTIME:BOOL=ON' "$build/CMakeCache.txt" ||
  die "$build links the CUDA runtime dynamically; reconfigure with -DMPT_CUDA_STATIC_RUNTIME=ON"
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target gpu-bundle
[[ -x $build/gpu-bundle/bin/test_ch05_nccl_cuda ]] ||
  echo "gpu_prepare: nccl.h was not found here (MPT_NCCL_INCLUDE_DIR in $build/CMakeCache.txt): the bundle has no NCCL test"
echo "gpu_prepare: carry $build/gpu-bundle to the GPU machine and run there:"
echo "  tools/gpu_report.sh $build/gpu-bundle OUT_DIR"
