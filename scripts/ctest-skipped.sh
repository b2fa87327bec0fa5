#!/bin/sh
# ctest-skipped.sh JUNIT_XML: after `ctest --output-junit JUNIT_XML`, lists every test that did not
# run (skipped: exit 77, SKIP_RETURN_CODE; or disabled) with the line of its output that says why, so
# that "100% tests passed" is never read as "everything ran". Prints nothing when every test ran.
# Exits 0 whatever it finds: the listing never changes ctest's verdict.
junit=${1:?usage: ctest-skipped.sh JUNIT_XML}
[ -r "$junit" ] || { echo "ctest-skipped: no $junit (ctest wrote no JUnit report)" >&2; exit 0; }
awk '
function attr(line, key,    at) {
  if (!match(line, " " key "=\"[^\"]*\"")) return ""
  return substr(line, RSTART + length(key) + 3, RLENGTH - length(key) - 4)
}
function unescape(s) {
  gsub(/&lt;/, "<", s); gsub(/&gt;/, ">", s); gsub(/&quot;/, "\"", s); gsub(/&apos;/, "'\''", s)
  gsub(/&amp;/, "\\&", s)
  return s
}
function output_line(s) {
  if (s ~ /^[ \t]*$/) return
  last = s
  if (why == "" && tolower(s) ~ /skip/) why = s
}
/<testcase / { name = attr($0, "name"); status = attr($0, "status"); why = ""; last = ""; msg = "" }
/<skipped / { msg = attr($0, "message") }
{
  line = $0
  if (index(line, "<system-out>")) { in_out = 1; line = substr(line, index(line, "<system-out>") + 12) }
  if (in_out) {
    closing = index(line, "</system-out>")
    if (closing) { line = substr(line, 1, closing - 1); in_out = 0 }
    output_line(unescape(line))
  }
}
/<\/testcase>/ {
  if (status == "notrun" || status == "disabled") {
    reason = why != "" ? why : last != "" ? last : msg != "" ? unescape(msg) : status
    if (index(reason, name ": ") == 1) reason = substr(reason, length(name) + 3)
    skipped[++n] = sprintf("  %-40s %s", name, reason)
  }
}
END {
  if (!n) exit 0
  printf "\n%d test%s did not run (skipped, not passed; \"tests passed\" above does not count them):\n", n, n == 1 ? "" : "s"
  for (i = 1; i <= n; i++) print skipped[i]
}' "$junit"
exit 0
