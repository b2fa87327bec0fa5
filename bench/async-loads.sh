#!/bin/sh
# async-loads.sh - asynchronous loads in the mini engine, measured. Two long requests decode (one token
# per step each) while the turns of SESSIONS other sessions arrive every ARRIVAL_MS, one at a time:
# each session's first turn is computed and saved, its second restores that history from a dram tier
# paced by read_bandwidth (the engine's own cache is too small to keep it). The engine serves the same
# trace twice in one go of this script (--continuous 3):
#   async  `loads: {async: always}`: a restore runs between steps on the connector's loader thread;
#          the request waits unscheduled while the two others keep decoding
#   sync   the restore's loads ride the step that first schedules the request: every request in that
#          step waits for them
# and reports
#   - the decoding requests' step time with an asynchronous load in flight against their steps with no
#     restore in flight, in the same run (decode-only steps, matched within each second by the number
#     of requests decoding, as contexts grow): the slowdown during asynchronous loads (target < 5 %);
#   - with synchronous loads, the steps that carried a restore while others decoded;
#   - the mean TTFT of the restored turns, asynchronous against synchronous;
# each figure as one JSON object, then one human line.
#
# usage: [ARRIVAL_MS=700] [DECODE=4000] [SESSIONS=8] bench/async-loads.sh [READ_BANDWIDTH (4MB)] [mini engine flags...]
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
engine=$here/build/bin/kvs-mini-research
[ -x "$engine" ] || { echo "async-loads: $engine is not built (make)" >&2; exit 1; }
bandwidth=4MB
if [ $# -gt 0 ]; then
    bandwidth=$1
    shift
fi
arrival=${ARRIVAL_MS:-700}
decode=${DECODE:-4000}
sessions=${SESSIONS:-8}
work=$(mktemp -d /tmp/kvs-async-loads.XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM

tiers="tiers:
  - name: dram
    type: dram
    capacity: 1GiB
    options:
      read_bandwidth: $bandwidth"
printf 'version: 1\nchunk_tokens: 256\n%s\n' "$tiers" >"$work/sync.yaml"
printf 'version: 1\nchunk_tokens: 256\nloads:\n  async: always\n%s\n' "$tiers" >"$work/async.yaml"

# The trace: the two decoders first, then each session's first turns, then their second turns.
{
    printf '{"session": "decoder0", "user_tokens": 1000, "output_tokens": %d}\n' "$decode"
    printf '{"session": "decoder1", "user_tokens": 1000, "output_tokens": %d}\n' "$decode"
    for turn in 0 1; do
        s=0
        while [ "$s" -lt "$sessions" ]; do
            if [ "$turn" = 0 ]; then
                printf '{"session": "s%d", "user_tokens": 1500, "output_tokens": 1}\n' "$s"
            else
                printf '{"session": "s%d", "user_tokens": 100, "output_tokens": 8}\n' "$s"
            fi
            s=$((s + 1))
        done
    done
} >"$work/trace.jsonl"
# pages: the two decoders' whole requests, one turn in flight beside them, and a little room: a
# session's first turn is gone from the engine's cache by its second
budget=$(( 2 * ((256 + 1000 + decode + 15) / 16) + (256 + 1500 + 1 + 100 + 8 + 15) / 16 + 48 ))

for mode in async sync; do
    "$engine" --config "$work/$mode.yaml" --trace "$work/trace.jsonl" --continuous 3 \
        --arrival-ms "$arrival" --block-budget "$budget" --quiet --json "$@" >"$work/$mode.out"
done

# field $2 (a sed pattern) of the connector part of the JSON line of file $1
field() {
    tail -n 1 "$1" | sed 's/"no_connector".*//' | sed -n "s/.*$2.*/\1/p"
}
num='\([0-9.]*\)'
a_load_n=$(field "$work/async.out" "\"decode_steps\":{\"loading\":{\"n\":$num,")
a_load_ms=$(field "$work/async.out" "\"decode_steps\":{\"loading\":{\"n\":[0-9]*,\"mean_ms\":$num}")
a_idle_n=$(field "$work/async.out" "\"idle\":{\"n\":$num,")
a_idle_ms=$(field "$work/async.out" "\"idle\":{\"n\":[0-9]*,\"mean_ms\":$num}")
a_ratio=$(field "$work/async.out" "\"matched\":{[^}]*\"ratio\":$num")
a_matched=$(field "$work/async.out" "\"matched\":{[^}]*\"steps\":$num}")
a_m_load=$(field "$work/async.out" "\"matched\":{\"loading_mean_ms\":$num,")
a_m_idle=$(field "$work/async.out" "\"matched\":{[^}]*\"idle_mean_ms\":$num,")
s_idle_ms=$(field "$work/sync.out" "\"idle\":{\"n\":[0-9]*,\"mean_ms\":$num}")
s_rest_n=$(field "$work/sync.out" "\"restore\":{\"n\":$num,")
s_rest_ms=$(field "$work/sync.out" "\"restore\":{\"n\":[0-9]*,\"mean_ms\":$num}")
a_ttft=$(field "$work/async.out" "\"connector\":{\"later_turns\":{\"n\":[0-9]*,\"mean_ms\":$num")
s_ttft=$(field "$work/sync.out" "\"connector\":{\"later_turns\":{\"n\":[0-9]*,\"mean_ms\":$num")
a_async=$(field "$work/async.out" "\"async_loads\":$num")
for v in "$a_m_load" "$a_m_idle" "$a_matched" "$a_load_n" "$a_load_ms" "$a_idle_n" "$a_idle_ms" "$a_ratio" "$s_idle_ms" "$s_rest_n" "$s_rest_ms" "$a_ttft" "$s_ttft" "$a_async"; do
    [ -n "$v" ] || { echo "async-loads: could not read the summaries ($work kept)" >&2; trap - EXIT; exit 1; }
done
[ "$a_async" -gt 0 ] && [ "$a_load_n" -gt 0 ] || {
    echo "async-loads: no decode step ran while an asynchronous load was in flight" >&2
    exit 1
}
printf '{"bench":"async-loads","figure":"decode_step_during_async_loads","read_bandwidth":"%s","matched_mean_ms_loading":%s,"matched_mean_ms_idle":%s,"ratio":%s,"matched_steps":%s,"steps_loading":%s,"mean_ms_loading":%s,"steps_idle":%s,"mean_ms_idle":%s}\n' \
    "$bandwidth" "$a_m_load" "$a_m_idle" "$a_ratio" "$a_matched" "$a_load_n" "$a_load_ms" "$a_idle_n" "$a_idle_ms"
printf '{"bench":"async-loads","figure":"step_carrying_a_sync_restore","read_bandwidth":"%s","steps":%s,"mean_ms":%s,"mean_ms_idle":%s}\n' \
    "$bandwidth" "$s_rest_n" "$s_rest_ms" "$s_idle_ms"
awk -v a="$a_ttft" -v s="$s_ttft" -v bw="$bandwidth" 'BEGIN {
    printf "{\"bench\":\"async-loads\",\"figure\":\"ttft_restored\",\"read_bandwidth\":\"%s\",\"async_ms\":%s,\"sync_ms\":%s,\"ratio\":%.4f}\n", bw, a, s, a / s }'
echo "async-loads (tier read_bandwidth $bandwidth, a turn every $arrival ms beside 2 decoders of $decode tokens):"
awk -v ln="$a_load_n" -v lm="$a_load_ms" -v i_n="$a_idle_n" -v im="$a_idle_ms" -v r="$a_ratio" -v m="$a_matched" \
    -v ml="$a_m_load" -v mi="$a_m_idle" 'BEGIN {
    printf "  decode step with an async load in flight %.3f ms against %.3f ms with none, matched in time and\n", ml, mi
    printf "    batch: %.3fx (%+.1f %%, over %d steps; unmatched means %.3f ms over %d steps, %.3f ms over %d)\n", r, (r - 1) * 100, m, lm, ln, im, i_n }'
awk -v n="$s_rest_n" -v m="$s_rest_ms" -v im="$s_idle_ms" 'BEGIN {
    printf "  sync loads: a step carrying a restore %.1f ms (%d steps) against %.3f ms with none: %.0fx\n", m, n, im, m / im }'
awk -v a="$a_ttft" -v s="$s_ttft" 'BEGIN {
    printf "  TTFT of the restored turns: async %.1f ms, sync %.1f ms: %.3fx\n", a, s, a / s }'
