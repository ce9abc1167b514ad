#!/usr/bin/env bash
# All chapters — the build's timing record: a compiler and linker launcher
# (CMAKE_<LANG>_COMPILER_LAUNCHER, CMAKE_<LANG>_LINKER_LAUNCHER) that runs
# the command it is given and appends one line to LOG: the wall seconds it
# took, "compile" or "link", its exit status and the file it wrote (the
# argument after -o). tools/ci_times.sh reads LOG. Depends on: bash 5
# (EPOCHREALTIME).
#
#   compile_time.sh LOG COMMAND...   (the top-level CMakeLists sets it with MPT_BUILD_TIMES=ON)
log=$1
shift
start=${EPOCHREALTIME/./}
"$@"
rc=$?
end=${EPOCHREALTIME/./}
kind=link
out=?
prev=
for arg in "$@"; do
  [[ $prev == -o ]] && out=$arg
  [[ $arg == -c ]] && kind=compile
  prev=$arg
done
[[ $out == /* || $out == "?" ]] || out=$PWD/$out
us=$((end - start))
# One short line per command, appended in one write: parallel jobs do not
# interleave within a line.
printf '%d.%02d\t%s\t%d\t%s\n' $((us / 1000000)) $((us % 1000000 / 10000)) "$kind" "$rc" "$out" >>"$log"
exit $rc
