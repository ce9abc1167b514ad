#!/usr/bin/env bash
# Chapter 01 exercises — CI check of the student handout, end to end.
# Depends on: tools/make_handout.sh, a built mpt tree, cmake, doctest,
# check_grader.cmake.   Usage: check_handout.sh SOURCE_DIR BUILD_DIR WORK_DIR [cmake -D...]

# Makes the handout, looks for solution code in it, installs mpt into a
# scratch prefix, builds the handout against it (find_package(mpt)), and
# grades the stubs (0 points) and the solution (full marks) there.
set -euo pipefail
[[ $# -ge 3 ]] || { echo "usage: check_handout.sh SOURCE_DIR BUILD_DIR WORK_DIR [cmake -D...]" >&2; exit 2; }
src=$1
build=$2
work=$3
configure_args=("${@:4}")  # the compiler and flags the library was built with
ex=$src/chapters/01-floating-point-formats/exercises
fail() { echo "check_handout: FAIL: $*" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work"
handout=$work/handout

echo "--- make the handout"
bash "$src/tools/make_handout.sh" 01 "$handout"

echo "--- what it holds"
for f in README.md CMakeLists.txt ex01.hpp ex01.cpp CHAPTER.md HANDOUT-INFO.txt \
         grader/grader.cmake grader/grader.hpp grader/grader_main.cpp \
         grader/test_1_1.cpp grader/test_1_2.cpp grader/test_1_3.cpp; do
  [[ -f $handout/$f ]] || fail "missing $f"
done
cmp -s "$handout/ex01.cpp" "$ex/student/ex01.cpp" || fail "ex01.cpp is not the stub file"
cmp -s "$handout/ex01.hpp" "$ex/ex01.hpp" || fail "ex01.hpp differs from the repository's"
grep -q '](CHAPTER.md)' "$handout/README.md" || fail "README.md does not link to CHAPTER.md"
forbidden=$(cd "$handout" && find . \( -ipath '*solution*' -o -ipath '*trivial*' -o -ipath '*near-miss*' \
                                       -o -ipath '*hidden*' -o -name 'INSTRUCTORS.md' -o -name '*.manifest' \) -print)
[[ -z $forbidden ]] || fail "files that must stay behind: $forbidden"

echo "--- no solution code (the marker, and every solution line of 30+ characters not in the stubs)"
if grep -rlF 'MPT-REFERENCE-SOLUTION' "$handout"; then fail "the solution marker is in the handout"; fi
given=$(cat "$ex/student/ex01.cpp" "$ex/ex01.hpp" | sed 's/^[[:space:]]*//; s/[[:space:]]*$//')
checked=0
while IFS= read -r line; do
  line=$(printf '%s' "$line" | sed 's/^[[:space:]]*//; s/[[:space:]]*$//')
  [[ ${#line} -ge 30 ]] || continue
  grep -qxF -- "$line" <<<"$given" && continue  # the signatures the stubs repeat
  checked=$((checked + 1))
  if grep -rqF -- "$line" "$handout"; then fail "solution line found in the handout: $line"; fi
done < "$ex/solution/ex01.cpp"
[[ $checked -ge 20 ]] || fail "only $checked solution lines to look for; the check is too weak"
echo "looked for $checked solution lines: none found"

echo "--- install mpt into a scratch prefix"
cmake --install "$build" --prefix "$work/prefix" >/dev/null

echo "--- build the handout against it"
cmake -S "$handout" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" "${configure_args[@]}" >/dev/null
cmake --build "$work/build" -j 2
grep -q "mpt_DIR:PATH=$work/prefix" "$work/build/CMakeCache.txt" ||
  fail "the handout did not find the scratch-installed mpt"

echo "--- the stubs score zero"
cmake -DGRADER="$work/build/grader_ch01" -DEXPECT=none -DNOT_IMPLEMENTED=ON -P "$ex/check_grader.cmake"

echo "--- grading a submission (the reference solution) the instructor's way"
cmake "$work/build" -DMPT_EX01_STUDENT_SOURCE="$ex/solution/ex01.cpp" >/dev/null
cmake --build "$work/build" -j 2
cmake -DGRADER="$work/build/grader_ch01" -DEXPECT=full -P "$ex/check_grader.cmake"

echo "handout check: ok"
