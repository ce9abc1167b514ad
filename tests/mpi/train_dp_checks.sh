#!/usr/bin/env bash
# Chapter 05 — `mpt train --data-parallel` under mpiexec, checked as a user
# sees it: N ranks against one process, the sharded optimizer against plain
# DDP, output on rank 0 only, a rank killed mid-run or mid-checkpoint and
# the run resumed, a checkpoint resumed on another world size, a world
# size that does not divide the batch, one lock for the ranks of one run;
# --sync-bn reported in the JSON; FP8 (Chapter 7) checkpointed and resumed.
# Depends on: ../cli/cli_lib.sh (the shared harness), bash, grep, flock and
# pkill (a directory held by another process); python3
# for the JSON checks (those cases exit 77, Skipped, without it).
#
# Usage: train_dp_checks.sh PATH/TO/mpt CASE MPIEXEC [FLAGS...]. Exit 0
# pass, 1 fail, 77 skipped.
set -u

MPT=$1
CASE=$2
shift 2
MPIEXEC=("$@")
. "$(dirname "${BASH_SOURCE[0]}")/../cli/cli_lib.sh"

# mpirun N ARGS...: `mpiexec -n N mpt ARGS...` (environment variables named
# in PASS_ENV are passed to every rank), 60 s at most.
PASS_ENV=()
mpirun() {
  local n=$1
  shift
  ARGS="(mpiexec -n $n) $*"
  local envs=()
  local v
  for v in "${PASS_ENV[@]}"; do envs+=(-x "$v"); done
  timeout 60 "${MPIEXEC[@]}" "${envs[@]}" -n "$n" "$MPT" "$@" </dev/null >"$OUT" 2>"$ERR"
  RC=$?
  [ "$RC" -ne 124 ] || fail "the job hung (killed after 60 s)"
}
checksum() { grep -o 'masters checksum [0-9a-f]*' "$OUT"; }
TRAIN=(train --model mlp --policy f16 --scaler dynamic)

case "$CASE" in

equals_one_process)
  need_python
  run "${TRAIN[@]}" --steps 30 --json
  expect_rc 0
  cp "$OUT" "$WORK/one.json"
  for n in 2 4; do
    mpirun $n "${TRAIN[@]}" --steps 30 --json --data-parallel
    expect_rc 0
    # One JSON document on stdout: only rank 0 prints.
    python3 - "$WORK/one.json" "$OUT" "$n" <<'PY' || fail "JSON check failed"
import json, sys
one, dp, n = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
d = dp["data_parallel"]
assert d["world_size"] == n and d["comm_dtype"] == "f32" and not d["shard_optimizer"], d
assert d["skipped_per_rank"] == [d["skipped_per_rank"][0]] * n, "the ranks skipped different steps"
assert [s["scale"] for s in dp["steps"]] == [s["scale"] for s in one["steps"]], "another scale sequence"
assert [s["skipped"] for s in dp["steps"]] == [s["skipped"] for s in one["steps"]], "other skips"
# The global batch is the one-process batch: the losses agree to rounding.
worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(dp["steps"], one["steps"]))
# In f16 a last-bit difference in a master moves a weight by up to an f16 ulp
# (2^-11 relative): after 30 steps the losses agree to a few ulps (measured:
# 1.1e-3 on 4 ranks).
assert worst < 4e-3, f"loss differs from one process by {worst:.2e} (relative)"
PY
  done
  ;;

one_rank_is_one_process)
  run "${TRAIN[@]}" --steps 30
  expect_rc 0
  want=$(checksum)
  mpirun 1 "${TRAIN[@]}" --steps 30 --data-parallel
  expect_rc 0
  expect_out "data parallel: 1 rank, gradients in f32"
  [ "$(checksum)" = "$want" ] || fail "one rank's run is not the one-process run: $(checksum) vs $want"
  ;;

shard_equals_plain)
  for model in "mlp --steps 30" "transformer --steps 3"; do
    # shellcheck disable=SC2086
    mpirun 2 train --model $model --policy f16 --scaler dynamic --data-parallel
    expect_rc 0
    want=$(checksum)
    # shellcheck disable=SC2086
    mpirun 2 train --model $model --policy f16 --scaler dynamic --data-parallel --shard-optimizer
    expect_rc 0
    expect_out "data parallel: 2 ranks, sharded optimizer, gradients in f32"
    [ "$(checksum)" = "$want" ] || fail "$model: the sharded optimizer's run differs from plain DDP's"
  done
  ;;

rank0_prints)
  mpirun 4 "${TRAIN[@]}" --steps 20 --data-parallel
  expect_rc 0
  [ "$(grep -c '^final loss' "$OUT")" -eq 1 ] || fail "the summary was printed more than once"
  # Progress: 20 reports (mpiexec gives rank 0 a terminal, so they may be
  # rewritten in place on one line), not 20 per rank.
  [ "$(grep -o 'step [0-9]*/20 ' "$OUT" | wc -l)" -eq 20 ] || fail "progress lines from more than one rank"
  ;;

resume_after_kill)
  for shard in "" --shard-optimizer; do
    mpirun 2 "${TRAIN[@]}" --steps 20 --data-parallel $shard
    expect_rc 0
    want=$(checksum)
    # Rank 1 dies after step 15: the job ends, the checkpoint of step 10 stays.
    rm -rf "$WORK/ck"
    PASS_ENV=(MPT_TRAIN_KILL_AT=step:15 MPT_TRAIN_KILL_RANK=1)
    mpirun 2 "${TRAIN[@]}" --steps 20 --data-parallel $shard --checkpoint "$WORK/ck" --every 10
    PASS_ENV=()
    [ "$RC" -ne 0 ] || fail "a rank was killed but the job exited 0"
    [ -f "$WORK/ck/ckpt-000000010.mpt" ] || fail "the checkpoint of step 10 is missing"
    mpirun 2 "${TRAIN[@]}" --steps 20 --data-parallel $shard --checkpoint "$WORK/ck" --every 10 --resume
    expect_rc 0
    expect_out "resumed from $WORK/ck/ckpt-000000010.mpt at step 10"
    [ "$(checksum)" = "$want" ] || fail "resumed after the kill: $(checksum), uninterrupted: $want"
    # Rank 0, the writer, dies halfway through the checkpoint of step 20: the
    # previous one is whole and resumes.
    PASS_ENV=(MPT_TRAIN_KILL_AT=checkpoint:20:partial MPT_TRAIN_KILL_RANK=0)
    rm -rf "$WORK/ck"
    mpirun 2 "${TRAIN[@]}" --steps 20 --data-parallel $shard --checkpoint "$WORK/ck" --every 10
    PASS_ENV=()
    [ "$RC" -ne 0 ] || fail "the writer was killed but the job exited 0"
    [ ! -f "$WORK/ck/ckpt-000000020.mpt" ] || fail "a half-written checkpoint took the final name"
    mpirun 2 "${TRAIN[@]}" --steps 20 --data-parallel $shard --checkpoint "$WORK/ck" --every 10 --resume
    expect_rc 0
    [ "$(checksum)" = "$want" ] || fail "resumed after the writer's kill: $(checksum), uninterrupted: $want"
  done
  ;;

resume_other_world)
  # A data-parallel checkpoint is the one-process format (the sharded state
  # gathered first): it resumes on any world size, and in one process.
  mpirun 2 "${TRAIN[@]}" --steps 10 --data-parallel --shard-optimizer --checkpoint "$WORK/ck" --every 10
  expect_rc 0
  mpirun 4 "${TRAIN[@]}" --steps 20 --data-parallel --shard-optimizer --resume-from "$WORK/ck/ckpt-000000010.mpt"
  expect_rc 0
  expect_out "resumed from $WORK/ck/ckpt-000000010.mpt at step 10"
  run "${TRAIN[@]}" --steps 20 --resume-from "$WORK/ck/ckpt-000000010.mpt"
  expect_rc 0
  expect_out "resumed from $WORK/ck/ckpt-000000010.mpt at step 10"
  ;;

sync_bn)
  # --sync-bn on Chapter 3's digits Cnn (needs the digits file): the JSON
  # says so, and the run is not the plain one (each rank's BatchNorm sees
  # 32 rows without it, all 64 with it).
  need_python
  CNN=(train --model cnn --policy f32 --scaler none --steps 3 --json --data-parallel)
  mpirun 2 "${CNN[@]}" --sync-bn
  if [ "$RC" -eq 2 ] && grep -q digits "$ERR"; then
    echo "skipped [$CASE]: no digits file (cmake --build build --target fetch-data)"
    exit 77
  fi
  expect_rc 0
  cp "$OUT" "$WORK/sync.json"
  mpirun 2 "${CNN[@]}"
  expect_rc 0
  python3 - "$WORK/sync.json" "$OUT" <<'PY' || fail "JSON check failed"
import json, sys
sync, plain = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert sync["data_parallel"]["sync_bn"] is True, sync["data_parallel"]
assert plain["data_parallel"]["sync_bn"] is False, plain["data_parallel"]
assert sync["data_parallel"]["world_size"] == 2, sync["data_parallel"]
assert sync["masters_checksum"] != plain["masters_checksum"], "--sync-bn changed nothing"
PY
  ;;

batch_does_not_split)
  mpirun 3 "${TRAIN[@]}" --steps 2 --data-parallel
  [ "$RC" -ne 0 ] || fail "3 ranks cannot split a batch of 64, but the job exited 0"
  [ ! -s "$OUT" ] || fail "stdout is not empty"
  expect_err "mpt: a batch of 64 rows does not split evenly over 3 ranks; use a world size that divides it"
  ;;

one_writer)
  # The ranks are one run: rank 0 alone takes the checkpoint directory's
  # lock (were every rank to take it, rank 1 would find it held by rank 0).
  mpirun 2 "${TRAIN[@]}" --steps 4 --data-parallel --checkpoint "$WORK/ck" --every 2
  expect_rc 0
  [ "$(ls -A "$WORK/ck" | tr '\n' ' ')" = ".mpt-lock ckpt-000000002.mpt ckpt-000000004.mpt " ] ||
    fail "the directory holds $(ls -A "$WORK/ck" | tr '\n' ' ')"
  # Another run holds the directory: every rank refuses before training (the
  # check before the start), no hang, nothing written.
  # (flock runs the command once it holds the lock; -o: not inherited)
  flock -o "$WORK/ck/.mpt-lock" sh -c ': >"$1"; exec sleep 60' sh "$WORK/held" </dev/null >/dev/null 2>&1 &
  holder=$!
  for _ in $(seq 1 1000); do [ -e "$WORK/held" ] && break; sleep 0.01; done
  before=$(cd "$WORK/ck" && md5sum .mpt-lock ckpt-*)
  mpirun 2 "${TRAIN[@]}" --steps 6 --data-parallel --checkpoint "$WORK/ck" --every 2 --resume
  [ "$RC" -ne 0 ] || fail "a held directory, but the job exited 0"
  [ ! -s "$OUT" ] || fail "stdout is not empty"
  expect_err "--checkpoint: '$WORK/ck' is in use by another run, pid $holder: flock"
  pkill -P "$holder" 2>/dev/null
  kill "$holder" 2>/dev/null
  wait "$holder" 2>/dev/null
  [ "$(cd "$WORK/ck" && md5sum .mpt-lock ckpt-*)" = "$before" ] || fail "the refused job changed the directory"
  # The lock itself refuses (its file is a FIFO, which the check before the
  # start passes): rank 0's verdict reaches rank 1, and both end with it.
  mv "$WORK/ck/.mpt-lock" "$WORK/lock.saved"
  mkfifo "$WORK/ck/.mpt-lock"
  mpirun 2 "${TRAIN[@]}" --steps 6 --data-parallel --checkpoint "$WORK/ck" --every 2 --resume
  [ "$RC" -ne 0 ] || fail "a FIFO for a lock file, but the job exited 0"
  [ ! -s "$OUT" ] || fail "stdout is not empty"
  [ "$(grep -c "is not a regular file; move it away" "$ERR")" -eq 2 ] ||
    fail "not both ranks ended with rank 0's verdict"
  rm "$WORK/ck/.mpt-lock"
  mv "$WORK/lock.saved" "$WORK/ck/.mpt-lock"
  mpirun 2 "${TRAIN[@]}" --steps 6 --data-parallel --checkpoint "$WORK/ck" --every 2 --resume
  expect_rc 0
  expect_out "resumed from $WORK/ck/ckpt-000000004.mpt at step 4"
  ;;

fp8)
  # Chapter 7: FP8 under data parallelism. Delayed scaling's amaxes are
  # reduced (max) across the ranks before each update, so the ranks keep one
  # state and rank 0's checkpoint holds it: 10 steps, then a resume to 20,
  # is the straight run of 20. Current scaling and MX keep no state.
  FP8=(train --model mlp --policy fp8:delayed --data-parallel)
  mpirun 2 "${FP8[@]}" --steps 20
  expect_rc 0
  expect_out "data parallel: 2 ranks, gradients in f32"
  want=$(checksum)
  mpirun 2 "${FP8[@]}" --steps 10 --checkpoint "$WORK/ck" --every 10
  expect_rc 0
  [ -f "$WORK/ck/ckpt-000000010.mpt" ] || fail "the checkpoint of step 10 is missing"
  mpirun 2 "${FP8[@]}" --steps 20 --checkpoint "$WORK/ck" --every 10 --resume
  expect_rc 0
  expect_out "resumed from $WORK/ck/ckpt-000000010.mpt at step 10"
  [ "$(checksum)" = "$want" ] || fail "fp8:delayed resumed on 2 ranks: $(checksum), uninterrupted: $want"
  for policy in fp8:current fp8:mx-rceil; do
    mpirun 2 train --model mlp --policy $policy --data-parallel --steps 10
    expect_rc 0
  done
  ;;

*)
  echo "train_dp_checks.sh: unknown case '$CASE'"
  exit 2
  ;;
esac
echo "ok [$CASE]"
