#!/usr/bin/env bash
# All chapters — every option that writes a file, checked against what may
# already be at its path (io/atomic_file.hpp's rules): a symbolic link is
# written through and stays a link; a device, a FIFO, a folder, or a link to
# one, is refused and still what it was; a write that fails is one line and
# leaves the old file.
# Depends on: cli_lib.sh (the shared harness), bash, coreutils (mkfifo, ln,
# readlink, find, sort, cmp, timeout), gnuplot for `mpt train --plot`'s
# written-through case (left out without it: its refusals need no gnuplot).
#
# Usage: output_file_checks.sh PATH/TO/mpt CASE. Exit 0 pass, 1 fail.
#
# The writers: dot (mpt trace --dot), svg (mpt range --svg), scaler (mpt
# scaler simulate --plot), plot (mpt train --plot), report (mpt tour
# --reports DIR writes DIR/fp16-overflow.txt), checkpoint (mpt train
# --checkpoint DIR writes DIR/ckpt-000000002.mpt). Each FIFO is opened by
# nobody: a tool that opened one for writing would block, so every run has
# a timeout.
set -u

MPT=$1
CASE=$2
. "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"

TRAIN=(train --model mlp --policy f16 --scaler dynamic --steps 2)

# run_in ARGS...: run with "1 2 3" on stdin (mpt range reads it), under a timeout.
run_in() {
  ARGS="$*"
  printf '1 2 3\n' | timeout 60 "$MPT" "$@" >"$OUT" 2>"$ERR"
  RC=$?
}

# write WRITER PATH: run WRITER so that it writes PATH (for report and
# checkpoint, PATH's folder is the option's value and its name is fixed).
write() {
  local writer=$1 path=$2
  case $writer in
  dot) run_in trace --dot "$path" ;;
  svg) run_in range --format fp16 --svg "$path" ;;
  scaler) run_in scaler simulate --steps 3 --plot "$path" ;;
  plot) run_in "${TRAIN[@]}" --plot "$path" ;;
  report) run_in tour --chapter 1 --reports "$(dirname "$path")" ;;
  checkpoint) run_in "${TRAIN[@]}" --checkpoint "$(dirname "$path")" ;;
  esac
}

# The file name each writer writes.
name_of() {
  case $1 in
  report) echo fp16-overflow.txt ;;
  checkpoint) echo ckpt-000000002.mpt ;;
  *) echo "out.$1" ;;
  esac
}

# What a folder holds: every entry's path and type (f, d, l, p), and where each link points.
listing() { (cd "$1" && find . -printf '%p %y %l\n' | sort); }

REFUSERS=(dot svg scaler plot report checkpoint)
WRITERS=(dot svg scaler report checkpoint)
command -v gnuplot >/dev/null && WRITERS+=(plot)

case "$CASE" in

symlink_written_through)
  for w in "${WRITERS[@]}"; do
    n=$(name_of "$w")
    rm -rf "$WORK/plain" "$WORK/real" "$WORK/links"
    mkdir "$WORK/plain" "$WORK/real" "$WORK/links"
    write "$w" "$WORK/plain/$n"
    expect_rc 0
    [ -s "$WORK/plain/$n" ] || fail "$w: nothing written to a plain path"
    # An existing file behind a relative link in another folder.
    printf 'the old file\n' >"$WORK/real/$n"
    ln -s "../real/$n" "$WORK/links/$n"
    write "$w" "$WORK/links/$n"
    expect_rc 0
    [ -L "$WORK/links/$n" ] || fail "$w: the link $WORK/links/$n was replaced by a file"
    [ "$(readlink "$WORK/links/$n")" = "../real/$n" ] || fail "$w: the link points elsewhere now"
    [ -f "$WORK/real/$n" ] && [ ! -L "$WORK/real/$n" ] || fail "$w: the target is not a regular file"
    if [ "$w" = plot ]; then
      grep -q 'training loss' "$WORK/real/$n" || fail "$w: the target does not hold the new plot"
    else
      cmp -s "$WORK/plain/$n" "$WORK/real/$n" || fail "$w: the target does not hold what a plain path gets"
    fi
    [ -z "$(find "$WORK/real" "$WORK/links" -name '*tmp*')" ] || fail "$w: a temporary is left: $(ls "$WORK/real" "$WORK/links")"
    # A dangling link: the file it names is created, the link kept.
    rm "$WORK/real/$n"
    write "$w" "$WORK/links/$n"
    expect_rc 0
    [ -L "$WORK/links/$n" ] && [ -s "$WORK/real/$n" ] || fail "$w: a dangling link was not written through"
  done
  # A checkpoint folder that is a link to a folder: written into, still a link.
  rm -rf "$WORK/ckreal" "$WORK/cklink"
  mkdir "$WORK/ckreal"
  ln -s ckreal "$WORK/cklink"
  run_in "${TRAIN[@]}" --checkpoint "$WORK/cklink"
  expect_rc 0
  [ -L "$WORK/cklink" ] && [ -s "$WORK/ckreal/ckpt-000000002.mpt" ] || fail "--checkpoint through a link to a folder"
  ;;

never_replaces_non_regular)
  # Every writer against every kind of non-regular file at its path, and a
  # link to each: one line, status 2, and everything as it was.
  for w in "${REFUSERS[@]}"; do
    n=$(name_of "$w")
    for kind in fifo dir link-fifo link-dir link-dev-full dev-full; do
      rm -rf "$WORK/c" && mkdir "$WORK/c"
      p=$WORK/c/$n
      case $kind in
      fifo) mkfifo "$p" ;;
      dir) mkdir "$p" ;;
      link-fifo) mkfifo "$WORK/c/pipe" && ln -s pipe "$p" ;;
      link-dir) mkdir "$WORK/c/d" && ln -s d "$p" ;;
      link-dev-full) ln -s /dev/full "$p" ;;
      dev-full)
        # Only where /dev/full is the path itself: a folder option would
        # write into /dev.
        [ "$w" = report ] || [ "$w" = checkpoint ] && continue
        p=/dev/full
        ;;
      esac
      before=$(listing "$WORK/c")
      write "$w" "$p"
      [ "$RC" -ne 124 ] || fail "$w onto $kind: the command blocked (opened a FIFO?)"
      case $kind in
      *fifo) what="FIFO" ;;
      *dir) what="directory" ;;
      *) what="character device" ;;
      esac
      expect_usage_error "$what"
      [ -c /dev/full ] || fail "$w onto $kind: /dev/full is no longer a character device (as root: rm /dev/full; mknod -m 666 /dev/full c 1 7)"
      [ "$(listing "$WORK/c")" = "$before" ] || fail "$w onto $kind: the folder changed: $(listing "$WORK/c" | tr '\n' ' ')"
      case $kind in
      fifo) [ -p "$p" ] || fail "$w: the FIFO was replaced" ;;
      dir) [ -d "$p" ] && [ ! -L "$p" ] || fail "$w: the folder was replaced" ;;
      link-*) [ -L "$p" ] || fail "$w: the link was replaced" ;;
      esac
    done
  done
  ;;

write_failure_reported)
  # A write that fails, as on a full disk (the file size limit: EFBIG, on
  # any machine and without root): one line, a nonzero status, the old file
  # as it was, no temporary.
  printf 'digraph older { a -> b }\n' >"$WORK/out.dot"
  cp "$WORK/out.dot" "$WORK/old.dot"
  ARGS="trace --dot $WORK/out.dot (ulimit -f 1)"
  (trap '' XFSZ && ulimit -f 1 && exec "$MPT" trace --dot "$WORK/out.dot") </dev/null >"$OUT" 2>"$ERR"
  RC=$?
  expect_usage_error "cannot write '$WORK/out.dot.tmp': File too large"
  cmp -s "$WORK/out.dot" "$WORK/old.dot" || fail "the old graph was changed"
  [ ! -e "$WORK/out.dot.tmp" ] || fail "the temporary was left"
  # A checkpoint that cannot be written ends the run with one line, no file left.
  mkdir "$WORK/ck"
  ARGS="${TRAIN[*]} --checkpoint $WORK/ck (ulimit -f 1)"
  (trap '' XFSZ && ulimit -f 1 && exec "$MPT" "${TRAIN[@]}" --checkpoint "$WORK/ck") </dev/null >"$OUT" 2>"$ERR"
  RC=$?
  [ "$RC" -ne 0 ] || fail "a checkpoint that was not written ended with status 0"
  [ "$(wc -l <"$ERR")" -eq 1 ] || fail "stderr has $(wc -l <"$ERR") lines, expected one"
  expect_err "checkpoint not written: cannot write '$WORK/ck/ckpt-000000002.mpt.tmp': File too large"
  # (the lock file, .mpt-lock, is the run's: it held the folder)
  [ "$(ls -A "$WORK/ck")" = .mpt-lock ] || fail "the checkpoint folder holds $(ls -A "$WORK/ck")"
  ;;

*)
  echo "unknown case $CASE"
  exit 2
  ;;
esac
exit 0
