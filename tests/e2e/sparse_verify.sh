#!/bin/sh
# sparse_verify.sh - kvs-mini-research --sparse-decode --verify over the trained weights, with the
# prompt's chunks in a DRAM tier, then in a two-path SSD tier alone (rows read with get_range from
# the files), then Swarm's clusters and the positional comparator in an SSD tier over two runs (the
# second, after a restart, finds the clusters): each run's logits must equal exact attention over the
# rows the connector selected, from the prefill's own KV, bit for bit, with no row failing its hash.
#
# usage: sparse_verify.sh MINI_RESEARCH WORKDIR [kvs-mini-research flags...]
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
# Swarm's clusters in the SSD tier (stripes of 4KiB over the two paths), then the positional
# comparator: the first run profiles, clusters and writes them; the second, a new process over the
# same directories, must find every layer's clusters and read rows out of them from its first step.
cat >"$work/swarm.yaml" <<YAML
version: 1
chunk_tokens: 256
log_level: warn
tiers:
  - name: nvme
    type: ssd
    capacity: 256MiB
    paths: [swarm0, swarm1]
    options:
      stripe_bytes: 4KiB
YAML
mkdir -p "$work/swarm0" "$work/swarm1"
for layout in swarm positions; do
    for run in 1 2; do
        out="$work/$layout$run.out"
        if ! "$engine" --sparse-decode --verify --config "$work/swarm.yaml" --sparse-layout "$layout" \
            --profile-steps 8 "$@" >"$out" 2>&1; then
            cat "$out" >&2
            fail "$layout run $run: the run failed"
        fi
        cat "$out"
        grep -q '^verify: .* bit for bit: 0 mismatches$' "$out" || fail "$layout run $run: logits differ"
        grep -q 'rows read (0 failed)' "$out" || fail "$layout run $run: rows failed their check"
        layers=$(sed -n "s/^sparse: $layout: \([0-9]*\) layers' clusters found, \([0-9]*\) written.*/\1 \2/p" "$out")
        case "$run:$layers" in
            "1:0 "[1-9]*) ;;                # profiled, clustered and written
            "2:"[1-9]*" 0") ;;              # found after the restart, nothing written again
            *) fail "$layout run $run: clusters found and written: '$layers'" ;;
        esac
        if [ "$run" = 2 ] && ! grep -q "^sparse: $layout: .* [1-9][0-9]* of [0-9]* rows read came out of" "$out"; then
            fail "$layout run 2: no row came out of a cluster"
        fi
    done
done
echo "sparse_verify: ok"
