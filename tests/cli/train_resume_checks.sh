#!/usr/bin/env bash
# Chapters 04 onwards — `mpt train` killed anywhere resumes to the same bits.
# Depends on: cli_lib.sh (the shared harness), bash, cmp, python3 (the JSON
# and checkpoint checks; the case exits 77, Skipped, without it), and the
# test hook MPT_TRAIN_KILL_AT of src/mpt/train/test_hooks.hpp.
#
# Usage: train_resume_checks.sh PATH/TO/mpt CASE. For one model (mlp, cnn,
# transformer; f16 with a dynamic GradScaler, so the scaler's state is part
# of what must survive; mlp_fp8: the MLP under fp8:delayed, whose FP8 scaling
# state must survive): an uninterrupted run with checkpoints, then for each
# kill point a fresh run killed there (status 137, SIGKILL), the directory
# checked (complete checkpoints only, plus at most one temporary), and
# `--resume` until done; its JSON step records (the whole run), its masters'
# checksum and its final checkpoint file must equal the uninterrupted run's.
# The kill points: after a step, inside four stages of a checkpoint's atomic
# write, and a plain kill -9 from this script while the run works.
set -u

MPT=$1
CASE=$2
. "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"
need_python

case "$CASE" in
mlp) RUN=(--model mlp --data synthetic --steps 20000 --every 1000); K=(3500 5000 9000 13000 17000) ;;
cnn) RUN=(--model cnn --data digits --steps 120 --every 10); K=(25 40 60 80 100) ;;
transformer) RUN=(--model transformer --data text --steps 12 --every 2); K=(3 4 6 8 10) ;;
# Chapter 7: FP8 Linears under delayed scaling, whose amax histories and
# scales are state a resume must restore (no scaler: fp8:RECIPE has none).
mlp_fp8) RUN=(--model mlp --data synthetic --steps 4000 --every 250); K=(700 1250 2000 2750 3500) ;;
*) echo "unknown case $CASE"; exit 2 ;;
esac
if [ "$CASE" = mlp_fp8 ]; then
  RUN+=(--policy fp8:delayed --scaler none --json)
else
  RUN+=(--policy f16 --scaler dynamic --json)
fi
[ "${RUN[4]}" = --steps ] || { echo "bad case table"; exit 2; }
LAST=$(printf 'ckpt-%09d.mpt' "${RUN[5]}")

# run DIR [ENV=VALUE]: mpt train into DIR, status in RC.
run() {
  local dir=$1
  shift
  ARGS="train ${RUN[*]} --checkpoint $dir"
  env "$@" "$MPT" train "${RUN[@]}" --checkpoint "$dir" </dev/null >"$OUT" 2>"$ERR"
  RC=$?
}

# Only complete checkpoints (magic, length, FNV-1a 64 checksum), at most one
# temporary, and the lock file.
check_dir() {
  python3 - "$1" <<'PY' || fail "after the kill, $1 holds something other than complete checkpoints and one temporary: $(ls "$1")"
import os, re, struct, sys
d = sys.argv[1]
temps = 0
for name in os.listdir(d):
    if name == ".mpt-lock":  # the directory's lock file (one writer per directory)
        continue
    if re.fullmatch(r"ckpt-\d{9}\.mpt\.tmp", name):
        temps += 1
        continue
    assert re.fullmatch(r"ckpt-\d{9}\.mpt", name), name
    b = open(os.path.join(d, name), "rb").read()
    assert b[:8] == b"MPTCKPT\0", name
    (length,) = struct.unpack("<Q", b[12:20])
    assert len(b) == 28 + length, name
    h = 0xcbf29ce484222325
    for c in b[:-8]:
        h = ((h ^ c) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    assert struct.unpack("<Q", b[-8:])[0] == h, name
assert temps <= 1, temps
PY
}

same_as_reference() {
  python3 - "$OUT" "$WORK/ref.json" <<'PY' || fail "$1: the resumed run differs from the uninterrupted one"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["steps"] == b["steps"], "step records differ"
assert a["masters_checksum"] == b["masters_checksum"], "masters differ"
assert a["config"] == b["config"]
assert a["resumed_at_step"] >= 1, "it did not resume: it ran from step 0"
PY
  cmp -s "$WORK/$2/$LAST" "$WORK/ref/$LAST" || fail "$1: the final checkpoint differs byte for byte"
}

resume_until_done() {
  local dir=$1 what=$2
  ARGS="train ${RUN[*]} --checkpoint $dir --resume"
  "$MPT" train "${RUN[@]}" --checkpoint "$WORK/$dir" --resume </dev/null >"$OUT" 2>"$ERR"
  RC=$?
  expect_rc 0
  same_as_reference "$what" "$dir"
}

run "$WORK/ref"
expect_rc 0
cp "$OUT" "$WORK/ref.json"
[ -f "$WORK/ref/$LAST" ] || fail "the uninterrupted run wrote no $LAST"
if [ "$CASE" = mlp_fp8 ]; then
  grep -aq 'fp8.amax_history/fc1.input' "$WORK/ref/$LAST" && grep -aq 'fp8.scale/fc3.grad_output' "$WORK/ref/$LAST" ||
    fail "the fp8:delayed checkpoint holds no FP8 scaling state"
fi

i=0
for point in "step:${K[0]}" "checkpoint:${K[1]}:partial" "checkpoint:${K[2]}:before-fsync" \
  "checkpoint:${K[3]}:before-rename" "checkpoint:${K[4]}:before-dir-fsync"; do
  i=$((i + 1))
  run "$WORK/k$i" MPT_TRAIN_KILL_AT="$point"
  [ "$RC" -eq 137 ] || fail "MPT_TRAIN_KILL_AT=$point: exit status $RC, expected 137 (SIGKILL)"
  check_dir "$WORK/k$i"
  case "$point" in
  *partial | *before-fsync | *before-rename)
    ls "$WORK/k$i" | grep -q '\.tmp$' || fail "$point: no temporary file left by the kill" ;;
  esac
  resume_until_done "k$i" "killed at $point"
  ls "$WORK/k$i" | grep -q '\.tmp$' && fail "$point: a temporary file is left after the resumed run"
done

# A plain kill -9 from outside, once the first checkpoint is there. Where it
# lands is up to the scheduler; a run that finished before the kill reached
# it tested nothing, so it is tried again (a few times) from scratch.
for attempt in 1 2 3 4 5; do
  rm -rf "$WORK/ext"
  mkdir "$WORK/ext"
  "$MPT" train "${RUN[@]}" --checkpoint "$WORK/ext" </dev/null >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 3000); do
    ls "$WORK/ext" | grep -qE '^ckpt-[0-9]{9}\.mpt$' && break
    sleep 0.01
  done
  kill -9 "$pid" 2>/dev/null
  wait "$pid"
  RC=$?
  [ "$RC" -eq 0 ] || break
  echo "kill -9, attempt $attempt: the run finished before the kill; again"
done
[ "$RC" -eq 137 ] || fail "kill -9: exit status $RC, expected 137 (SIGKILL)"
check_dir "$WORK/ext"
resume_until_done ext "killed by kill -9"
exit 0
