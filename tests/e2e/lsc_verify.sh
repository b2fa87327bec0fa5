#!/bin/sh
# lsc_verify.sh - the mini engine's layer stream cache (--lsc, docs/peer_gpu.md) over a peer_gpu
# tier lent by a kvstrata-lend started here: one request longer than the engine's page budget, the
# rest of its KV in lent stream blocks fetched a layer at a time, with one buffer and with two. Each
# run must be bit for bit against the same request with all its KV local (--verify), its measured
# maximum context within one stream block of SwiftCache's Eq. 4-5 (the engine fails otherwise), and
# longer than the budget alone holds.
#
# usage: lsc_verify.sh MINI_RESEARCH KVSTRATA_LEND WORKDIR UNITS UNIT_SIZE [kvs-mini-research flags...]
set -eu
engine=$1
lend=$2
work=$3
units=$4
unit_size=$5
shift 5

rm -rf "$work"
mkdir -p "$work"
lender_pid=""
cleanup() { [ -n "$lender_pid" ] && kill -9 "$lender_pid" 2>/dev/null || true; }
trap cleanup EXIT INT TERM
fail() {
    echo "lsc_verify: $*" >&2
    [ -f "$work/lend.out" ] && tail -n 20 "$work/lend.out" | sed 's|^|lend.out: |' >&2
    exit 1
}

. "$(dirname "$0")/../../scripts/lender.sh"
lender_config 16MiB
lender_start "$lend" "$units" "$unit_size"

for buffers in 1 2; do
    out="$work/buffers$buffers.out"
    if ! "$engine" --lsc --verify --lsc-buffers "$buffers" --config "$work/config.yaml" "$@" >"$out" 2>&1; then
        cat "$out" >&2
        fail "$buffers buffer(s): the mini engine failed"
    fi
    cat "$out"
    grep -q '^verify: .* 0 mismatches$' "$out" || fail "$buffers buffer(s): logits differ from all-local KV"
    measured=$(sed -n 's/^lsc: measured max context \([0-9]*\) tokens.*/\1/p' "$out")
    budget=$(sed -n "s/^lsc: measured .* the budget's \([0-9]*\) tokens$/\1/p" "$out")
    [ -n "$measured" ] && [ -n "$budget" ] || fail "$buffers buffer(s): no measured line"
    [ "$measured" -gt "$budget" ] || fail "$buffers buffer(s): $measured tokens, no more than the budget's $budget"
    fetched=$(sed -n 's/^lsc: \([0-9]*\) stream-block layers fetched.*/\1/p' "$out")
    [ "${fetched:-0}" -gt 0 ] || fail "$buffers buffer(s): nothing was fetched from the stream"
done
kill "$lender_pid"
lender_pid=""
