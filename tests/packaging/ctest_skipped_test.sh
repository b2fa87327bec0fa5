#!/bin/sh
# ctest_skipped_test.sh SOURCE_DIR: scripts/ctest-skipped.sh (what `make test` prints after ctest)
# lists exactly the tests that did not run, each with the line of its output that says why.
set -eu
src=$1
out=$(sh "$src/scripts/ctest-skipped.sh" "$src/tests/packaging/fixtures/ctest-junit.xml")
printf '%s\n' "$out"
fail() {
  echo "ctest_skipped_test: $*" >&2
  exit 1
}
printf '%s\n' "$out" | grep -q '^2 tests did not run (skipped, not passed' || fail "no count of 2"
printf '%s\n' "$out" | grep -Eq '^  test_cuda_device +skipped: no usable CUDA device \(driver < 12\.0 & no GPU\)$' ||
  fail "test_cuda_device's reason is missing or not unescaped"
printf '%s\n' "$out" | grep -Eq '^  netns_case +needs root for network namespaces$' ||
  fail "netns_case's one-line output is not its reason"
if printf '%s\n' "$out" | grep -Eq 'test_passes|test_fails'; then fail "a test that ran is listed"; fi
[ -z "$(sh "$src/scripts/ctest-skipped.sh" /dev/null)" ] || fail "an empty report lists something"
echo "ctest_skipped_test: the skipped tests and their reasons are listed, nothing else"
