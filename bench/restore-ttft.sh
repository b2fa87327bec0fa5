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
# each connector run once per completion in $COMPLETION:
#   step     the loads complete with the step that carries them: with --batch N the group's restore is
#            one step and every request of the group waits for all of its loads
#   request  `loads: {async: always}`: the loads run between steps and each request goes on as soon as
#            its own loads have landed and its own part of the plan is computed (per-request
#            completion; the planner also orders the loads)
# (default "step request" with --batch N > 1, else "step"), and prints each mean TTFT (turns after the
# first) as a ratio to the better of load-only (either completion) and recompute-only: one JSON object
# per result, then the human lines.
#
# usage: [MODES="token layer both"] [STAGES=2] [COMPLETION="step request"] bench/restore-ttft.sh [READ_BANDWIDTH (4MB)] [mini engine flags...]
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
engine=$here/build/bin/kvs-mini-research
[ -x "$engine" ] || { echo "restore-ttft: $engine is not built (make)" >&2; exit 1; }
bandwidth=4MB
if [ $# -gt 0 ]; then
    bandwidth=$1
    shift
fi
completions=step
prev=
for a in "$@"; do
    [ "$prev" = --batch ] && [ "$a" -gt 1 ] 2>/dev/null && completions="step request"
    prev=$a
done
completions=${COMPLETION:-$completions}
work=$(mktemp -d /tmp/kvs-restore-ttft.XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM
tiers="tiers:
  - name: dram
    type: dram
    capacity: 1GiB
    options:
      read_bandwidth: $bandwidth"
for c in step request; do
    loads=
    [ "$c" = request ] && loads='loads:
  async: always
'
    printf 'version: 1\nchunk_tokens: 256\n%s%s\n' "$loads" "$tiers" >"$work/paced-$c.yaml"
    printf 'version: 1\nchunk_tokens: 256\n%srestore:\n  scheduler: cacheflow\n  profile: profile.yaml\n%s\n' \
        "$loads" "$tiers" >"$work/cacheflow-$c.yaml"
done

"$engine" --config "$work/paced-step.yaml" --profile "$work/profile.yaml" "$@"
modes=${MODES:-token layer both}
for c in $completions; do
    "$engine" --config "$work/paced-$c.yaml" --quiet --json "$@" >"$work/load-$c.out"
    for m in $modes; do
        extra=
        [ "$m" = stage ] && extra="--stages ${STAGES:-2}"
        # shellcheck disable=SC2086 # $extra is empty or two words
        "$engine" --config "$work/cacheflow-$c.yaml" --restore-plans --plan-modes "$m" $extra --quiet --json "$@" \
            >"$work/plans-$m-$c.out"
    done
done

# mean_ms of the later turns of run "$2" ("connector" or "no_connector") in the JSON line of file $1
mean() {
    tail -n 1 "$1" | sed -n "s/.*\"$2\":{\"later_turns\":{\"n\":[0-9]*,\"mean_ms\":\([0-9.]*\).*/\1/p"
}
loads=
recs=
for c in $completions; do
    loads="$loads $(mean "$work/load-$c.out" connector)"
    recs="$recs $(mean "$work/load-$c.out" no_connector)"
    for m in $modes; do recs="$recs $(mean "$work/plans-$m-$c.out" no_connector)"; done
done
n_comp=$(echo "$completions" | wc -w)
[ "$(echo "$loads" | wc -w)" -eq "$n_comp" ] &&
    [ "$(echo "$recs" | wc -w)" -eq "$(( ($(echo "$modes" | wc -w) + 1) * n_comp ))" ] || {
    echo "restore-ttft: could not read the summaries" >&2
    exit 1
}
rec=$(echo "$recs" | awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.3f", s / NF }')
best=$(echo "$loads $rec" | awk '{ b = $1; for (i = 2; i <= NF; i++) if ($i < b) b = $i; print b }')
result() { # policy mode completion mean_ms
    awk -v p="$1" -v m="$2" -v c="$3" -v t="$4" -v best="$best" -v bw="$bandwidth" 'BEGIN {
        printf "{\"bench\":\"restore-ttft\",\"read_bandwidth\":\"%s\",\"policy\":\"%s\",\"mode\":\"%s\",\"completion\":\"%s\",\"mean_ms\":%s,\"reference_ms\":%s,\"ratio\":%.4f}\n", bw, p, m, c, t, best, t / best }'
}
i=1
for c in $completions; do
    result load-only - "$c" "$(echo "$loads" | awk -v i="$i" '{ print $i }')"
    for m in $modes; do result plans "$m" "$c" "$(mean "$work/plans-$m-$c.out" connector)"; done
    i=$((i + 1))
done
result recompute-only - - "$rec"
echo "restore-ttft (tier read_bandwidth $bandwidth): mean TTFT of turns after the first, ms"
i=1
for c in $completions; do
    printf '  load-only  %-7s       %8.1f\n' "$c" "$(echo "$loads" | awk -v i="$i" '{ print $i }')"
    i=$((i + 1))
done
printf '  recompute-only             %8.1f  (mean of%s, one beside each connector run)\n' "$rec" "$recs"
for c in $completions; do
    for m in $modes; do
        f=$work/plans-$m-$c.out
        t=$(mean "$f" connector)
        followed=$(grep -o 'restore plans followed: [^(]*' "$f" | head -n 1 | sed 's/restore plans followed: //')
        bnd=$(grep -o 'stages restored from their boundary [0-9]*' "$f" | head -n 1 | sed 's/.* //')
        [ -n "$bnd" ] && followed="$followed; stages past the first restored from their boundary: $bnd"
        awk -v m="$m" -v c="$c" -v t="$t" -v best="$best" -v f="$followed" \
            'BEGIN { printf "  plans %-6s %-7s       %8.1f  ratio to the better of the two %.3f  (%s)\n", m, c, t, t / best, f }'
    done
done
