#!/bin/sh
# restore-ttft.sh - measured TTFT of the mini engine restoring multi-turn prompts from a
# bandwidth-limited tier (the dram tier paced by read_bandwidth), three ways in one run of this script
# on this machine:
#   load-only       the connector loads every hit (no planner)
#   recompute-only  no connector: the engine recomputes every prompt (measured beside each connector run)
#   two-pointer     restore.scheduler cacheflow with a profile measured first, and the engine following
#                   token plans (--restore-plans): the front of a restored range is recomputed while the
#                   back loads
# and prints two-pointer mean TTFT (turns after the first) as a ratio to the better of the other two.
#
# usage: bench/restore-ttft.sh [READ_BANDWIDTH (4MB)] [mini engine workload flags...]
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
engine=$here/build/bin/kvs-mini-engine
[ -x "$engine" ] || { echo "restore-ttft: $engine is not built (make)" >&2; exit 1; }
bandwidth=4MB
if [ $# -gt 0 ]; then
    bandwidth=$1
    shift
fi
work=$(mktemp -d /tmp/kvs-restore-ttft.XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM
tiers="tiers:
  - name: dram
    type: dram
    capacity: 1GiB
    options:
      read_bandwidth: $bandwidth"
printf 'version: 1\nchunk_tokens: 256\n%s\n' "$tiers" >"$work/paced.yaml"
printf 'version: 1\nchunk_tokens: 256\nrestore:\n  scheduler: cacheflow\n  profile: profile.yaml\n%s\n' "$tiers" \
    >"$work/cacheflow.yaml"

"$engine" --config "$work/paced.yaml" --profile "$work/profile.yaml"
"$engine" --config "$work/paced.yaml" --quiet --json "$@" >"$work/load.out"
"$engine" --config "$work/cacheflow.yaml" --restore-plans --quiet --json "$@" >"$work/plans.out"

# mean_ms of the later turns of run "$2" ("connector" or "no_connector") in the JSON line of file $1
mean() {
    tail -n 1 "$1" | sed -n "s/.*\"$2\":{\"later_turns\":{\"n\":[0-9]*,\"mean_ms\":\([0-9.]*\).*/\1/p"
}
load=$(mean "$work/load.out" connector)
rec1=$(mean "$work/load.out" no_connector)
plans=$(mean "$work/plans.out" connector)
rec2=$(mean "$work/plans.out" no_connector)
[ -n "$load" ] && [ -n "$rec1" ] && [ -n "$plans" ] && [ -n "$rec2" ] || {
    echo "restore-ttft: could not read the summaries" >&2
    cat "$work/load.out" "$work/plans.out" >&2
    exit 1
}
grep -o 'restore plans followed[^;]*' "$work/plans.out" | head -n 1
awk -v load="$load" -v r1="$rec1" -v plans="$plans" -v r2="$rec2" -v bw="$bandwidth" 'BEGIN {
    rec = (r1 + r2) / 2
    best = load < rec ? load : rec
    printf "restore-ttft (tier read_bandwidth %s): mean TTFT of turns after the first, ms\n", bw
    printf "  load-only      %8.1f\n", load
    printf "  recompute-only %8.1f  (%.1f beside load-only, %.1f beside two-pointer)\n", rec, r1, r2
    printf "  two-pointer    %8.1f\n", plans
    printf "  two-pointer / better of the two: %.3f\n", plans / best
}'
