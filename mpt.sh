#!/usr/bin/env bash
# The two commands of the README, on a fresh Debian 12 machine:
#
#   ./mpt.sh tour   install what is missing, build, run every pitfall (mpt tour)
#   ./mpt.sh test   install what is missing, build, run the whole test suite
#
# Environment: BUILD_DIR (default build), JOBS (default: number of cores),
# MPT_CMAKE_ARGS (extra configure arguments, e.g. -DMPT_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")"

usage() { echo "usage: ./mpt.sh tour|test" >&2; exit 2; }
[[ $# -eq 1 ]] || usage
what=$1
[[ $what == tour || $what == test ]] || { echo "mpt.sh: unknown command '$what'; valid: tour, test" >&2; exit 2; }

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

# Debian packages the build needs (CUDA is optional and not from Debian).
# python3-sklearn is not installed: tools/fetch_digits.sh only extracts the
# digits data file from its .deb.
packages=(cmake g++ make libeigen3-dev libcli11-dev nlohmann-json3-dev zlib1g-dev)
if [[ $what == test ]]; then
  # tests, benchmarks, the docs site (Doxygen, Graphviz), the notebooks'
  # kernel (a virtualenv in the build tree; pip builds CPyCppyy against Python.h),
  # the lint test (clang-format, clang-tidy)
  packages+=(doctest-dev libbenchmark-dev python3 python3-venv python3-dev doxygen graphviz
             clang-format clang-tidy)
fi

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

tests=ON
[[ $what == test ]] || tests=OFF
# shellcheck disable=SC2086
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DMPT_TESTS=$tests -DMPT_BENCHMARKS=$tests \
  -DMPT_DOCS=$tests -DMPT_NOTEBOOKS=$tests ${MPT_CMAKE_ARGS:-}
# The real data sets come out of Debian packages once (nothing at run time).
cmake --build "$BUILD_DIR" --target fetch-data
if [[ $what == tour ]]; then
  cmake --build "$BUILD_DIR" -j "$JOBS" --target mpt_cli
  exec "$BUILD_DIR/src/cli/mpt" tour
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
  exec ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
fi
