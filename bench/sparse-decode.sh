#!/bin/sh
# sparse-decode.sh - the figures of docs/sparse.md, in one run on this machine:
# kvs-mini-research --sparse-decode --verify over the trained model (32 decode steps, top-64), with
#   - a DRAM tier at 2048 and 8192 tokens (then again with --sparse-adapt 0.02, and 8192 a second
#     time: the noise between identical runs);
#   - a two-path SSD tier (4KiB stripes): rows read one at a time (a first run writes the chunks,
#     the second is measured), Swarm's clusters and positional clusters (a first run writes them,
#     the second finds them), the medoid index, and the hot-cluster cache under Eq. 6 and LRU;
#   - then bench/sparse-swarm.sh (2, 4 and 8 paced paths).
# Each engine run prints its references from the same run: full attention with every row in
# memory, and full-KV offload (every step restoring the stored prompt through the load hooks).
#
# usage: bench/sparse-decode.sh
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
engine=$here/build/bin/kvs-mini-research
[ -x "$engine" ] || { echo "sparse-decode: build first (make)" >&2; exit 1; }
work=$(mktemp -d /tmp/kvs-sparse-decode-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/d0" "$work/d1"
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
    capacity: 256MiB
    paths: [d0, d1]
    options:
      stripe_bytes: 4KiB
YAML
echo "sparse-decode: $(date -u +%Y-%m-%d) on $(nproc) cores, code $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)"
# run NAME FLAGS...: one engine run; fails the script when --verify fails
run() {
    name=$1
    shift
    echo "== $name: $*"
    out=$("$engine" --sparse-decode --weights default --decode-tokens 32 --topk 64 --verify "$@" 2>&1) || {
        echo "$out" >&2
        echo "sparse-decode: $name failed" >&2
        exit 1
    }
    echo "$out" | grep -v "trained weights"
}
dram=$work/dram.yaml
ssd=$work/ssd.yaml
run dram-2048 --sparse-context 2048 --config "$dram"
run dram-8192 --sparse-context 8192 --config "$dram"
run ssd-rows-2048-first --sparse-context 2048 --config "$ssd"
run ssd-rows-2048 --sparse-context 2048 --config "$ssd"
run ssd-rows-8192-first --sparse-context 8192 --config "$ssd"
run ssd-rows-8192 --sparse-context 8192 --config "$ssd"
for layout in swarm positions; do
    run "$layout-2048-first" --sparse-context 2048 --config "$ssd" --sparse-layout "$layout" --profile-steps 8
    run "$layout-2048" --sparse-context 2048 --config "$ssd" --sparse-layout "$layout" --profile-steps 8
done
run medoids-2048 --sparse-context 2048 --config "$ssd" --sparse-layout swarm --profile-steps 8 --sparse-index medoids
for policy in score lru; do
    for rows in 1024 4096; do
        run "cache-$policy-$rows" --sparse-context 2048 --config "$ssd" --sparse-layout swarm \
            --profile-steps 8 --cluster-cache "$rows" --cluster-policy "$policy"
    done
done
run static-2048 --sparse-context 2048 --config "$dram"
run adapt-2048 --sparse-context 2048 --config "$dram" --sparse-adapt 0.02
run static-8192 --sparse-context 8192 --config "$dram"
run adapt-8192 --sparse-context 8192 --config "$dram" --sparse-adapt 0.02
"$here/bench/sparse-swarm.sh"
