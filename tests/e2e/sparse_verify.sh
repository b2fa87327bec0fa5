#!/bin/sh
# sparse_verify.sh - kvs-mini-engine --sparse-decode --verify over the trained weights, with the
# prompt's chunks in a DRAM tier, then in a two-path SSD tier alone (rows read with get_range from
# the files): each run's logits must equal exact attention over the rows the connector selected,
# from the prefill's own KV, bit for bit, with no row failing its hash and some rows read.
#
# usage: sparse_verify.sh MINI_ENGINE WORKDIR [mini engine flags...]
set -eu
engine=$1
work=$2
shift 2

rm -rf "$work"
mkdir -p "$work/ssd0" "$work/ssd1"
cat >"$work/dram.yaml" <<YAML
version: 1
chunk_tokens: 256
log_level: warn
tiers:
  - name: dram
    type: dram
    capacity: 64MiB
YAML
cat >"$work/ssd.yaml" <<YAML
version: 1
chunk_tokens: 256
log_level: warn
tiers:
  - name: nvme
    type: ssd
    capacity: 64MiB
    paths: [ssd0, ssd1]   # relative to this file
    options:
      stripe_bytes: 64KiB
YAML

fail() {
    echo "sparse_verify: $*" >&2
    exit 1
}

for tier in dram ssd; do
    out="$work/$tier.out"
    if ! "$engine" --sparse-decode --verify --config "$work/$tier.yaml" "$@" >"$out" 2>&1; then
        cat "$out" >&2
        fail "$tier: the run failed"
    fi
    cat "$out"
    grep -q '^verify: .* bit for bit: 0 mismatches$' "$out" || fail "$tier: logits differ"
    grep -q 'rows read (0 failed)' "$out" || fail "$tier: rows failed their check"
    grep -q 'head hits' "$out" || fail "$tier: no sparse summary"
    if grep -q ' 0 rows read' "$out"; then fail "$tier: nothing was read from the tiers"; fi
done
echo "sparse_verify: ok"
