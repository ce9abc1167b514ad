#!/usr/bin/env bash
# Docs — fails when a namespace of the API has no description. Depends on:
# doxygen (the configured docs/Doxyfile), bash, awk. Run by the docs target
# after the site is built.
#
# usage: check_namespaces.sh DOXYGEN DOXYFILE WORK_DIR
#
# Doxygen does not warn about an undocumented namespace, and with
# EXTRACT_ALL = NO it then silently skips the missing docs of everything
# inside it, so a new namespace could hide a whole undocumented API. This
# script runs Doxygen once more over the same inputs with EXTRACT_ALL = YES,
# XML output only and no graphs (about a second), and checks that every named
# namespace it finds has a brief description (docs/namespaces.dox holds them).
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 DOXYGEN DOXYFILE WORK_DIR" >&2
  exit 2
fi
doxygen=$1
doxyfile=$2
work=$3

rm -rf "$work"
mkdir -p "$work"
{
  cat "$doxyfile"
  echo "OUTPUT_DIRECTORY = \"$work\""
  echo "EXTRACT_ALL = YES"
  echo "WARN_AS_ERROR = NO"
  echo "WARNINGS = NO"
  echo "WARN_IF_UNDOCUMENTED = NO"
  echo "QUIET = YES"
  echo "HAVE_DOT = NO"
  echo "SOURCE_BROWSER = NO"
  echo "GENERATE_HTML = NO"
  echo "GENERATE_XML = YES"
  echo "XML_PROGRAMLISTING = NO"
} | "$doxygen" - >"$work/doxygen.log" 2>&1 || {
  cat "$work/doxygen.log" >&2
  echo "check_namespaces.sh: doxygen failed" >&2
  exit 1
}

shopt -s nullglob
files=("$work"/xml/namespace*.xml)
if [[ ${#files[@]} -eq 0 ]]; then
  echo "check_namespaces.sh: Doxygen found no namespace at all (see $work)" >&2
  exit 1
fi

# Namespaces declared in a .cpp file only (a pitfall's own names, file-local
# inside an anonymous namespace that Doxygen does not name) are
# implementation, not API: the compound's own <location>, the last one in its
# file, names a .cpp.
implementation=$(awk '
  function flush() { if (where ~ /\.cpp$/) print name; name = ""; where = "" }
  FNR == 1 { flush() }
  /<compoundname>/ && name == "" { name = $0; sub(/.*<compoundname>/, "", name); sub(/<\/compoundname>.*/, "", name) }
  /<location file="/ { where = $0; sub(/.*<location file="/, "", where); sub(/".*/, "", where) }
  END { flush() }
' "${files[@]}" | sort -u)

# Per namespace compound: its name, and whether its own <briefdescription>
# holds a paragraph. The compound's brief comes after its members' (each
# member has one), so it is the last in the file. Anonymous namespaces
# (Doxygen names them @N) are implementation and need none; std is the
# standard library's.
undocumented=$(awk '
  function flush() {
    if (is_namespace && name != "" && name !~ /@/ && name != "std" && last !~ /<para>/) print name
    name = ""; inbrief = 0; is_namespace = 0; last = ""
  }
  FNR == 1 { flush() }
  /<compounddef / && /kind="namespace"/ { is_namespace = 1 }
  /<compoundname>/ && name == "" {
    name = $0; sub(/.*<compoundname>/, "", name); sub(/<\/compoundname>.*/, "", name)
  }
  /<briefdescription>/ && !inbrief { inbrief = 1; brief = "" }
  inbrief { brief = brief $0 }
  /<\/briefdescription>/ && inbrief { inbrief = 0; last = brief }
  END { flush() }
' "${files[@]}" | sort -u | comm -23 - <(echo "$implementation"))

if [[ -n "$undocumented" ]]; then
  echo "check_namespaces.sh: these namespaces have no description; add a \\namespace entry" >&2
  echo "to docs/namespaces.dox (Doxygen skips the missing docs of their members otherwise):" >&2
  echo "$undocumented" | sed 's/^/  /' >&2
  exit 1
fi
echo "check_namespaces.sh: every named namespace has a description"
