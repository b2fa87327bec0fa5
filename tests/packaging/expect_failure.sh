#!/bin/sh
# expect_failure.sh STATUS REGEX COMMAND [ARG...]: passes when COMMAND exits with STATUS and its
# standard error has a line matching the extended regular expression REGEX.
set -u
want_status=$1
pattern=$2
shift 2
err=$(mktemp)
trap 'rm -f "$err"' EXIT
"$@" 2>"$err" >/dev/null
status=$?
cat "$err"
if [ "$status" -ne "$want_status" ]; then
  echo "expect_failure: '$*' exited $status, expected $want_status" >&2
  exit 1
fi
if ! grep -Eq "$pattern" "$err"; then
  echo "expect_failure: no line of its standard error matches: $pattern" >&2
  exit 1
fi
echo "expect_failure: exited $status and said why, as expected"
