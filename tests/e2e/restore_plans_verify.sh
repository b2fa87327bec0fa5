#!/bin/sh
# restore_plans_verify.sh - the mini engine executing the connector's restore plans: profile this
# build's compute (fast, or slowed by a sanitizer), pace a DRAM tier so that loading a chunk costs
# about what recomputing it does (SPEED x faster), configure `restore: cacheflow` with that profile, and
# run --restore-plans --plan-modes MODES --verify: every restored prompt must match a full recompute bit
# for bit, and the engine must have followed plans of the modes asked for (token: recompute the front
# of a range while the back loads; layer: the lower layers while the upper ones load; stage: each
# pipeline stage its lowest layers from its stored boundary activations, on a thread per stage, while
# the other layers load; pass --stages N among the flags).
#
# usage: restore_plans_verify.sh MINI_RESEARCH WORKDIR SPEED token|layer|both|stage [workload flags...]
# HOST_COPIES=deferred in the environment makes the host device defer its copies like a GPU; TIER=ssd
# restores from an ssd tier in WORKDIR paced by sim_bandwidth instead (partial reads through its
# get_range) rather than the paced dram tier; ASYNC=always configures `loads: {async: always}`: the
# planned loads run between steps and each request of a --batch group goes on as soon as its own
# loads have landed and its own part is recomputed (per-request completion).
set -eu
engine=$1
work=$2
speed=$3
modes=$4
shift 4

rm -rf "$work"
mkdir -p "$work"
copies=${HOST_COPIES:-immediate}
printf 'version: 1\nchunk_tokens: 256\ndevice:\n  host_copies: %s\ntiers:\n  - {name: dram, type: dram, capacity: 1GiB}\n' \
    "$copies" >"$work/plain.yaml"
fail() {
    echo "restore_plans_verify: $*" >&2
    exit 1
}

# the profile measures the model the flags describe (workload flags do not matter to it)
"$engine" --config "$work/plain.yaml" --profile "$work/measured.yaml" --profile-tokens 1024 "$@" ||
    fail "profiling failed"
per_token=$(sed -n 's/^  per_token_us: //p' "$work/measured.yaml")
chunk_bytes=$(sed -n 's/^# \([0-9]*\) bytes (.*/\1/p' "$work/measured.yaml")
[ -n "$per_token" ] && [ -n "$chunk_bytes" ] || fail "the profile lacks per_token_us or the chunk size"
# bytes per second at which one chunk loads in the time 256 tokens take to recompute, times SPEED
bandwidth=$(awk -v b="$chunk_bytes" -v t="$per_token" -v s="$speed" 'BEGIN { printf "%d", s * b / (256 * t * 1e-6) }')
mb_s=$(awk -v b="$bandwidth" 'BEGIN { printf "%.6f", b / 1e6 }')
echo "restore_plans_verify: ${per_token} us per token, chunks of $chunk_bytes bytes: tier paced at $bandwidth B/s"
{
    sed -n '/^compute:/,/^tiers:/p' "$work/measured.yaml" | grep -v '^tiers:'
    printf 'tiers:\n  - name: %s\n    latency_us: 0\n    bandwidth_mb_s: %s\n' "${TIER:-dram}" "$mb_s"
} >"$work/profile.yaml"
printf 'version: 1\nchunk_tokens: 256\ndevice:\n  host_copies: %s\nrestore:\n  scheduler: cacheflow\n  profile: profile.yaml\n' \
    "$copies" >"$work/cacheflow.yaml"
[ -z "${ASYNC:-}" ] || printf 'loads:\n  async: %s\n' "$ASYNC" >>"$work/cacheflow.yaml"
if [ "${TIER:-dram}" = ssd ]; then
    mkdir -p "$work/ssd"
    printf 'tiers:\n  - name: ssd\n    type: ssd\n    capacity: 256MiB\n    paths: [%s]\n    options:\n      stripe_bytes: 64KiB\n      sim_bandwidth: %s\n' \
        "$work/ssd" "$bandwidth" >>"$work/cacheflow.yaml"
else
    printf 'tiers:\n  - name: dram\n    type: dram\n    capacity: 1GiB\n    options:\n      read_bandwidth: %s\n' \
        "$bandwidth" >>"$work/cacheflow.yaml"
fi
out="$work/run.out"
if ! "$engine" --verify --quiet --restore-plans --plan-modes "$modes" --config "$work/cacheflow.yaml" "$@" \
    >"$out" 2>"$work/run.err"; then
    cat "$out" "$work/run.err" >&2
    fail "the mini engine failed"
fi
cat "$out"
grep -q '^verify: .* 0 mismatches$' "$out" || fail "restored KV differs from a full recompute"
token=$(sed -n 's/.*restore plans followed: token \([0-9]*\), .*/\1/p' "$out")
layer=$(sed -n 's/.*restore plans followed: token [0-9]*, layer \([0-9]*\), .*/\1/p' "$out")
stage=$(sed -n 's/.*restore plans followed: token [0-9]*, layer [0-9]*, stage \([0-9]*\), .*/\1/p' "$out")
[ -n "$token" ] && [ -n "$layer" ] && [ -n "$stage" ] || fail "the summary reports no restore plans"
case $modes in
token) [ "$token" -gt 0 ] && [ $((layer + stage)) -eq 0 ] || fail "token plans asked for, followed token $token, layer $layer, stage $stage" ;;
layer) [ "$layer" -gt 0 ] && [ $((token + stage)) -eq 0 ] || fail "layer plans asked for, followed token $token, layer $layer, stage $stage" ;;
stage)
    [ "$stage" -gt 0 ] && [ $((token + layer)) -eq 0 ] || fail "stage plans asked for, followed token $token, layer $layer, stage $stage"
    bnd=$(sed -n 's/.*stages restored from their boundary \([0-9]*\).*/\1/p' "$out")
    [ -n "$bnd" ] && [ "$bnd" -gt 0 ] || fail "no stage past the first restored from its boundary (${bnd:-none})"
    ;;
*) [ $((token + layer)) -gt 0 ] || fail "no token or layer plan was followed" ;;
esac
if [ -n "${ASYNC:-}" ]; then
    async=$(sed -n 's/^connector:.* async loads \([0-9]*\),.*/\1/p' "$out")
    [ -n "$async" ] && [ "$async" -gt 0 ] || fail "loads.async $ASYNC, but no load ran asynchronously"
    echo "restore_plans_verify: $async planned loads ran between steps"
fi
echo "restore_plans_verify: $token token, $layer layer and $stage stage plans followed, KV exact"
