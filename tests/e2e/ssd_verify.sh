#!/bin/sh
# ssd_verify.sh - the mini engine with a small DRAM tier over a two-path SSD tier, twice over the same
# directories: objects evicted from DRAM must come back from the SSD tier bit for bit, and after the
# restart the second run must find objects the first one wrote and serve them exactly.
#
# usage: ssd_verify.sh MINI_ENGINE WORKDIR [mini engine workload flags...]
# HOST_COPIES=deferred in the environment makes the host device defer its copies like a GPU.
set -eu
engine=$1
work=$2
shift 2

rm -rf "$work"
mkdir -p "$work/ssd0" "$work/ssd1"
cat >"$work/config.yaml" <<YAML
version: 1
chunk_tokens: 256
log_level: info
device:
  host_copies: ${HOST_COPIES:-immediate}
tiers:
  - name: dram
    type: dram
    capacity: 512KiB      # two chunks of the mini model: sessions evict each other into the SSD tier
  - name: nvme
    type: ssd
    capacity: 32MiB
    paths: [ssd0, ssd1]   # relative to this file
    options:
      stripe_bytes: 64KiB
YAML

# The number in "loaded per tier [a, b]" for tier $2 of the connector run's summary in file $1.
tier_loads() {
    sed -n 's/^connector:.*loaded per tier \[\(.*\)\]$/\1/p' "$1" | tr -d ' ' | cut -d, -f"$2"
}

fail() {
    echo "ssd_verify: $*" >&2
    exit 1
}

for run in 1 2; do
    out="$work/run$run.out"
    err="$work/run$run.err"
    if ! "$engine" --verify --quiet --config "$work/config.yaml" "$@" >"$out" 2>"$err"; then
        cat "$out" "$err" >&2
        fail "run $run: the mini engine failed"
    fi
    cat "$out"
    grep -q '^verify: .* 0 mismatches$' "$out" || fail "run $run: restored KV differs from a full recompute"
    ssd=$(tier_loads "$out" 2)
    [ -n "$ssd" ] || fail "run $run: no per-tier load counts in the summary"
    [ "$ssd" -gt 0 ] || fail "run $run: no chunk was loaded from the ssd tier (loads per tier: $(tier_loads "$out" 1), $ssd)"
    recovered=$(sed -n 's/.* \([0-9][0-9]*\) objects recovered from .*/\1/p' "$err" | head -n 1)
    [ -n "$recovered" ] || fail "run $run: the ssd tier did not log its open line"
    echo "run $run: $ssd chunks loaded from the ssd tier, $recovered objects recovered at open"
    if [ "$run" = 1 ] && [ "$recovered" != 0 ]; then fail "run 1 started from empty directories but recovered $recovered"; fi
    if [ "$run" = 2 ] && [ "$recovered" = 0 ]; then fail "run 2 recovered nothing the first run wrote"; fi
done
grep -q 'load errors 0' "$work/run2.out" || fail "run 2 reported load errors"
