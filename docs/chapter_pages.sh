#!/usr/bin/env bash
# Docs — turns every chapter's README.md into a Doxygen page. Depends on:
# bash, awk, cp.
#
# usage: chapter_pages.sh SOURCE_DIR PAGES_DIR
#
# The page shows the chapter text as committed, with its generated/ outputs:
# the tests chNN_docs_generated_in_sync rerun every demo the text shows and
# fail when a committed output differs, so the site needs no second run of
# them (the Chapter 4 seed sweep alone took five minutes).
#
# For chapters/NN-topic/ it writes
#   PAGES_DIR/NN-topic/README.md, generated/   a copy of the chapter's
#   PAGES_DIR/chNN.md                          the page Doxygen reads
# The page is the README with two changes a reader of the site needs
# and a reader on a repository web page must not see:
#   - the first heading gets the page id {#chNN} (stable links: \ref ch01);
#   - relative links become site links: another chapter's README.md -> \ref chNN,
#     the top-level README.md -> the main page; a link to any other file of the
#     tree (a script, a source file) keeps its text and loses the link, since
#     the site does not carry those files.
#   - a snippet block (chapters/generate_common.sh writes it from the source)
#       <!-- snippet: FILE MARKER -->
#       ```cpp ... ```
#       <!-- end snippet -->
#     stays as it is: the site shows the same fenced code as the repository
#     web page and the handout, highlighted by Doxygen all the same. It is
#     not turned back into \snippet: Doxygen 1.9 keeps the source's
#     indentation in a \snippet (and has no {trimleft} yet), and the marker
#     is already checked by generate.sh --check, the test the code is
#     compared in.
#   - a diagram block
#       <!-- diagram: NAME.dot "caption" -->
#       ![caption](generated/NAME.svg)
#       <!-- end diagram -->
#     (or the marker alone) becomes \dotfile NAME.dot "caption", its other
#     lines blank: Doxygen draws NAME.dot from docs/ (drawn by hand) or from
#     the diagrams mpt_diagrams draws (DOTFILE_DIRS) in the site's style,
#     without the Graphviz version stamp the chapter's copy carries.
#   - headings lose their backticks (Doxygen 1.9 prints a code span in a
#     heading as a literal <tt> tag).
#   - a picture on a line of its own, ![caption](generated/NAME.svg), becomes
#     \image html NAME.svg "caption"; the generated/ files of every
#     chapter are copied to PAGES_DIR/images, which is on IMAGE_PATH.
#   - three quirks of Doxygen 1.9's Markdown in prose, which a repository web
#     page renders right, are written around (on the page only):
#       `L' = S·L`   a code span holding a quote reads as a `quote' and breaks
#                    the paragraph: it becomes ``L' = S·L``;
#       **`scale()`** bold that opens with a code span keeps its asterisks:
#                    it becomes <b>`scale()`</b>;
#       "see `f()`"  code spans inside double quotes stay literal: those
#                    quotes become typographic ones, “see `f()`”.
# Fenced code blocks (the demo output) are copied untouched.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 SOURCE_DIR PAGES_DIR" >&2
  exit 2
fi
source_dir=$(cd "$1" && pwd)
pages=$2

rm -rf "$pages"
mkdir -p "$pages"
pages=$(cd "$pages" && pwd)

shopt -s nullglob
found=0
for chapter in "$source_dir"/chapters/[0-9][0-9]-*/; do
  chapter=${chapter%/}
  [[ -f "$chapter/README.md" ]] || continue
  name=$(basename "$chapter")
  nn=${name:0:2}
  copy="$pages/$name"
  mkdir -p "$copy"
  cp "$chapter/README.md" "$copy/README.md"
  [[ -d "$chapter/generated" ]] && cp -r "$chapter/generated" "$copy/generated"

  mkdir -p "$pages/images"
  for img in "$copy"/generated/*.svg "$copy"/generated/*.png; do
    cp "$img" "$pages/images/"
  done

  awk -v id="ch$nn" '
    # rewrite the (target) of every markdown link on a line of prose
    function relink(line,    out, pos, target, rest, text_start, n, m) {
      out = ""
      while (match(line, /\]\([^)]*\)/)) {
        target = substr(line, RSTART + 2, RLENGTH - 3)
        out = out substr(line, 1, RSTART - 1)
        rest = substr(line, RSTART + RLENGTH)
        if (target ~ /^[a-zA-Z][a-zA-Z0-9+.-]*:/ || target ~ /^#/ || target ~ /^@ref /) {
          out = out "](" target ")"                      # URL, anchor or ref: keep
        } else if (target ~ /(^|\/)[0-9][0-9]-[^\/]*\/README\.md$/) {
          n = target; sub(/\/README\.md$/, "", n); sub(/.*\//, "", n)
          out = out "](@ref ch" substr(n, 1, 2) ")"      # another chapter
        } else if (target ~ /^(\.\.\/)+README\.md$/) {
          out = out "](@ref index)"                      # the top-level README
        } else {
          # a file of the tree: keep the text "[text]" without the link
          m = out; text_start = 0
          for (pos = length(m); pos > 0; pos--) if (substr(m, pos, 1) == "[") { text_start = pos; break }
          if (text_start > 0) out = substr(m, 1, text_start - 1) substr(m, text_start + 1)
          else out = out "](" target ")"
        }
        line = rest
      }
      return out line
    }
    # the Doxygen 1.9 quirks of the header comment, on one line of prose
    function quirks(line,    out, pre, span) {
      out = ""
      while (match(line, /`[^`]+`/)) {
        pre = substr(line, 1, RSTART - 1)
        span = substr(line, RSTART + 1, RLENGTH - 2)
        if (index(span, "\047") > 0 && substr(pre, length(pre)) != "`") out = out pre "``" span "``"
        else out = out pre "`" span "`"
        line = substr(line, RSTART + RLENGTH)
      }
      line = out line
      out = ""
      while (match(line, /\*\*`[^*]*\*\*/)) {
        out = out substr(line, 1, RSTART - 1) "<b>" substr(line, RSTART + 2, RLENGTH - 4) "</b>"
        line = substr(line, RSTART + RLENGTH)
      }
      line = out line
      out = ""
      while (match(line, /"[^"]*`[^"]*"/)) {
        out = out substr(line, 1, RSTART - 1) "“" substr(line, RSTART + 1, RLENGTH - 2) "”"
        line = substr(line, RSTART + RLENGTH)
      }
      return out line
    }
    NR == 1 {
      if ($0 !~ /^# /) { print "chapter_pages.sh: " FILENAME ": the first line must be the chapter title (# ...)" > "/dev/stderr"; exit 1 }
      print $0 " {#" id "}"
      next
    }
    # the picture of a diagram block: Doxygen draws the \dotfile instead
    after_diagram {
      after_diagram = 0
      if ($0 ~ /^!\[/) { print ""; blank_until = "<!-- end diagram -->"; next }
    }
    # the rest of a diagram block: blank (lines are never removed)
    blank_until != "" {
      if ($0 ~ ("^" blank_until "[ \t]*$")) blank_until = ""
      print ""
      next
    }
    # A folded block (the checks of a pitfall report): Doxygen 1.9 closes
    # <details> right after its <summary>, so the page shows the summary as a
    # paragraph of its own and the block unfolded.
    !fenced && /^<details><summary>.*<\/summary>[ \t]*$/ {
      line = $0; sub(/^<details><summary>/, "", line); sub(/<\/summary>[ \t]*$/, "", line)
      print "<b>" line "</b>"
      next
    }
    !fenced && /^<\/details>[ \t]*$/ { print ""; next }
    /^[ \t]*```/ { fenced = !fenced; print; next }
    fenced { print; next }
    # Doxygen 1.9 shows a `code span` in a heading as a literal <tt> tag:
    # headings lose their backticks.
    /^#+ / { gsub(/`/, ""); print relink($0); next }
    /^<!-- diagram: [^ ]+\.dot ".*" -->[ \t]*$/ {
      line = $0
      sub(/^<!-- diagram: /, "", line)
      sub(/ -->[ \t]*$/, "", line)
      print "\\dotfile " line
      after_diagram = 1
      next
    }
    /^!\[[^]]*\]\(generated\/[^)\/]+\)[ \t]*$/ {
      caption = $0; sub(/^!\[/, "", caption); sub(/\]\(.*$/, "", caption)
      gsub(/"/, "\\\"", caption)
      file = $0; sub(/^.*\(generated\//, "", file); sub(/\).*$/, "", file)
      print "\\image html " file " \"" caption "\""
      next
    }
    { print quirks(relink($0)) }
  ' "$copy/README.md" >"$pages/ch$nn.md"
  found=$((found + 1))
done

if [[ $found -eq 0 ]]; then
  echo "chapter_pages.sh: no chapters/NN-*/README.md under $source_dir" >&2
  exit 1
fi
# Lines are rewritten in place, never added or removed: a Doxygen warning
# about PAGES_DIR/chNN.md line L is about chapters/NN-*/README.md line L.
echo "chapter_pages.sh: $found chapter page(s) in $pages (chNN.md line L = the chapter's README.md line L)"
