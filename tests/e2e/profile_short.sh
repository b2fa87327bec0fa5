#!/bin/sh
# profile_short.sh ENGINE WORKDIR - a restore profile of a prompt shorter than one prefill chunk: the
# compute fit times forwards of at most the prompt's length (a longer one would start before the
# prompt) and the profile is written.
engine=$1
work=$2
fail() {
    echo "profile_short: $*" >&2
    exit 1
}
rm -rf "$work" && mkdir -p "$work" || exit 2
printf 'version: 1\nchunk_tokens: 256\ntiers:\n  - name: dram\n    type: dram\n    capacity: 256MiB\n' \
    >"$work/plain.yaml"
"$engine" --config "$work/plain.yaml" --profile "$work/profile.yaml" --profile-tokens 1024 \
    --prefill-chunk 2048 >"$work/out.txt" 2>&1 || {
    cat "$work/out.txt" >&2
    fail "the profile run failed"
}
grep -q 'per_token_us' "$work/profile.yaml" || fail "the profile has no per_token_us"
echo "profile_short: a 1024-token profile with 2048-token prefill chunks written"
