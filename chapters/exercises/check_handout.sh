#!/usr/bin/env bash
# Exercise kit (every chapter) — CI check of one chapter's student handout,
# end to end. Depends on: tools/make_handout.sh, the chapter's
# exercises/handout.manifest, a built mpt tree, cmake, doctest,
# check_grader.cmake beside this file.
#   Usage: check_handout.sh CHAPTER SOURCE_DIR PREFIX WORK_DIR [cmake -D...]
# PREFIX is an installed mpt (the CTest fixture mpt_installed installs the
# build there once, for every handout check and the consumer check).
# MPT_GRADER_LAUNCHER (environment; words separated by '|'): the command the
# graders run under (Chapter 5's: mpiexec -n 2 ...).

# Makes the handout, checks that it holds every file of the manifest and no
# solution code, builds the handout against the installed mpt
# (find_package(mpt)), and grades the stubs (0 points) and the solution (full
# marks) there.
set -euo pipefail
[[ $# -ge 4 ]] || { echo "usage: check_handout.sh CHAPTER SOURCE_DIR PREFIX WORK_DIR [cmake -D...]" >&2; exit 2; }
nn=$(printf '%02d' "$((10#$1))")
src=$2
prefix=$3
work=$4
configure_args=("${@:5}")  # the compiler and flags the library was built with
kit=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
launcher=${MPT_GRADER_LAUNCHER:-}
fail() { echo "check_handout: FAIL: $*" >&2; exit 1; }

shopt -s nullglob
dirs=("$src"/chapters/"$nn"-*/exercises)
shopt -u nullglob
[[ ${#dirs[@]} -eq 1 ]] || fail "no chapters/$nn-*/exercises folder in $src"
ex=${dirs[0]}

rm -rf "$work"
mkdir -p "$work"
handout=$work/handout

echo "--- make the handout"
bash "$src/tools/make_handout.sh" "$nn" "$handout"

echo "--- what it holds (every file of the manifest)"
expected=(HANDOUT-INFO.txt)
while read -r from to _; do
  [[ -z ${from:-} || $from == \#* ]] && continue
  expected+=("${to:-$from}")
done < "$ex/handout.manifest"
for f in "${expected[@]}" README.md CMakeLists.txt "ex$nn.hpp" "ex$nn.cpp" CHAPTER.md \
         grader/grader.cmake grader/grader_kit.hpp grader/grader_main.cpp grader/grader.hpp; do
  [[ -f $handout/$f ]] || fail "missing $f"
done
ls "$handout"/grader/test_*.cpp >/dev/null 2>&1 || fail "no grader/test_*.cpp"
cmp -s "$handout/ex$nn.cpp" "$ex/student/ex$nn.cpp" || fail "ex$nn.cpp is not the stub file"
cmp -s "$handout/ex$nn.hpp" "$ex/ex$nn.hpp" || fail "ex$nn.hpp differs from the repository's"
for f in grader.cmake grader_kit.hpp grader_main.cpp; do
  cmp -s "$handout/grader/$f" "$kit/$f" || fail "grader/$f differs from chapters/exercises/$f"
done
grep -q '](CHAPTER.md)' "$handout/README.md" || fail "README.md does not link to CHAPTER.md"
# The chapter text stands on its own: its code as code blocks, not Doxygen's
# \snippet lines, and every picture it shows shipped beside it.
if grep -n '^\\snippet ' "$handout/CHAPTER.md"; then fail "CHAPTER.md shows \\snippet lines instead of the code"; fi
for pic in $(grep -o '](generated/[^)]*)' "$handout/CHAPTER.md" | sed 's/^](//; s/)$//'); do
  [[ -f $handout/$pic ]] || fail "CHAPTER.md shows $pic, which the handout lacks"
done
# Its links to the exercises lead to the handout's own files.
if grep -n '](exercises/' "$handout/CHAPTER.md"; then
  fail "CHAPTER.md links to exercises/..., which the handout ships under other names"
fi
forbidden=$(cd "$handout" && find . \( -ipath '*solution*' -o -ipath '*trivial*' -o -ipath '*near-miss*' \
                                       -o -ipath '*hidden*' -o -name 'INSTRUCTORS.md' -o -name '*.manifest' \
                                       -o -name 'check_*' \) -print)
[[ -z $forbidden ]] || fail "files that must stay behind: $forbidden"

echo "--- no solution code (the marker, and every solution line of 30+ characters, not an #include, not in the stubs)"
if grep -rlF 'MPT-REFERENCE-SOLUTION' "$handout"; then fail "the solution marker is in the handout"; fi
given=$(cat "$ex/student/ex$nn.cpp" "$ex/ex$nn.hpp" | sed 's/^[[:space:]]*//; s/[[:space:]]*$//')
checked=0
while IFS= read -r line; do
  line=$(printf '%s' "$line" | sed 's/^[[:space:]]*//; s/[[:space:]]*$//')
  [[ ${#line} -ge 30 ]] || continue
  [[ $line == '#include '* ]] && continue       # which headers it reads is no solution
  grep -qxF -- "$line" <<<"$given" && continue  # the signatures the stubs repeat
  checked=$((checked + 1))
  if grep -rqF -- "$line" "$handout"; then fail "solution line found in the handout: $line"; fi
done < <(cat "$ex"/solution/*)
[[ $checked -ge 20 ]] || fail "only $checked solution lines to look for; the check is too weak"
echo "looked for $checked solution lines: none found"

echo "--- build the handout against the installed mpt ($prefix)"
[[ -n $(find "$prefix" -name mptConfig.cmake 2>/dev/null) ]] ||
  fail "no installed mpt in $prefix (the test install_scratch_prefix puts it there)"
cmake -S "$handout" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" "${configure_args[@]}" >/dev/null
cmake --build "$work/build" -j 2
grep -q "mpt_DIR:PATH=$prefix" "$work/build/CMakeCache.txt" ||
  fail "the handout did not find the installed mpt in $prefix"

echo "--- the stubs score zero"
cmake -DGRADER="$work/build/grader_ch$nn" -DEXPECT=none -DNOT_IMPLEMENTED=ON -DLAUNCHER="$launcher" -P "$kit/check_grader.cmake"

echo "--- grading a submission (the reference solution) the instructor's way"
cmake "$work/build" -DMPT_EX${nn}_STUDENT_SOURCE="$ex/solution/ex$nn.cpp" >/dev/null
cmake --build "$work/build" -j 2
cmake -DGRADER="$work/build/grader_ch$nn" -DEXPECT=full -DLAUNCHER="$launcher" -P "$kit/check_grader.cmake"

echo "handout check: ok"
