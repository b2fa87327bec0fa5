#!/bin/sh
# compress-ttft.sh - the mini engine with the trained model (--weights default) over a working set
# about four times its memory tiers, two chains with the same memory in one run of this script:
#   compress   dram (DRAM/2) + compress (DRAM/2, allow_lossy, AdaptCache) + ssd paced at $SSD
#   raw        dram (DRAM) + ssd paced at $SSD, nothing compressed
# (both with placement-free write-back from DRAM). Each run also measures the same turns with no
# connector (recompute). Prints the mean TTFT of the turns after the first for both chains and the
# ratio compress / raw (the reference, measured beside it), then the compressed run's --verify
# figures: turns with lossy hits, their mean next-token KL divergence and top-1 agreement against a
# full recompute. One JSON line, then the human lines.
#
# usage: [DRAM=4MiB] [SSD=4MB/s] [ALPHA=0.01] [CODECS='[kivi4, drop50]'] bench/compress-ttft.sh
#        [mini engine flags...]
# CODECS is placement.codecs (default: the library's, int8, kivi4 and kivi2); drop50 and drop25 drop
# tokens, which the mini engine masks.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
engine=$here/build/bin/kvs-mini-engine
[ -x "$engine" ] || { echo "compress-ttft: $engine is not built (make)" >&2; exit 1; }
dram=${DRAM:-4MiB}
ssd=${SSD:-4MB/s}
alpha=${ALPHA:-0.01}
codecs=${CODECS:-}
half=$(echo "$dram" | awk '{ n = $0 + 0; u = $0; sub(/^[0-9.]+/, "", u); printf "%g%s", n / 2, u }')
work=$(mktemp -d /tmp/kvs-compress-ttft.XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM
mkdir -p "$work/ssd-compress" "$work/ssd-raw"
ssd_tier() { # directory
    printf '  - name: ssd\n    type: ssd\n    capacity: 64MiB\n    paths: [%s]\n    options:\n      sim_bandwidth: %s\n' "$1" "$ssd"
}
{
    printf 'version: 1\nchunk_tokens: 256\ntiers:\n  - name: dram\n    type: dram\n    capacity: %s\n' "$half"
    printf '  - name: zip\n    type: compress\n    capacity: %s\n    options:\n      allow_lossy: true\n' "$half"
    printf '      next_capacity: 64MiB\n      next_bandwidth: %s\n      recompute_ms: 70\n' "$ssd"
    ssd_tier "$work/ssd-compress"
    printf 'loads:\n  accept_lossy: true\nplacement:\n  alpha: %s\n' "$alpha"
    [ -z "$codecs" ] || printf '  codecs: %s\n' "$codecs"
} >"$work/compress.yaml"
{
    printf 'version: 1\nchunk_tokens: 256\ntiers:\n  - name: dram\n    type: dram\n    capacity: %s\n' "$dram"
    ssd_tier "$work/ssd-raw"
} >"$work/raw.yaml"

"$engine" --config "$work/raw.yaml" --weights default --quiet --json "$@" >"$work/raw.out"
# the quality figures are reported, not judged here: no bounds
"$engine" --config "$work/compress.yaml" --weights default --verify --lossy-kl 1e9 --lossy-top1 0 --quiet \
    --json "$@" >"$work/compress.out"

# mean_ms of the later turns of run "$2" ("connector" or "no_connector") in the JSON line of file $1
mean() {
    tail -n 1 "$1" | sed -n "s/.*\"$2\":{\"later_turns\":{\"n\":[0-9]*,\"mean_ms\":\([0-9.]*\).*/\1/p"
}
field() { # file key
    tail -n 1 "$1" | sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p"
}
c=$(mean "$work/compress.out" connector)
r=$(mean "$work/raw.out" connector)
rc=$(mean "$work/compress.out" no_connector)
rr=$(mean "$work/raw.out" no_connector)
turns=$(field "$work/compress.out" lossy_turns)
kl=$(field "$work/compress.out" lossy_kl)
top1=$(field "$work/compress.out" lossy_top1)
dropped=$(field "$work/compress.out" dropped_tokens)
[ -n "$c" ] && [ -n "$r" ] && [ -n "$turns" ] || {
    echo "compress-ttft: could not read the summaries" >&2
    exit 1
}
tiers_c=$(grep -o 'loaded per tier \[[^]]*\]' "$work/compress.out" | head -n 1)
tiers_r=$(grep -o 'loaded per tier \[[^]]*\]' "$work/raw.out" | head -n 1)
awk -v c="$c" -v r="$r" -v rc="$rc" -v rr="$rr" -v d="$dram" -v s="$ssd" -v a="$alpha" -v n="$turns" -v kl="$kl" -v t="$top1" -v dr="${dropped:-0}" -v cs="${codecs:-default}" 'BEGIN {
    printf "{\"bench\":\"compress-ttft\",\"dram\":\"%s\",\"ssd\":\"%s\",\"alpha\":%s,\"compress_ms\":%s,\"raw_ms\":%s,\"ratio\":%.4f,\"recompute_ms\":[%s,%s],\"lossy_turns\":%s,\"lossy_kl\":%s,\"lossy_top1\":%s,\"dropped_tokens\":%s,\"codecs\":\"%s\"}\n", d, s, a, c, r, c / r, rc, rr, n, kl, t, dr, cs
    printf "compress-ttft (memory %s, ssd paced at %s, alpha %s, codecs %s): mean TTFT of turns after the first\n", d, s, a, cs
    printf "  dram + compress + ssd   %8.1f ms\n", c
    printf "  dram + ssd (reference)  %8.1f ms   ratio %.3f\n", r, c / r
    printf "  recompute (no connector, beside each run)  %.1f / %.1f ms\n", rc, rr
    printf "  lossy hits: %s turns, mean KL %s nats, top-1 agreement %s; %s loaded positions dropped\n", n, kl, t, dr
}'
echo "  compress run: $tiers_c; raw run: $tiers_r"
