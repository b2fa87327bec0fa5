#!/bin/sh
# restore_plans_verify.sh - the mini engine executing the connector's token restore plans: profile a
# paced DRAM tier (a bandwidth-limited device), configure `restore: cacheflow` with that profile, and
# run --restore-plans --verify: every restored prompt must match a full recompute bit for bit, and the
# engine must have recomputed the front of some restored ranges while the back loaded.
#
# usage: restore_plans_verify.sh MINI_ENGINE WORKDIR READ_BANDWIDTH [mini engine workload flags...]
# HOST_COPIES=deferred in the environment makes the host device defer its copies like a GPU.
set -eu
engine=$1
work=$2
bandwidth=$3
shift 3

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
if ! "$engine" --verify --quiet --restore-plans --config "$work/cacheflow.yaml" "$@" >"$out" 2>"$work/run.err"; then
    cat "$out" "$work/run.err" >&2
    fail "the mini engine failed"
fi
cat "$out"
grep -q '^verify: .* 0 mismatches$' "$out" || fail "restored KV differs from a full recompute"
token=$(sed -n 's/.*restore plans followed: token \([0-9]*\), .*/\1/p' "$out")
[ -n "$token" ] || fail "the summary reports no restore plans"
[ "$token" -gt 0 ] || fail "no token plan was followed (the tier or the profile left nothing to split)"
echo "restore_plans_verify: $token token plans followed, KV exact"
