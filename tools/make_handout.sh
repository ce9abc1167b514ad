#!/usr/bin/env bash
# Course tooling (all chapters) — makes the student handout of one chapter's
# exercises. Depends on: bash, coreutils, grep, sed; reads
# chapters/NN-*/exercises/handout.manifest (the whitelist of shipped files).
#
#   tools/make_handout.sh [--force] [--tar] CHAPTER OUT_DIR
#
#   CHAPTER   chapter number: 01 or 1, 02 or 2, ...
#   OUT_DIR   the handout folder to create; it must not exist yet (or be
#             empty), unless --force replaces an earlier handout there
#   --tar     also write OUT_DIR.tar.gz
#
# Only files named in the manifest are copied (the exercise kit that every
# chapter's grader shares, chapters/exercises/, is listed there too), and the
# pictures (generated/NAME.svg) that a shipped copy of the chapter text shows. The result is then checked
# for solution code: no shipped file may contain a line of the chapter's
# exercises/solution/ sources (30 characters or longer, other than the
# signatures the stubs repeat) or the marker MPT-REFERENCE-SOLUTION. If it does, the handout is deleted and the exit
# status is 1. Bad arguments exit with status 2.
set -euo pipefail

usage() {
  echo "usage: tools/make_handout.sh [--force] [--tar] CHAPTER OUT_DIR   (e.g. tools/make_handout.sh 01 /tmp/ch01-handout)" >&2
  exit 2
}

force=0
tar=0
args=()
for a in "$@"; do
  case "$a" in
    --force) force=1 ;;
    --tar) tar=1 ;;
    -h|--help) usage ;;
    -*) echo "make_handout: unknown option '$a'; valid: --force, --tar" >&2; exit 2 ;;
    *) args+=("$a") ;;
  esac
done
[[ ${#args[@]} -eq 2 ]] || usage
chapter=${args[0]}
out=${args[1]}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[[ $chapter =~ ^[0-9]{1,2}$ ]] || { echo "make_handout: CHAPTER must be a number like 01, got '$chapter'" >&2; exit 2; }
nn=$(printf '%02d' "$((10#$chapter))")
shopt -s nullglob
dirs=("$root"/chapters/"$nn"-*/exercises)
shopt -u nullglob
if [[ ${#dirs[@]} -ne 1 || ! -f ${dirs[0]}/handout.manifest ]]; then
  have=""
  for m in "$root"/chapters/*/exercises/handout.manifest; do
    [[ -f $m ]] || continue
    d=${m#"$root"/chapters/}
    have+="${d%%-*} "
  done
  echo "make_handout: chapter $nn has no exercises/handout.manifest; chapters with exercises: ${have:-none}" >&2
  exit 2
fi
ex=${dirs[0]}
chapter_dir=$(dirname "$ex")

# Refuse to write into anything that is not empty or an earlier handout:
# --force must never delete someone's files.
if [[ -e $out ]]; then
  if [[ -n $(ls -A "$out" 2>/dev/null) ]]; then
    if [[ $force -eq 1 && -f $out/HANDOUT-INFO.txt ]]; then
      rm -rf "$out"
    elif [[ $force -eq 1 ]]; then
      echo "make_handout: $out is not empty and holds no HANDOUT-INFO.txt; not deleting it" >&2
      exit 2
    else
      echo "make_handout: $out already exists and is not empty (use --force to replace an earlier handout)" >&2
      exit 2
    fi
  fi
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)

# --- copy the whitelist --------------------------------------------------------
renames=()  # "SOURCE DESTINATION" pairs, for link rewriting
shipped=()  # every "SOURCE DESTINATION" pair, for the chapter text's links into exercises/
chapter_texts=()  # the shipped copies of the chapter text
while read -r src dest extra; do
  [[ -z ${src:-} || $src == \#* ]] && continue
  [[ -z ${extra:-} ]] || { echo "make_handout: manifest line '$src $dest $extra' has too many fields" >&2; exit 1; }
  dest=${dest:-$src}
  case "$src/$dest" in
    *solution*|*trivial/*|*near-misses/*|*hidden-example/*|*INSTRUCTORS*)
      echo "make_handout: the manifest lists '$src' -> '$dest', which must never be shipped" >&2
      rm -rf "$out"; exit 1 ;;
  esac
  [[ -f $ex/$src ]] || { echo "make_handout: manifest names $src, which does not exist in $ex" >&2; rm -rf "$out"; exit 1; }
  mkdir -p "$(dirname "$out/$dest")"
  cp "$ex/$src" "$out/$dest"
  [[ $src == "$dest" ]] || renames+=("$src $dest")
  shipped+=("$src $dest")
  # Files from outside the exercises folder (the chapter text) lose their
  # neighbours: say where they came from.
  if [[ $src == ../* && $dest == *.md ]]; then
    rel=${chapter_dir#"$root"/}/${src#../}
    chapter_texts+=("$out/$dest")
    # shellcheck disable=SC2016  # the backquotes are Markdown, not a command
    { printf '> A copy of `%s` from the mpt repository, for reading beside the\n' "$rel"
      printf '> exercises. Links to other files of the repository work only there.\n\n'
      cat "$ex/$src"; } > "$out/$dest"
    # ... except its pictures, ![caption](generated/NAME.svg): they travel along.
    src_dir=$(dirname "$ex/$src")
    for pic in $(grep -o '](generated/[A-Za-z0-9_.-]*\.svg)' "$out/$dest" | sed 's/^](//; s/)$//' | sort -u); do
      [[ -f $src_dir/$pic ]] || { echo "make_handout: $rel shows $pic, which does not exist" >&2; rm -rf "$out"; exit 1; }
      mkdir -p "$(dirname "$out/$dest")/generated"
      cp "$src_dir/$pic" "$(dirname "$out/$dest")/$pic"
    done
  fi
done < "$ex/handout.manifest"

# Links between shipped Markdown files follow the renames.
for md in "$out"/*.md; do
  [[ -f $md ]] || continue
  for pair in "${renames[@]}"; do
    from=${pair% *}
    to=${pair#* }
    from_re=$(printf '%s' "$from" | sed 's/[.[\*^$/]/\\&/g')
    sed -i "s/](${from_re})/](${to//\//\\/})/g; s/](${from_re}#/](${to//\//\\/}#/g" "$md"
  done
done

# The chapter text links to the exercises as exercises/FILE: in the handout
# those files sit at their manifest destination (exercises/README.md is the
# handout's README.md).
for md in "${chapter_texts[@]}"; do
  for pair in "${shipped[@]}"; do
    from=exercises/${pair% *}
    to=${pair#* }
    from_re=$(printf '%s' "$from" | sed 's/[.[\*^$/]/\\&/g')
    sed -i "s/](${from_re})/](${to//\//\\/})/g; s/](${from_re}#/](${to//\//\\/}#/g" "$md"
  done
done

# --- provenance ----------------------------------------------------------------
commit="unknown (not a git checkout)"
if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
  commit=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  for d in "$chapter_dir" "$root/chapters/exercises"; do  # the chapter, and the kit it ships
    if [[ -n $(git -C "$root" status --porcelain -- "$d" 2>/dev/null) ]]; then
      commit="$commit, with uncommitted changes in ${d#"$root"/}"
    fi
  done
fi
{
  echo "Chapter $nn exercises: student handout."
  echo "Made by tools/make_handout.sh from mpt commit $commit."
  echo "Edit ex$nn.cpp; README.md says how to build and grade."
} > "$out/HANDOUT-INFO.txt"

# --- no solution code may leave ------------------------------------------------
# A solution line of 30 characters or more counts unless the student has it
# anyway (the signatures repeated from the adapter header in the stubs) or
# it is an #include.
given=$(cat "$ex"/student/* "$ex"/*.hpp 2>/dev/null | sed 's/^[[:space:]]*//; s/[[:space:]]*$//')
leaks=()
if grep -rlF 'MPT-REFERENCE-SOLUTION' "$out" >/dev/null; then
  leaks+=("the marker MPT-REFERENCE-SOLUTION in: $(grep -rlF 'MPT-REFERENCE-SOLUTION' "$out" | tr '\n' ' ')")
fi
shopt -s nullglob
solution_files=("$ex"/solution/*)
shopt -u nullglob
for f in "${solution_files[@]}"; do
  while IFS= read -r line; do
    line=$(printf '%s' "$line" | sed 's/^[[:space:]]*//; s/[[:space:]]*$//')
    [[ ${#line} -ge 30 ]] || continue
    [[ $line == '#include '* ]] && continue  # which headers it reads is no solution
    grep -qxF -- "$line" <<<"$given" && continue
    if hit=$(grep -rlF -- "$line" "$out"); then
      leaks+=("'$line' (from ${f#"$root"/}) in: $(echo "$hit" | tr '\n' ' ')")
    fi
  done < "$f"
done
if [[ ${#solution_files[@]} -eq 0 ]]; then
  echo "make_handout: warning: $ex/solution/ is empty; nothing to check the handout against" >&2
fi
if [[ ${#leaks[@]} -gt 0 ]]; then
  echo "make_handout: solution code found in the handout; deleted $out:" >&2
  printf '  %s\n' "${leaks[@]}" >&2
  rm -rf "$out"
  exit 1
fi

if [[ $tar -eq 1 ]]; then
  tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
fi

echo "handout for chapter $nn in $out ($(find "$out" -type f | wc -l) files; no solution code)"
[[ $tar -eq 0 ]] || echo "archive: $out.tar.gz"
echo "students: read README.md, edit ex$nn.cpp, build with cmake (README.md says how)"
