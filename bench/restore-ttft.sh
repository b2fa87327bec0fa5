#!/bin/sh
# restore-ttft.sh - measured TTFT of the mini engine restoring multi-turn prompts from a
# bandwidth-limited tier (the dram tier paced by read_bandwidth), three ways in one run of this script
# on this machine:
#   load-only       the connector loads every hit (no planner)
#   recompute-only  no connector: the engine recomputes every prompt (measured beside each connector run)
#   plans           restore.scheduler cacheflow with a profile measured first, and the engine following
#                   its plans (--restore-plans --plan-modes M) for each M in $MODES (default
#                   "token layer both"): token plans recompute the front of a restored range while the
#                   back loads, layer plans its lower layers while the upper ones load; mode "stage"
#                   runs the engine with --stages $STAGES (default 2): each pipeline stage recomputes
#                   its lowest layers from its stored boundary activations on a thread of its own
#                   while the other layers load (the baselines run without stages: they store and load
#                   no boundaries)
# and prints each mean TTFT (turns after the first) as a ratio to the better of load-only and
# recompute-only.
#
# usage: [MODES="token layer both"] [STAGES=2] bench/restore-ttft.sh [READ_BANDWIDTH (4MB)] [mini engine flags...]
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

"$engine" --config "$work/paced.yaml" --profile "$work/profile.yaml" "$@"
"$engine" --config "$work/paced.yaml" --quiet --json "$@" >"$work/load.out"
modes=${MODES:-token layer both}
for m in $modes; do
    extra=
    [ "$m" = stage ] && extra="--stages ${STAGES:-2}"
    # shellcheck disable=SC2086 # $extra is empty or two words
    "$engine" --config "$work/cacheflow.yaml" --restore-plans --plan-modes "$m" $extra --quiet --json "$@" \
        >"$work/plans-$m.out"
done

# mean_ms of the later turns of run "$2" ("connector" or "no_connector") in the JSON line of file $1
mean() {
    tail -n 1 "$1" | sed -n "s/.*\"$2\":{\"later_turns\":{\"n\":[0-9]*,\"mean_ms\":\([0-9.]*\).*/\1/p"
}
load=$(mean "$work/load.out" connector)
recs=$(mean "$work/load.out" no_connector)
for m in $modes; do recs="$recs $(mean "$work/plans-$m.out" no_connector)"; done
[ -n "$load" ] && [ "$(echo "$recs" | wc -w)" -eq "$(( $(echo "$modes" | wc -w) + 1 ))" ] || {
    echo "restore-ttft: could not read the summaries" >&2
    exit 1
}
rec=$(echo "$recs" | awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.3f", s / NF }')
best=$(awk -v a="$load" -v b="$rec" 'BEGIN { print (a < b ? a : b) }')
echo "restore-ttft (tier read_bandwidth $bandwidth): mean TTFT of turns after the first, ms"
printf '  load-only        %8.1f\n' "$load"
printf '  recompute-only   %8.1f  (mean of %s, one beside each connector run)\n' "$rec" "$recs"
for m in $modes; do
    t=$(mean "$work/plans-$m.out" connector)
    followed=$(grep -o 'restore plans followed: [^(]*' "$work/plans-$m.out" | head -n 1 | sed 's/restore plans followed: //')
    bnd=$(grep -o 'stages restored from their boundary [0-9]*' "$work/plans-$m.out" | head -n 1 | sed 's/.* //')
    [ -n "$bnd" ] && followed="$followed; stages past the first restored from their boundary: $bnd"
    awk -v m="$m" -v t="$t" -v best="$best" -v f="$followed" \
        'BEGIN { printf "  plans %-10s %8.1f  ratio to the better of the two %.3f  (%s)\n", m, t, t / best, f }'
done
