#!/bin/sh
# restore_plans_verify.sh - the mini engine executing the connector's token restore plans: profile a
# paced DRAM tier (a bandwidth-limited device), configure `restore: cacheflow` with that profile, and
# run --restore-plans --plan-modes MODES --verify: every restored prompt must match a full recompute bit
# for bit, and the engine must have followed plans of the modes asked for (token: recompute the front
# of a range while the back loads; layer: the lower layers while the upper ones load).
#
# usage: restore_plans_verify.sh MINI_ENGINE WORKDIR READ_BANDWIDTH token|layer|both [workload flags...]
# HOST_COPIES=deferred in the environment makes the host device defer its copies like a GPU.
set -eu
engine=$1
work=$2
bandwidth=$3
modes=$4
shift 4

rm -rf "$work"
mkdir -p "$work"
tiers="tiers:
  - name: dram
    type: dram
    capacity: 1GiB
    options:
      read_bandwidth: $bandwidth"
printf 'version: 1\nchunk_tokens: 256\ndevice:\n  host_copies: %s\n%s\n' "${HOST_COPIES:-immediate}" "$tiers" \
    >"$work/paced.yaml"
printf 'version: 1\nchunk_tokens: 256\ndevice:\n  host_copies: %s\nrestore:\n  scheduler: cacheflow\n  profile: profile.yaml\n%s\n' \
    "${HOST_COPIES:-immediate}" "$tiers" >"$work/cacheflow.yaml"

fail() {
    echo "restore_plans_verify: $*" >&2
    exit 1
}

"$engine" --config "$work/paced.yaml" --profile "$work/profile.yaml" --profile-tokens 2048 ||
    fail "profiling failed"
grep -q '^compute:' "$work/profile.yaml" || fail "the profile has no compute section"
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
[ -n "$token" ] && [ -n "$layer" ] || fail "the summary reports no restore plans"
case $modes in
token) [ "$token" -gt 0 ] && [ "$layer" -eq 0 ] || fail "token plans asked for, followed token $token, layer $layer" ;;
layer) [ "$layer" -gt 0 ] && [ "$token" -eq 0 ] || fail "layer plans asked for, followed token $token, layer $layer" ;;
*) [ $((token + layer)) -gt 0 ] || fail "no token or layer plan was followed" ;;
esac
echo "restore_plans_verify: $token token and $layer layer plans followed, KV exact"
