#!/bin/sh
# lsc-context.sh - the layer stream cache of the mini engine (--lsc, docs/peer_gpu.md) against its
# own page budget, in one run of this script on this machine: a kvstrata-lend lending a pool about
# 3.26x the bytes of the engine's budget (UNITS units of one stream block each), then
# kvs-mini-research --lsc --verify with one buffer and with two. Each run prints, from the engine:
#   - the maximum context Eq. 4-5 predict for the budget and what was granted, and the one the engine
#     measured by growing a request until its allocator was full (ratio to the prediction, and to
#     the budget's own tokens: the context without lending);
#   - prefill time and decode time per token (TPOT) with the stream, against the same request with
#     all its KV local, measured in the same engine run (the reference);
#   - every step's logits bit for bit against that reference.
# Model: 8 layers of the mini engine's default shape (2 KV heads of 32, fp16); 256-token stream
# blocks (chunk_tokens), so one block of every layer is 512 KiB.
#
# usage: [LAYERS=8] [BUDGET=64] [UNITS=13] [DECODE=64] bench/lsc-context.sh [mini engine flags...]
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
engine=$here/build/bin/kvs-mini-research
lend=$here/build/bin/kvstrata-lend
[ -x "$engine" ] && [ -x "$lend" ] || { echo "lsc-context: build first (make)" >&2; exit 1; }
layers=${LAYERS:-8}
budget=${BUDGET:-64}
units=${UNITS:-13}
decode=${DECODE:-64}
work=$(mktemp -d /tmp/kvs-lsc-context-XXXXXX)
lender_pid=""
cleanup() {
    [ -n "$lender_pid" ] && kill "$lender_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

# a unit holds one stream block: layers x 256 tokens x 256 bytes, and the object's header (4 KiB)
unit_kib=$((layers * 64 + 4))
local_kib=$((budget * layers * 4))
echo "lsc-context: $layers layers, budget $budget pages ($local_kib KiB of KV), lender $units units of $unit_kib KiB ($((units * unit_kib)) KiB, $(echo "$units $unit_kib $local_kib" | awk '{printf "%.2f", $1 * $2 / $3}')x the budget)"
fail() {
    echo "lsc-context: $*" >&2
    exit 1
}
. "$here/scripts/lender.sh"
lender_config 64MiB
lender_start "$lend" "$units" "${unit_kib}KiB"
for buffers in 1 2; do
    echo "--- $buffers buffer(s)"
    "$engine" --lsc --verify --lsc-buffers "$buffers" --config "$work/config.yaml" --layers "$layers" \
        --block-budget "$budget" --decode-tokens "$decode" "$@"
done
