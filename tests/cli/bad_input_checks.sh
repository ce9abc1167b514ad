#!/usr/bin/env bash
# All chapters — the bad-input table (bad_inputs.tsv) run against the `mpt`
# program: every row is an input `mpt` must refuse, and refuse cleanly.
# Depends on: bash, coreutils (find, sort, md5sum, wc, head, tail, tr, seq,
# yes, dd, mktemp, mkfifo), xargs, diff, grep, gzip (the digits fixtures),
# flock and pkill (the locked checkpoint directory). It does
# not source cli_lib.sh: that harness stops at the first failed assertion,
# and this runner checks every row and reports each.
#
# Usage: bad_input_checks.sh PATH/TO/mpt TABLE.tsv [ID...]
#   Runs every row of TABLE (or only the rows named), prints one line per row
#   ("ok ID" or "FAIL ID: why", with the command's output after a failure)
#   and a count. Exit 0 when every row passed and the table has at least
#   MIN_ROWS rows (only when all rows are run), 1 otherwise.
#
# The table: one row per line, fields separated by tabs; '#' starts a
# comment line; blank lines are skipped.
#   id        a unique name (letters, digits, '-', '_', '.')
#   fixture   the files the scratch directory gets besides the common ones
#             (see make_fixture below): files, digits-missing, digits-empty,
#             digits-truncated, digits-corrupt, digits-not-gzip,
#             digits-bad-pixel, digits-short-row, digits-is-dir; and for
#             mpt train: ckpt (ck/ holds a good checkpoint of step 2 of an
#             f16 MLP with a dynamic scaler), ckpt-empty (ck/ is empty),
#             ckpt-truncated, ckpt-bitflip, ckpt-version (that checkpoint
#             cut in half, with one bit flipped, with format version 2),
#             ckpt-garbage (ck/x.mpt is text), ckpt-entry-dir and
#             ckpt-entry-fifo (ck/ckpt-000000004.mpt is a folder, a FIFO),
#             ckpt-locked (ck/ is empty and its lock file ck/.mpt-lock is
#             held by another process, util-linux's flock, until the row ends);
#             for the options that write a file: fifo (the FIFO pipe beside
#             the common files), reports-fifo (sub/fp16-overflow.txt, the
#             name of a Chapter 1 report, is a FIFO)
#   stdin     what the command reads: '-' (nothing, /dev/null), 'text:WORDS'
#             (WORDS and a newline), or a generator: 'big-token' (a million
#             digits, then 'x'), 'many-values' (a million numbers on one
#             line), 'long-line' (two numbers, a million spaces, 'zwei')
#   args      the arguments after `mpt`, as shell words ('' is an empty
#             argument; quotes work as in bash; nothing is expanded)
#   expect... one or more fragments, each its own field, every one of which
#             stderr must contain (what was wrong, and what would be valid)
#
# Every row runs in a fresh scratch directory (the working directory of the
# command) that holds a few files already: notes.txt, out.svg, out.dot and
# an empty folder sub/; a row that makes a command write a file points it at
# out.svg or out.dot. Per row the runner asserts: exit status 2; nothing on
# stdout; exactly one line on stderr, beginning with "mpt: " (or, for a
# command-line error, "mpt SUBCOMMAND: "), at most MAX_LINE bytes long,
# containing every fragment; and the scratch directory unchanged: the same
# names, types, sizes and checksums after as before (no file written over,
# no new file, no temporary left behind; a FIFO still a FIFO); and that
# /dev/full and /dev/null, which rows may name as output files, are still
# character devices (a rename over one, as root, would have replaced it).
set -u

MPT=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")  # the rows run in their scratch directories
TABLE=$2
shift 2
ONLY=("$@")

MIN_ROWS=40
MAX_LINE=2000  # bytes: a message quotes what was wrong, not a megabyte of it

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# A few valid digits rows (64 pixels 0..16 and a label 0..9), the source of
# every digits fixture.
digits_rows() {
  local r p line
  for r in 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9; do
    line=""
    for p in $(seq 1 64); do line+="$(((p * 7 + r) % 17)),"; done
    echo "${line}${r}"
  done
}

# make_fixture NAME DIR: fill DIR (the scratch directory) with the common
# files and NAME's; print the environment assignments the row runs with.
make_fixture() {
  local name=$1 dir=$2
  mkdir -p "$dir/sub"
  printf 'notes a user keeps next to the run\n' >"$dir/notes.txt"
  printf '<svg xmlns="http://www.w3.org/2000/svg"><!-- an older picture --></svg>\n' >"$dir/out.svg"
  printf 'digraph older { a -> b }\n' >"$dir/out.dot"
  local data=$dir/data
  case $name in
  files) ;;
  digits-missing) mkdir -p "$data" ;;
  digits-empty) mkdir -p "$data" && : >"$data/digits.csv.gz" ;;
  digits-truncated)
    mkdir -p "$data"
    digits_rows | gzip -9 >"$WORK/full.gz"
    head -c $(($(wc -c <"$WORK/full.gz") / 2)) "$WORK/full.gz" >"$data/digits.csv.gz"
    ;;
  digits-corrupt)
    # A whole gzip stream with its compressed bytes overwritten in the middle.
    mkdir -p "$data"
    digits_rows | gzip -9 >"$data/digits.csv.gz"
    printf 'XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX' |
      dd of="$data/digits.csv.gz" bs=1 seek=40 conv=notrunc status=none
    ;;
  digits-not-gzip) mkdir -p "$data" && printf 'this is not the digits file\n' >"$data/digits.csv.gz" ;;
  digits-bad-pixel)
    mkdir -p "$data"
    { digits_rows | head -3; echo "$(printf '17,%.0s' $(seq 1 64))3"; } | gzip >"$data/digits.csv.gz"
    ;;
  digits-short-row)
    mkdir -p "$data"
    { digits_rows | head -2; echo "1,2,3,4"; } | gzip >"$data/digits.csv.gz"
    ;;
  digits-is-dir) mkdir -p "$data/digits.csv.gz" ;;
  fifo) mkfifo "$dir/pipe" ;;
  reports-fifo) mkfifo "$dir/sub/fp16-overflow.txt" ;;
  ckpt-entry-dir) mkdir -p "$dir/ck/ckpt-000000004.mpt" ;;
  ckpt-entry-fifo) mkdir -p "$dir/ck" && mkfifo "$dir/ck/ckpt-000000004.mpt" ;;
  ckpt-empty) mkdir -p "$dir/ck" ;;
  ckpt-locked)
    mkdir -p "$dir/ck"
    rm -f "$WORK/holder.ready"
    # flock runs the command once it holds the lock (-o: the command does
    # not inherit it), so the ready file says the lock is held.
    flock -o "$dir/ck/.mpt-lock" sh -c ': >"$1"; exec sleep 120' sh "$WORK/holder.ready" \
      </dev/null >/dev/null 2>&1 &
    echo $! >"$WORK/holder.pid"
    local tries=0
    until [ -e "$WORK/holder.ready" ]; do
      tries=$((tries + 1))
      [ "$tries" -lt 1000 ] || { echo "fixture $name: flock never took the lock" >&2; return 1; }
      sleep 0.01
    done
    ;;
  ckpt-garbage) mkdir -p "$dir/ck" && printf 'not a checkpoint\n' >"$dir/ck/x.mpt" ;;
  ckpt | ckpt-truncated | ckpt-bitflip | ckpt-version)
    "$MPT" train --model mlp --data synthetic --policy f16 --scaler dynamic --steps 2 --checkpoint "$dir/ck" \
      --every 2 >/dev/null 2>&1 || { echo "fixture $name: mpt train failed" >&2; return 1; }
    local f=$dir/ck/ckpt-000000002.mpt
    case $name in
    ckpt-truncated) head -c $(($(wc -c <"$f") / 2)) "$f" >"$f.cut" && mv "$f.cut" "$f" ;;
    ckpt-bitflip) printf '\x55' | dd of="$f" bs=1 seek=3000 conv=notrunc status=none ;;
    ckpt-version) printf '\x02' | dd of="$f" bs=1 seek=8 conv=notrunc status=none ;;
    esac
    ;;
  *)
    echo "unknown fixture '$name'" >&2
    return 1
    ;;
  esac
  case $name in
  digits-*) echo "MPT_DATA_DIR=$data" ;;
  esac
}

# make_stdin SOURCE FILE: write what the command reads to FILE.
make_stdin() {
  local source=$1 file=$2
  case $source in
  -) : >"$file" ;;
  text:*) printf '%s\n' "${source#text:}" >"$file" ;;
  big-token) { head -c 1000000 /dev/zero | tr '\0' '1'; echo x; } >"$file" ;;
  many-values) { yes '1' | head -n 1000000 | tr '\n' ' '; echo; } >"$file" ;;
  long-line) { printf '1 2'; head -c 1000000 /dev/zero | tr '\0' ' '; echo zwei; } >"$file" ;;
  *)
    echo "unknown stdin source '$source'" >&2
    return 1
    ;;
  esac
}

# What a directory holds: every entry's path, type and size, and each
# file's checksum.
snapshot() {
  (cd "$1" && find . -printf '%p %y %s\n' | sort && find . -type f -print0 | sort -z | xargs -0 -r md5sum)
}

rows=0
failed=0
declare -A seen=()
while IFS= read -r line || [ -n "$line" ]; do
  [[ -z $line || $line == \#* ]] && continue
  # Tabs are whitespace to read, which would merge empty fields: split on
  # a separator that is not.
  IFS=$'\x1f' read -r -a f <<<"${line//$'\t'/$'\x1f'}"
  id=${f[0]:-}
  if [ "${#f[@]}" -lt 5 ]; then
    echo "FAIL ${id:-?}: the row has ${#f[@]} fields; it needs id, fixture, stdin, args and at least one fragment"
    failed=$((failed + 1))
    rows=$((rows + 1))
    continue
  fi
  if [ -n "${seen[$id]:-}" ]; then
    echo "FAIL $id: the id is used twice"
    failed=$((failed + 1))
  fi
  seen[$id]=1
  rows=$((rows + 1))
  if [ "${#ONLY[@]}" -gt 0 ]; then
    wanted=0
    for o in "${ONLY[@]}"; do [ "$o" = "$id" ] && wanted=1; done
    [ "$wanted" -eq 1 ] || continue
  fi
  fixture=${f[1]}
  source=${f[2]}
  args=${f[3]}
  fragments=("${f[@]:4}")

  row=$WORK/row
  rm -rf "$row"
  mkdir -p "$row/scratch"
  scratch=$row/scratch
  if ! env_lines=$(make_fixture "$fixture" "$scratch") || ! make_stdin "$source" "$row/stdin"; then
    echo "FAIL $id: bad row (fixture '$fixture', stdin '$source')"
    failed=$((failed + 1))
    continue
  fi
  # The arguments as words: quotes are honoured; nothing may expand (no $,
  # backquotes, globbing) or end the list (no ; & | < > ( )).
  if [[ $args == *[\$\`\;\&\|\<\>\(\)]* ]]; then
    echo "FAIL $id: the arguments hold a character the table does not allow (\$ \` ; & | < > ( )): $args"
    failed=$((failed + 1))
    continue
  fi
  argv=()
  if ! (set -f && eval "argv=($args)") 2>/dev/null; then
    echo "FAIL $id: cannot split the arguments: $args"
    failed=$((failed + 1))
    continue
  fi
  set -f
  eval "argv=($args)"
  set +f
  before=$(snapshot "$scratch")
  envs=()
  [ -n "$env_lines" ] && mapfile -t envs <<<"$env_lines"
  (cd "$scratch" && env "${envs[@]}" "$MPT" "${argv[@]}" <"$row/stdin" >"$row/out" 2>"$row/err")
  rc=$?
  after=$(snapshot "$scratch")
  if [ -f "$WORK/holder.pid" ]; then # a fixture's lock holder ends with its row
    holder=$(cat "$WORK/holder.pid")
    pkill -P "$holder" 2>/dev/null
    kill "$holder" 2>/dev/null
    wait "$holder" 2>/dev/null
    rm -f "$WORK/holder.pid"
  fi

  why=""
  lines=$(wc -l <"$row/err")
  bytes=$(wc -c <"$row/err")
  if [ ! -c /dev/full ] || [ ! -c /dev/null ]; then
    why="/dev/full or /dev/null is no longer a character device (as root: rm it, then mknod -m 666 /dev/full c 1 7, or /dev/null c 1 3)"
  elif [ "$rc" -ne 2 ]; then
    why="exit status $rc, expected 2"
  elif [ -s "$row/out" ]; then
    why="stdout is not empty"
  elif [ "$lines" -ne 1 ] || [ -n "$(tail -c 1 "$row/err")" ]; then
    why="stderr has $lines line(s), expected exactly one"
  elif ! head -n 1 "$row/err" | grep -qE '^mpt( [a-z0-9_-]+)*: '; then
    why="stderr does not begin with 'mpt: ' (or 'mpt SUBCOMMAND: ')"
  elif [ "$bytes" -gt "$MAX_LINE" ]; then
    why="stderr is $bytes bytes long, more than $MAX_LINE"
  elif [ "$before" != "$after" ]; then
    why="the scratch directory changed: $(diff <(echo "$before") <(echo "$after") | grep '^[<>]' | head -5 | tr '\n' ' ')"
  else
    for s in "${fragments[@]}"; do
      grep -qF -- "$s" "$row/err" || {
        why="stderr lacks '$s'"
        break
      }
    done
  fi
  if [ -z "$why" ]; then
    echo "ok   $id"
  else
    failed=$((failed + 1))
    echo "FAIL $id: $why"
    echo "     mpt $args  (fixture $fixture, stdin $source)"
    echo "     stdout: $(head -c 300 "$row/out" | tr '\n' ' ')"
    echo "     stderr: $(head -c 600 "$row/err" | tr '\n' ' ')"
  fi
done <"$TABLE"

echo "$rows rows, $failed failed"
if [ "${#ONLY[@]}" -eq 0 ] && [ "$rows" -lt "$MIN_ROWS" ]; then
  echo "FAIL: the table has $rows rows; it must have at least $MIN_ROWS"
  exit 1
fi
[ "$failed" -eq 0 ]
