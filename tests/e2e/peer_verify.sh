#!/bin/sh
# peer_verify.sh - the mini engine with a peer_gpu tier over a DRAM tier, the peer's memory lent by
# a kvstrata-lend started here (host device: a sealed memfd). Two runs, both bit for bit against a
# full recompute:
#   steady  the lender lends all its units; chunks must be loaded from the peer tier;
#   churn   the lender takes 3 of its 12 units back and lends them again every 20 ms while the engine
#           runs: loads whose unit went back miss or come from the DRAM tier the reclaims moved them
#           to, never from reclaimed memory (the summary prints how many came from each tier).
# After each run the lender's `check` must find its pattern in every unit it owns: the borrower never
# wrote into memory it had given back. Then a third run:
#   killed  the lender is killed (SIGKILL) while the engine runs and a new one started on its socket:
#           what the dead one lent turns into misses (recomputed), the tier takes the new lender's
#           units, and the run stays bit for bit.
#
# usage: peer_verify.sh MINI_ENGINE KVSTRATA_LEND WORKDIR [mini engine workload flags...]
# KVS_LEND_DEVICE=cuda:N puts the lender's region in that GPU's memory (CUDA IPC; docs/peer_gpu.md).
set -eu
engine=$1
lend=$2
work=$3
shift 3

rm -rf "$work"
mkdir -p "$work"
lender_pid=""
cleanup() {
    exec 3>&- 2>/dev/null || true
    [ -n "$lender_pid" ] && kill -9 "$lender_pid" 2>/dev/null || true
    [ -f "$work/lend2.pid" ] && kill -9 "$(cat "$work/lend2.pid")" 2>/dev/null || true
}
trap cleanup EXIT INT TERM

fail() {
    echo "peer_verify: $*" >&2
    [ -f "$work/lend.out" ] && tail -n 20 "$work/lend.out" | sed 's|^|lend.out: |' >&2
    exit 1
}

. "$(dirname "$0")/../../scripts/lender.sh"
lender_config 64MiB "      retry_ms: 20"
# the lender: 12 units of 1 MiB (five chunks of the mini model each), commands through a FIFO
# (opened for writing once it reads, so it never sees the end of its input meanwhile)
mkfifo "$work/lend.in"
exec 3<>"$work/lend.in"
lender_start "$lend" 12 1MiB "$work/lend.in"

tier_loads() {
    sed -n 's/^connector:.*loaded per tier \[\(.*\)\]$/\1/p' "$1" | tr -d ' ' | cut -d, -f"$2"
}

check_lender() {
    before=$(grep -c '^check ' "$work/lend.out" || true)
    echo check >&3
    i=0
    while [ "$(grep -c '^check ' "$work/lend.out" || true)" -le "$before" ]; do
        i=$((i + 1))
        [ $i -le 300 ] || fail "no answer to check"
        sleep 0.1
    done
    grep '^check ' "$work/lend.out" | tail -n 1 | grep -q '^check ok$' ||
        fail "$1: the lender found a unit it owns overwritten"
}

for run in steady churn; do
    out="$work/$run.out"
    churner=""
    if [ "$run" = churn ]; then
        (while :; do echo "reclaim 3" >&3; sleep 0.02; echo "lend 3" >&3; sleep 0.02; done) &
        churner=$!
    fi
    if ! "$engine" --verify --quiet --config "$work/config.yaml" "$@" >"$out" 2>"$work/$run.err"; then
        [ -n "$churner" ] && kill "$churner"
        cat "$out" "$work/$run.err" >&2
        fail "$run: the mini engine failed"
    fi
    if [ -n "$churner" ]; then
        kill "$churner"
        wait "$churner" 2>/dev/null || true
    fi
    cat "$out"
    grep -q '^verify: .* 0 mismatches$' "$out" || fail "$run: restored KV differs from a full recompute"
    peer=$(tier_loads "$out" 1)
    dram=$(tier_loads "$out" 2)
    [ -n "$peer" ] || fail "$run: no per-tier load counts in the summary"
    released=$(grep -c '^released ' "$work/lend.out" || true)
    echo "$run: $peer chunks loaded from the peer tier, $dram from dram; $released units released so far"
    [ "$run" != steady ] || [ "$peer" -gt 0 ] || fail "steady: no chunk was loaded from the peer tier"
    # churn: the first chunks saved sit in the lowest units, the ones a reclaim takes first, so with
    # a small workload they may all come from dram; something must be restored all the same
    [ "$run" != churn ] || [ $((peer + dram)) -gt 0 ] || fail "churn: nothing was restored"
    [ "$run" != churn ] || [ "$released" -gt 12 ] || fail "churn: the lender took back only $released units"
    check_lender "$run"
done
echo quit >&3
wait "$lender_pid" || fail "the lender exited with $?"
lender_pid=""

# killed: a lender (12 units) killed 0.3 s into the run, a second one started on the same socket
lender_start "$lend" 12 1MiB
first=$lender_pid
(sleep 0.3; kill -9 "$first"; mv "$work/lend.out" "$work/lend-killed.out"
 "$lend" --socket "$work/lend.sock" --units 12 --unit-size 1MiB --device "${KVS_LEND_DEVICE:-host}" \
     </dev/null >"$work/lend2.out" 2>&1 &
 echo $! >"$work/lend2.pid"; wait) &
killer=$!
out="$work/killed.out"
if ! "$engine" --verify --quiet --config "$work/config.yaml" "$@" >"$out" 2>"$work/killed.err"; then
    cat "$out" "$work/killed.err" >&2
    fail "killed: the mini engine failed"
fi
[ -f "$work/lend2.pid" ] || sleep 1
lender_pid=$(cat "$work/lend2.pid" 2>/dev/null || true)
cat "$out"
grep -q '^verify: .* 0 mismatches$' "$out" || fail "killed: restored KV differs from a full recompute"
grep -q 'lost the lender' "$work/killed.err" || fail "killed: the tier never saw its lender go"
echo "killed: $(tier_loads "$out" 1) chunks loaded from the peer tier, $(tier_loads "$out" 2) from dram"
[ -n "$lender_pid" ] && kill "$lender_pid" 2>/dev/null
kill "$killer" 2>/dev/null || true
lender_pid=""
