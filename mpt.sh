#!/usr/bin/env bash
# The two commands of the README, on a fresh Debian 12 machine:
#
#   ./mpt.sh tour   install what is missing, build, run every pitfall (mpt tour)
#   ./mpt.sh test   install what is missing, build, run the whole test suite
#   ./mpt.sh harden install what is missing, build the asan preset (clang,
#                   ASan + UBSan, UB fatal), run its CPU suite, then run
#                   every fuzz target for FUZZ_SECONDS over its corpus
#
# Environment: BUILD_DIR (default build; build/asan for harden), JOBS
# (default: number of cores), MPT_CMAKE_ARGS (extra configure arguments,
# e.g. -DMPT_CUDA=OFF), FUZZ_SECONDS (harden: per target, default 30).
set -euo pipefail
cd "$(dirname "$0")"

usage() { echo "usage: ./mpt.sh tour|test|harden" >&2; exit 2; }
[[ $# -eq 1 ]] || usage
what=$1
[[ $what == tour || $what == test || $what == harden ]] ||
  { echo "mpt.sh: unknown command '$what'; valid: tour, test, harden" >&2; exit 2; }

if [[ $what == harden ]]; then BUILD_DIR=${BUILD_DIR:-build/asan}; else BUILD_DIR=${BUILD_DIR:-build}; fi
JOBS=${JOBS:-$(nproc)}

# Debian packages the build needs (CUDA is optional and not from Debian).
# python3-sklearn is not installed: tools/fetch_digits.sh only extracts the
# digits data file from its .deb.
packages=(cmake g++ make libeigen3-dev libcli11-dev nlohmann-json3-dev zlib1g-dev)
if [[ $what == test ]]; then
  # tests, benchmarks, the docs site (Doxygen, Graphviz), the notebooks'
  # kernel (a virtualenv in the build tree; pip builds CPyCppyy against Python.h),
  # the lint test (clang-format, clang-tidy), mpt train --plot's gnuplot,
  # OpenMPI for Chapter 5's ranks (the MPI backend, the tests under mpiexec)
  packages+=(doctest-dev libbenchmark-dev python3 python3-venv python3-dev doxygen graphviz
             clang-format clang-tidy gnuplot-nox openmpi-bin libopenmpi-dev)
fi
if [[ $what == harden ]]; then
  # the suite (doctest, python3 for the CLI's JSON cases), clang with the
  # sanitizer and libFuzzer runtimes, llvm for llvm-symbolizer (stacks
  # with file and line)
  packages+=(doctest-dev python3 clang libclang-rt-14-dev llvm)
fi

# Each stage's wall time goes to BUILD_DIR/stage-times.tsv (tools/ci_times.sh
# prints it beside the slowest compiles and tests).
mkdir -p "$BUILD_DIR"
stage_log="$BUILD_DIR/stage-times.tsv"
: >"$stage_log"
stage() {
  local name=$1 start=${EPOCHREALTIME/./} rc=0
  shift
  "$@" || rc=$?
  local us=$((${EPOCHREALTIME/./} - start))
  printf '%s %s\t%d.%02d\n' "$what" "$name" $((us / 1000000)) $((us % 1000000 / 10000)) >>"$stage_log"
  return $rc
}

install_missing() {
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "mpt.sh: installing missing Debian packages: ${missing[*]}" >&2
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
}
stage "Debian packages" install_missing

if [[ $what == harden ]]; then
  # The preset holds the configuration (CMakePresets.json, "asan"); the
  # sanitizers' options hold for the suite and for the fuzzers alike.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:strict_string_checks=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
  # shellcheck disable=SC2086
  stage configure cmake --preset asan -B "$BUILD_DIR" -DMPT_BUILD_TIMES=ON ${MPT_CMAKE_ARGS:-}
  stage "fetch data" cmake --build "$BUILD_DIR" --target fetch-data
  # Only what the suite below runs: the preset leaves out the benchmarks, the
  # docs, the notebooks, the exercises' graders and the chapters' numbers
  # programs, and builds the library without unity files (a missing #include
  # shows; the CLI and the pitfalls keep them, for time).
  stage build cmake --build "$BUILD_DIR" -j "$JOBS"
  # The asan test preset's filter (ctest 3.25 reads a preset's tests from its
  # own binaryDir, whatever --test-dir says): the CPU and CLI suites.
  stage tests ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" -L 'cpu|cli' \
    -LE 'slow|bench|lint|docs|notebook|exercise'
  # Each fuzzer starts from the committed corpus and writes what it finds
  # (new inputs, a crash) into a scratch folder, never into the corpus; JOBS
  # of them at a time, each on one core.
  seconds=${FUZZ_SECONDS:-30}
  fuzz_one() {
    local name=$1 program=$2 corpus=$3 scratch
    scratch=$(mktemp -d)
    mkdir "$scratch/new"
    echo "mpt.sh: fuzzing $name for ${seconds}s (from $corpus)" >&2
    if ! "$program" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
         -artifact_prefix="$scratch/" "$scratch/new" "$corpus" < /dev/null >"$scratch/log" 2>&1; then
      cat "$scratch/log" >&2
      echo "mpt.sh: fuzz target $name failed; the input is in $scratch (fix the bug, then add the input" \
           "to $corpus under a name that says what it was)" >&2
      return 1
    fi
    grep -E '^stat::number_of_executed_units|^Done ' "$scratch/log" | sed "s/^/mpt.sh: $name: /" >&2
    rm -rf "$scratch"
  }
  fuzz_all() {
    local pids=() failed=0 name program corpus pid
    while IFS=$'\t' read -r name program corpus; do
      fuzz_one "$name" "$program" "$corpus" &
      pids+=($!)
      if ((${#pids[@]} >= JOBS)); then
        wait "${pids[0]}" || failed=1
        pids=("${pids[@]:1}")
      fi
    done < "$BUILD_DIR/tests/fuzz/fuzz_targets.txt"
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    return $failed
  }
  stage fuzzing fuzz_all
  exit 0
fi

tests=ON
[[ $what == test ]] || tests=OFF
# shellcheck disable=SC2086
stage configure cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DMPT_TESTS=$tests -DMPT_BENCHMARKS=$tests \
  -DMPT_DOCS=$tests -DMPT_NOTEBOOKS=$tests -DMPT_BUILD_TIMES=ON ${MPT_CMAKE_ARGS:-}
# The real data sets come out of Debian packages once (nothing at run time).
stage "fetch data" cmake --build "$BUILD_DIR" --target fetch-data
if [[ $what == tour ]]; then
  stage build cmake --build "$BUILD_DIR" -j "$JOBS" --target mpt_cli
  stage tour "$BUILD_DIR/src/cli/mpt" tour
else
  stage build cmake --build "$BUILD_DIR" -j "$JOBS"
  stage tests ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
fi
