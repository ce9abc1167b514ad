#!/usr/bin/env bash
# Chapters 04 onwards — `mpt train`, checked as a user sees it: every model
# runs, the JSON, equal runs, the progress lines, the plot, bad input, the
# refusals of --resume, and one run per checkpoint directory (its lock).
# Depends on: cli_lib.sh (the shared harness), bash, grep, cmp; python3 for
# the JSON and XML checks and gnuplot for the plot (those cases exit 77,
# Skipped, without them).
#
# Usage: train_checks.sh PATH/TO/mpt CASE. Exit 0 pass, 1 fail, 77 skipped.
set -u

MPT=$1
CASE=$2
. "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"

case "$CASE" in

every_model_runs)
  for m in "mlp --data synthetic" "mlp --data digits" "cnn --data digits" "transformer --data text"; do
    # shellcheck disable=SC2086
    run train --model $m --policy f16 --scaler dynamic --steps 3
    expect_rc 0
    expect_out "final loss "
    expect_out "skipped steps 0 of 3, final scale 65536"
    expect_out_regex '^(final loss .*(test accuracy|validation loss) [0-9.]+)$'
  done
  ;;

json_equal_runs)
  need_python
  run train --model mlp --policy bf16 --scaler none --steps 30 --json
  expect_rc 0
  cp "$OUT" "$WORK/a.json"
  run train --model mlp --policy bf16 --scaler none --steps 30 --json
  expect_rc 0
  python3 - "$WORK/a.json" "$OUT" <<'PY' || fail "JSON check failed"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert [s["step"] for s in a["steps"]] == list(range(1, 31))
assert all(set(s) == {"step", "loss", "scale", "skipped"} for s in a["steps"])
assert a["config"] == {"model": "mlp", "data": "synthetic", "policy": "bf16", "scaler": "none",
                       "optimizer": "sgd", "lr": 0.05, "seed": 7, "steps": 30, "every": 0}
assert a["summary"]["metric"] == "test accuracy" and a["summary"]["final_scale"] == 1
del a["timing"], b["timing"]
assert a == b, "two equal runs differ outside timing"
PY
  run train --model mlp --policy bf16 --scaler none --steps 30 --json --seed 8
  python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); assert a["steps"] != b["steps"]' \
    "$WORK/a.json" "$OUT" || fail "another seed gave the same steps"
  ;;

progress_lines)
  run train --model mlp --policy f32 --scaler none --steps 40
  expect_rc 0
  n=$(grep -cE '^step [0-9]+/40  loss [0-9.]+  scale 1  skipped 0  [0-9.]+ steps/s  eta [0-9]+s$' "$OUT")
  [ "$n" -eq 20 ] || fail "expected 20 progress lines (every 2 steps), got $n"
  grep -q $'\r' "$OUT" && fail "carriage returns in output that is not a terminal"
  expect_out "step 40/40"
  ;;

plot)
  need_python
  command -v gnuplot >/dev/null || { echo "gnuplot not found: skipped"; exit 77; }
  run train --model mlp --policy f16 --scaler dynamic --steps 20 --plot "$WORK/run.svg"
  expect_rc 0
  expect_out "plot written to $WORK/run.svg"
  python3 -c 'import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1]).getroot(); assert r.tag.endswith("svg")' \
    "$WORK/run.svg" || fail "the SVG is not well-formed"
  grep -q 'training loss' "$WORK/run.svg" || fail "the SVG has no loss curve"
  [ "$(ls "$WORK" | grep -c tmp)" -eq 0 ] || fail "a temporary file is left: $(ls "$WORK")"
  ;;

bad_options)
  mkdir "$WORK/ck"
  while IFS='|' read -r args want; do
    args=${args//WORK/$WORK}
    # shellcheck disable=SC2086
    run train $args
    expect_usage_error "$want"
  done <<EOF2
--model mlp --policy f16 --scaler dynamic --steps 0|--steps: '0' is not a whole number from 1
--model mlp --policy f16 --scaler dynamic --steps -3|--steps: '-3' is not a whole number
--model mlp --policy f16 --scaler dynamic --steps 5 --every 2|--every needs --checkpoint DIR
--model mlp --policy f16 --scaler dynamic --steps 5 --lr 0|--lr: '0' is not a finite number > 0
--model mlp --policy f16 --scaler dynamic --steps 5 --lr nan|--lr: 'nan' is not a finite number > 0
--model mlp --policy f16 --scaler dynamic --steps 5 --lr -1|--lr: '-1' is not a finite number > 0
--model mlp --policy f16 --scaler static:0 --steps 5|the static scale must be a finite number > 0
--model mlp --policy f16 --scaler static:abc --steps 5|the static scale must be a finite number > 0
--model rnn --policy f16 --scaler dynamic --steps 5|model 'rnn' is not one of mlp, cnn, transformer
--model mlp --data pictures --policy f16 --scaler dynamic --steps 5|data 'pictures' is not one of synthetic, digits, text
--model cnn --data text --policy f16 --scaler dynamic --steps 5|the pairs are mlp with synthetic or digits, cnn with digits, transformer with text
--model mlp --policy f99 --scaler dynamic --steps 5|policy 'f99'
--model mlp --policy f16 --scaler dynamic --steps 5 --resume|--resume needs --checkpoint DIR
--model mlp --policy f16 --scaler dynamic --steps 5 --checkpoint WORK/ck --resume --resume-from x|--resume and --resume-from cannot be combined
--model mlp --policy f16 --scaler dynamic --steps 5 --plot WORK/no/such/dir/p.svg|--plot: the directory
--model mlp --policy f16 --scaler dynamic --steps 5 --optimizer lbfgs|optimizer 'lbfgs' is not one of sgd, adamw
--model mlp --policy f16 --scaler dynamic --steps 5 --seed -1|--seed: '-1' is not an unsigned integer
--policy f16 --scaler dynamic --steps 5|missing --model
EOF2
  [ -z "$(ls "$WORK/ck")" ] || fail "a refused command wrote into the checkpoint directory"
  MPT_TRAIN_KILL_AT=sometime run train --model mlp --policy f16 --scaler dynamic --steps 5
  expect_usage_error "MPT_TRAIN_KILL_AT 'sometime' is not step:N or checkpoint:N:PHASE"
  ;;

resume_refusals)
  mkdir "$WORK/ck"
  run train --model mlp --policy f16 --scaler dynamic --steps 5 --checkpoint "$WORK/ck" --resume
  expect_usage_error "no checkpoint in '$WORK/ck' to resume from; start the run without --resume"
  run train --model mlp --policy f16 --scaler dynamic --steps 6 --checkpoint "$WORK/ck" --every 3 --json
  expect_rc 0
  cp "$OUT" "$WORK/full.json"
  run train --model mlp --policy bf16 --scaler dynamic --steps 6 --checkpoint "$WORK/ck" --resume
  expect_usage_error "the checkpoint was made with policy f16 but this run has policy bf16" "--resume-from PATH"
  # The newest one corrupted: refused, nothing overwritten; the older one only by --resume-from.
  printf 'X' | dd of="$WORK/ck/ckpt-000000006.mpt" bs=1 seek=40 conv=notrunc 2>/dev/null
  cp "$WORK/ck/ckpt-000000006.mpt" "$WORK/bad"
  run train --model mlp --policy f16 --scaler dynamic --steps 6 --checkpoint "$WORK/ck" --resume
  expect_usage_error "checkpoint $WORK/ck/ckpt-000000006.mpt: checksum mismatch" "--resume-from PATH"
  cmp -s "$WORK/bad" "$WORK/ck/ckpt-000000006.mpt" || fail "the refused resume changed the checkpoint"
  run train --model mlp --policy f16 --scaler dynamic --steps 6 --resume-from "$WORK/ck/ckpt-000000003.mpt" --json
  expect_rc 0
  need_python
  python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); assert a["steps"]==b["steps"] and a["masters_checksum"]==b["masters_checksum"] and b["resumed_at_step"]==3' \
    "$WORK/full.json" "$OUT" || fail "--resume-from an older checkpoint did not give the same run"
  run train --model mlp --policy f16 --scaler dynamic --steps 2 --resume-from "$WORK/ck/ckpt-000000003.mpt"
  expect_usage_error "is at step 3, past --steps 2"
  ;;

one_writer_per_directory)
  # Issue 22: two runs started on one --checkpoint DIR. The first (seed 1)
  # trains; the second (seed 2) is refused before it trains: one line
  # naming the directory and the first's PID, exit 2, nothing written. The
  # first's checkpoints are intact and resume to its bits. A first run that
  # ended before the second looked tested nothing: tried again, longer.
  need_python
  A=(train --model mlp --policy f16 --scaler dynamic --checkpoint "$WORK/ck" --every 50 --json)
  B=(train --model mlp --policy f16 --scaler dynamic --seed 2 --steps 100 --checkpoint "$WORK/ck" --every 50)
  steps=2000
  for attempt in 1 2 3 4; do
    rm -rf "$WORK/ck"
    "$MPT" "${A[@]}" --steps $steps </dev/null >"$WORK/a.json" 2>"$WORK/a.err" &
    pid=$!
    # Until the first holds the lock (its line in the lock file).
    for _ in $(seq 1 3000); do
      grep -q "^pid $pid " "$WORK/ck/.mpt-lock" 2>/dev/null && break
      sleep 0.01
    done
    run "${B[@]}"
    alive=0
    kill -0 "$pid" 2>/dev/null && alive=1
    wait "$pid"
    RC_A=$?
    [ "$alive" -eq 1 ] && break
    echo "attempt $attempt: the first run ended before the second was refused; again with more steps"
    steps=$((steps * 4))
  done
  [ "$alive" -eq 1 ] || fail "the first run always ended before the second started"
  expect_usage_error "--checkpoint: '$WORK/ck' is in use by another run, pid $pid on " \
    "(it holds the lock $WORK/ck/.mpt-lock); wait until it ends, or give another directory"
  [ "$RC_A" -eq 0 ] || fail "the first run exited $RC_A: $(cat "$WORK/a.err")"
  # Only the first run's files: its newest two, and its lock file.
  last=$(printf 'ckpt-%09d.mpt' $steps)
  prev=$(printf 'ckpt-%09d.mpt' $((steps - 50)))
  [ "$(ls -A "$WORK/ck" | tr '\n' ' ')" = ".mpt-lock $prev $last " ] ||
    fail "the directory holds $(ls -A "$WORK/ck" | tr '\n' ' '), expected .mpt-lock $prev $last"
  grep -q "^pid $pid " "$WORK/ck/.mpt-lock" || fail "the refused run rewrote the lock file: $(cat "$WORK/ck/.mpt-lock")"
  # Resumed from the older one, the first run ends at the same bits.
  run "${A[@]}" --steps $steps --resume-from "$WORK/ck/$prev"
  expect_rc 0
  python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); assert a["masters_checksum"]==b["masters_checksum"] and a["steps"]==b["steps"], "differs"' \
    "$WORK/a.json" "$OUT" || fail "resumed from $prev, the first run does not end at its bits"
  # A run of another configuration afterwards is refused too (the directory
  # holds the first run's checkpoints), and changes nothing.
  before=$(cd "$WORK/ck" && md5sum .mpt-lock ckpt-*)
  run "${B[@]}"
  expect_usage_error "--checkpoint: '$WORK/ck' holds a checkpoint of another run, $WORK/ck/$prev (seed 7, where this run has seed 2)" \
    "continue that run (its options and --resume), or give another directory"
  [ "$(cd "$WORK/ck" && md5sum .mpt-lock ckpt-*)" = "$before" ] || fail "the refused run changed the directory"
  ;;

killed_writer_frees_directory)
  # A writer killed with SIGKILL holds nothing: the kernel drops its lock.
  # Its line stays in the lock file; the next run takes the directory at once.
  RUN=(train --model mlp --policy f16 --scaler dynamic --steps 100000 --checkpoint "$WORK/ck" --every 5)
  "$MPT" "${RUN[@]}" </dev/null >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 1 3000); do
    ls "$WORK/ck" 2>/dev/null | grep -qE '^ckpt-[0-9]{9}\.mpt$' && break
    sleep 0.01
  done
  run "${RUN[@]}" --resume
  expect_usage_error "is in use by another run, pid $pid on "
  kill -9 "$pid"
  wait "$pid"
  [ $? -eq 137 ] || fail "the writer was not killed by SIGKILL"
  grep -q "^pid $pid " "$WORK/ck/.mpt-lock" || fail "the lock file does not hold the killed writer's line"
  newest=$(ls "$WORK/ck" | grep -E '^ckpt-[0-9]{9}\.mpt$' | tail -n 1)
  at=$((10#${newest:5:9}))
  run train --model mlp --policy f16 --scaler dynamic --steps $((at + 5)) --checkpoint "$WORK/ck" --every 5 --resume
  expect_rc 0
  expect_out "resumed from $WORK/ck/$newest at step $at"
  grep -q "^pid $pid " "$WORK/ck/.mpt-lock" && fail "the next run did not write its line into the lock file"
  [ -f "$WORK/ck/$(printf 'ckpt-%09d.mpt' $((at + 5)))" ] || fail "the next run wrote no checkpoint"
  ;;

help_documents_choices)
  run train --help
  expect_rc 0
  for s in "mlp (Chapter 2), cnn (Chapter 3) or transformer" "synthetic (blobs) or digits for mlp" \
    "static:S" "gnuplot-nox" "--resume-from" "sgd (momentum 0.9) or adamw"; do
    expect_out "$s"
  done
  ;;

*)
  echo "unknown case $CASE"
  exit 2
  ;;
esac
exit 0
