#!/bin/sh
# owner-ssd.sh - what serving an ssd tier through its owner, a kvstrata-node on this host, costs a
# restore against reading the same tier in the engine's own process (docs/vllm.md, "Tiers in vLLM's
# processes"). One run of this script on this machine, the mini engine's workload twice:
#   direct  the engine's connector opens the ssd tier itself (the reference: nothing in between)
#   owner   the connector's only tier is a remote tier on a kvstrata-node whose only tier is the same
#           ssd tier (same capacity and options, a folder of its own)
# each with a fresh ssd folder and the same sessions and turns, and prints per run the connector's
# load bandwidth and the mean TTFT of turns after the first, and owner / direct for each: one JSON
# object, then a human line. Extra arguments go to the mini engine (default --sessions 4 --turns 3).
#
# usage: bench/owner-ssd.sh [mini engine flags...]
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
engine=$here/build/bin/kvs-mini-engine
node=$here/build/bin/kvstrata-node
for b in "$engine" "$node"; do
    [ -x "$b" ] || { echo "owner-ssd: $b is not built (make build; the node needs UCX)" >&2; exit 1; }
done
[ $# -gt 0 ] || set -- --sessions 4 --turns 3
tmp=$(mktemp -d /tmp/kvs-owner-ssd.XXXXXX)
node_pid=
cleanup() {
    [ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null && wait "$node_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
mkdir "$tmp/direct" "$tmp/node"
head -c 32 /dev/urandom > "$tmp/node.key"
chmod 600 "$tmp/node.key"
"$node" --psk-file "$tmp/node.key" --tenant-key bench --out "$tmp/bench.key"
ssd_tier() {
    printf '  - name: nvme\n    type: ssd\n    capacity: 1GiB\n    paths: [%s]\n' "$1"
}
{ printf 'version: 1\nchunk_tokens: 256\ntiers:\n'; ssd_tier "$tmp/direct"; } > "$tmp/direct.yaml"
{ printf 'version: 1\nlog_level: error\ntiers:\n'; ssd_tier "$tmp/node"; } > "$tmp/node.yaml"
mkfifo "$tmp/ready"
"$node" --config "$tmp/node.yaml" --psk-file "$tmp/node.key" --listen 127.0.0.1:0 \
    --max-object-bytes 1MiB \
    > "$tmp/ready" &
node_pid=$!
read -r line < "$tmp/ready"
case $line in
    "kvstrata-node ready listen="*) ;;
    *) echo "owner-ssd: kvstrata-node did not start: $line" >&2; exit 1 ;;
esac
addr=${line#*listen=}
addr=${addr%% *}
printf 'version: 1\nchunk_tokens: 256\ntiers:\n  - name: nvme\n    type: remote\n    nodes: [%s]\n    options:\n      psk_file: %s\n      tenant: bench\n' \
    "$addr" "$tmp/bench.key" > "$tmp/owner.yaml"

# run CONFIG [engine flags]: prints "GB/s TTFT_ms chunks" of the connector's run
run() {
    cfg=$1
    shift
    "$engine" --config "$cfg" "$@" > "$tmp/out" 2>&1 || { cat "$tmp/out" >&2; exit 1; }
    line=$(grep 'connector chunks loaded' "$tmp/out" | head -1)
    gbps=$(echo "$line" | sed -n 's/.*chunks loaded [0-9]* ([^,]*, \([0-9.]*\) GB\/s).*/\1/p')
    chunks=$(echo "$line" | sed -n 's/.*chunks loaded \([0-9]*\) (.*/\1/p')
    ttft=$(sed -n 's/^turns after the first *[0-9]* *\([0-9.]*\) \/.*/\1/p' "$tmp/out")
    if [ -z "$gbps" ] || [ -z "$ttft" ] || [ "${chunks:-0}" -eq 0 ]; then
        echo "owner-ssd: no loads measured from $cfg:" >&2
        cat "$tmp/out" >&2
        exit 1
    fi
    echo "$gbps $ttft $chunks"
}
direct=$(run "$tmp/direct.yaml" "$@")
owner=$(run "$tmp/owner.yaml" "$@")
set -- $direct $owner
awk -v dg="$1" -v dt="$2" -v dc="$3" -v og="$4" -v ot="$5" -v oc="$6" 'BEGIN {
    printf "{\"bench\": \"owner_ssd\", \"direct_gbps\": %s, \"direct_ttft_ms\": %s, \"direct_chunks\": %s, \"owner_gbps\": %s, \"owner_ttft_ms\": %s, \"owner_chunks\": %s, \"gbps_owner_over_direct\": %.3f, \"ttft_owner_over_direct\": %.3f}\n", dg, dt, dc, og, ot, oc, og / dg, ot / dt
    printf "# ssd loads: %s GB/s in the engine'"'"'s process, %s GB/s through the owner (%.2fx); TTFT after the first turn %s ms vs %s ms (%.2fx)\n", dg, og, og / dg, dt, ot, ot / dt
}'
