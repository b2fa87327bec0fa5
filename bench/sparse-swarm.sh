#!/bin/sh
# sparse-swarm.sh - sparse decode's reads from a paced multi-path SSD tier (docs/sparse.md), in one
# run of this script on this machine: kvs-mini-research --sparse-decode --verify over the trained
# model, for 2, 4 and 8 paths, each path paced like a device (sim_iops, sim_bandwidth), with the
# missed rows read three ways:
#   - rows:      each row from its chunk object (one small read for K, one for V): no clustering,
#                the reference;
#   - positions: cluster objects of consecutive rows (placement by position, as chunks store them);
#   - swarm:     Swarm's co-activation clusters, profiled on the run's own decode trace.
# The two cluster layouts are written by a first run and measured in a second one, a new process
# that finds them in the tier (as after a restart), so the figures are reads only. Printed per
# run: read time per decoded token, effective bandwidth (bytes of needed rows per second of
# reading), bytes read per useful byte, decode tok/s, and the ratios of the cluster layouts'
# read time and bandwidth to the reference's. Full-KV offload (each step restoring the stored
# prompt through the load hooks from the same tier) is printed beside them by the engine.
#
# usage: [CONTEXT=2048] [DECODE=32] [TOPK=64] [IOPS=20000] [BW=1GB/s] bench/sparse-swarm.sh
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
engine=$here/build/bin/kvs-mini-research
[ -x "$engine" ] || { echo "sparse-swarm: build first (make)" >&2; exit 1; }
context=${CONTEXT:-2048}
decode=${DECODE:-32}
topk=${TOPK:-64}
iops=${IOPS:-20000}
bw=${BW:-1GB/s}
work=$(mktemp -d /tmp/kvs-sparse-swarm-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"

# run LAYOUT PATHS OUT: one engine run into OUT; fails the script when --verify fails
run() {
    if ! "$engine" --sparse-decode --verify --weights default --sparse-context "$context" \
        --decode-tokens "$decode" --topk "$topk" --config "$work/p$2/ssd.yaml" \
        --sparse-layout "$1" --profile-steps 8 >"$3" 2>&1; then
        cat "$3" >&2
        echo "sparse-swarm: $1 over $2 paths failed" >&2
        exit 1
    fi
}

# B a token, read ms a token, tok/s, B read a useful B (0 for rows) from an engine run's output
figures() {
    bpt=$(sed -n 's/.* rows read ([0-9]* failed), \([0-9.]*\) B a token.*/\1/p' "$1")
    ms=$(sed -n 's/.* reads \([0-9.]*\) ms a token$/\1/p' "$1")
    tps=$(sed -n 's/^sparse: decode \([0-9.]*\) tok\/s sparse.*/\1/p' "$1")
    off=$(sed -n 's/.* \([0-9.]*\) tok\/s full-KV offload.*/\1/p' "$1")
    amp=$(sed -n 's/.*(\([0-9]*\) B, \([0-9.]*\) B read a useful B).*/\2/p' "$1")
    echo "$bpt ${ms:-0} ${tps:-0} ${amp:-1} ${off:-0}"
}

echo "sparse-swarm: context $context, $decode decode steps, top-$topk, paths paced at $iops IOPS" \
    "and $bw each; $(date -u +%Y-%m-%d) on $(nproc) cores"
printf '%-6s %-10s %12s %14s %12s %10s %10s %12s %12s\n' paths layout "read ms/tok" "useful MB/s" \
    "B/useful B" "tok/s" "offload" "time ratio" "bw ratio"
for paths in 2 4 8; do
    dir="$work/p$paths"
    mkdir -p "$dir"
    list=""
    for i in $(seq 0 $((paths - 1))); do
        mkdir -p "$dir/d$i"
        list="$list${list:+, }d$i"
    done
    cat >"$dir/ssd.yaml" <<YAML
version: 1
chunk_tokens: 256
log_level: warn
tiers:
  - name: nvme
    type: ssd
    capacity: 512MiB
    paths: [$list]
    options:
      stripe_bytes: 4KiB
      sim_iops: $iops
      sim_bandwidth: $bw
YAML
    ref_ms=""
    ref_bw=""
    for layout in rows positions swarm; do
        [ "$layout" = rows ] || run "$layout" "$paths" "$dir/$layout.1" # writes the clusters
        run "$layout" "$paths" "$dir/$layout.out"
        set -- $(figures "$dir/$layout.out")
        useful=$(awk -v b="$1" -v ms="$2" 'BEGIN { printf "%.2f", (ms > 0 ? b / ms / 1000 : 0) }')
        [ -n "$ref_ms" ] || { ref_ms=$2; ref_bw=$useful; }
        tr=$(awk -v a="$2" -v r="$ref_ms" 'BEGIN { printf "%.3f", (r > 0 ? a / r : 0) }')
        br=$(awk -v a="$useful" -v r="$ref_bw" 'BEGIN { printf "%.2f", (r > 0 ? a / r : 0) }')
        printf '%-6s %-10s %12s %14s %12s %10s %10s %12s %12s\n' "$paths" "$layout" "$2" \
            "$useful" "$4" "$3" "$5" "$tr" "$br"
    done
done
