#!/usr/bin/env bash
# All chapters — the lint check (CTest `lint`): every C++/CUDA source is laid
# out as .clang-format says, and every C++ translation unit of a build passes
# .clang-tidy's checks.
# Depends on: bash, git, clang-format, clang-tidy, python3 (tools/lint_tidy.py
# reads the build's compile_commands.json), xargs.
#
#   tools/lint.sh BUILD_DIR       check (exit 1 with the first findings on failure)
#   tools/lint.sh --fix           reformat every source in place (no build needed)
#   tools/lint.sh --format-only   the layout check alone (no build needed)
set -euo pipefail
cd "$(dirname "$0")/.."

sources() { git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.h'; }

need() {
  command -v "$1" >/dev/null || { echo "lint: $1 not found (Debian: apt-get install $1)" >&2; exit 2; }
}

need clang-format
case "${1:-}" in
  --fix)
    sources | xargs clang-format -i
    echo "lint: reformatted $(sources | wc -l) files"
    exit 0
    ;;
  --format-only | "") mode=format ;;
  *) mode=all; build=$1 ;;
esac

# 1. Layout: clang-format's verdict on every tracked source.
if ! sources | xargs clang-format --dry-run --Werror 2>"${TMPDIR:-/tmp}/lint-format.$$"; then
  echo "lint: these files are not laid out as .clang-format says (fix: tools/lint.sh --fix):"
  grep -oE '^[^:]+\.(cpp|hpp|cu|cuh|h)' "${TMPDIR:-/tmp}/lint-format.$$" | sort -u | sed 's/^/  /'
  head -20 "${TMPDIR:-/tmp}/lint-format.$$"
  rm -f "${TMPDIR:-/tmp}/lint-format.$$"
  exit 1
fi
rm -f "${TMPDIR:-/tmp}/lint-format.$$"
echo "lint: $(sources | wc -l) files laid out as .clang-format says"
[[ $mode == format ]] && exit 0

# 2. Static checks: clang-tidy on the C++ translation units the build
#    compiles (CUDA files are left out: clang-tidy does not read nvcc's
#    dialect), checked in groups of units that share their flags, and the
#    unused using-declarations clang-tidy cannot see in a group
#    (tools/lint_tidy.py says why and how; its --self-test proves it).
need clang-tidy
need python3
db="$build/compile_commands.json"
[[ -f $db ]] || { echo "lint: $db is missing; configure with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON" >&2; exit 2; }
exec python3 tools/lint_tidy.py "$build" --jobs "${LINT_JOBS:-$(nproc)}"
