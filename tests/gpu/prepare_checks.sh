#!/usr/bin/env bash
# All chapters — tools/gpu_prepare.sh --check refuses what a GPU machine with
# only the driver could not run, or what could not be carried: a program
# that needs a shared library beyond the C library (here: the `mpt` program,
# linked against libstdc++.so.6 like any dynamically linked C++ program),
# and a bundle of 64 MiB or more.
# Depends on: bash, tools/gpu_prepare.sh, truncate.
#
#   prepare_checks.sh DYNAMIC_PROGRAM WORK_DIR
set -u
program=$1
work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "FAIL: $*"; cat "$work/err" 2>/dev/null; exit 1; }
rm -rf "$work"
mkdir -p "$work/dynamic/bin" "$work/big/bin"

cp "$program" "$work/dynamic/bin/"
bash "$root/tools/gpu_prepare.sh" --check "$work/dynamic" >"$work/out" 2>"$work/err"
[[ $? -eq 1 ]] || fail "a dynamically linked C++ program was accepted"
grep -q "needs libstdc++.so.6" "$work/err" || fail "the message does not name libstdc++.so.6"

# A program that needs nothing but the C library, padded past the limit.
printf '#!/bin/sh\n' >"$work/big/bin/tiny" && chmod +x "$work/big/bin/tiny"
truncate -s 70M "$work/big/padding"
bash "$root/tools/gpu_prepare.sh" --check "$work/big" >"$work/out" 2>"$work/err"
[[ $? -eq 1 ]] || fail "a bundle of 70 MiB was accepted"
grep -q "must stay under" "$work/err" || fail "the message does not say the size limit"
echo "gpu_prepare.sh --check refuses a dynamic C++ program and a 70 MiB bundle"
