#!/bin/sh
# check-decls.sh [FILE...]: the public headers read one declaration per line. Fails, naming file and
# line, for a line that is only a type (`    uint64_t`) with its declarator on the next line, an
# array bound alone on a line, a `#define NAME \` whose value is on the next line (all three are
# what clang-format does to a declaration whose trailing comment does not fit: write the comment
# above it instead), and a line over 100 columns. Without arguments: every abi/*.h but those in
# SKIP. (Types here are lower case, so an enumerator alone on its line is not taken for one.)
SKIP=""
if [ $# -eq 0 ]; then
  cd "$(dirname "$0")/.." || exit 2
  for f in abi/*.h; do
    case " $SKIP " in *" $f "*) continue ;; esac
    set -- "$@" "$f"
  done
fi
awk '
/^[ \t]*(const[ \t]+)?(unsigned[ \t]+|signed[ \t]+|struct[ \t]+|enum[ \t]+)?[a-z_][A-Za-z0-9_]*([ \t]*\*+)?[ \t]*$/ {
  print FILENAME ":" FNR ": a type alone, its declarator on the next line: " $0; bad = 1
}
/^[ \t]*\[/ { print FILENAME ":" FNR ": an array bound alone on a line: " $0; bad = 1 }
/^#[ \t]*define[ \t]+[A-Za-z_][A-Za-z0-9_]*[ \t]*\\$/ {
  print FILENAME ":" FNR ": a #define whose value is on the next line: " $0; bad = 1
}
length($0) > 100 { print FILENAME ":" FNR ": " length($0) " columns (at most 100)"; bad = 1 }
END { exit bad }
' "$@" || { echo "check-decls: write a comment that does not fit above its declaration" >&2; exit 1; }
echo "check-decls: $# headers, one declaration a line, none over 100 columns"
