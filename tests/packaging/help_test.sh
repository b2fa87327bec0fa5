#!/bin/sh
# help_test.sh BIN_DIR: every program the build makes (BIN_DIR/kvs-*, BIN_DIR/kvstrata-*) answers
# --help with exit status 0 and a usage text, and does nothing else (60 s at most, stdin closed).
set -u
bin=$1
n=0 bad=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for prog in "$bin"/kvs-* "$bin"/kvstrata-*; do
  [ -f "$prog" ] && [ -x "$prog" ] || continue
  n=$((n + 1))
  name=$(basename "$prog")
  timeout 60 "$prog" --help </dev/null >"$out" 2>&1
  status=$?
  if [ "$status" -ne 0 ]; then
    echo "help_test: $name --help exited $status:" >&2
    sed 's/^/    /' "$out" >&2
    bad=$((bad + 1))
  elif ! grep -qi '^usage: ' "$out"; then
    echo "help_test: $name --help exited 0 but printed no 'usage:' line" >&2
    bad=$((bad + 1))
  else
    echo "help_test: $name --help: exit 0, $(wc -l <"$out") lines of usage"
  fi
done
[ "$n" -gt 0 ] || { echo "help_test: no programs in $bin" >&2; exit 1; }
[ "$bad" -eq 0 ] || { echo "help_test: $bad of $n programs failed --help" >&2; exit 1; }
