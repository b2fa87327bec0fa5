#!/bin/sh
# redis_verify.sh - the mini engine with a small DRAM tier over a redis tier (a redis-server this
# script starts on a unix socket in WORKDIR), run twice: chunks evicted from DRAM come back from Redis
# bit for bit, and the second process, whose DRAM starts empty, is served what the first one saved.
#
# usage: redis_verify.sh MINI_ENGINE WORKDIR [mini engine workload flags...]
# Exit 77 (skipped) when redis-server is not installed (scripts/install-deps.sh installs it).
set -eu
engine=$1
work=$2
shift 2
command -v redis-server >/dev/null || { echo "redis_verify: redis-server is not installed"; exit 77; }

rm -rf "$work"
mkdir -p "$work"
sock="$work/redis.sock"
redis-server --port 0 --unixsocket "$sock" --unixsocketperm 700 --save '' --appendonly no \
    --dir "$work" --logfile "$work/redis.log" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT INT TERM
i=0
until redis-cli -s "$sock" ping >/dev/null 2>&1; do
    i=$((i + 1))
    [ $i -lt 100 ] || { cat "$work/redis.log" >&2; echo "redis_verify: redis-server did not start" >&2; exit 1; }
    sleep 0.1
done

cat >"$work/config.yaml" <<YAML
version: 1
chunk_tokens: 256
log_level: info
tiers:
  - name: dram
    type: dram
    capacity: 512KiB      # two chunks of the mini model: sessions evict each other into Redis
  - name: redis
    type: redis
    nodes: [$sock]
    options:
      tenant: verify
YAML

tier_loads() {
    sed -n 's/^connector:.*loaded per tier \[\(.*\)\]$/\1/p' "$1" | tr -d ' ' | cut -d, -f"$2"
}

fail() {
    echo "redis_verify: $*" >&2
    exit 1
}

for run in 1 2; do
    out="$work/run$run.out"
    if ! "$engine" --verify --quiet --config "$work/config.yaml" "$@" >"$out" 2>"$work/run$run.err"; then
        cat "$out" "$work/run$run.err" >&2
        fail "run $run: the mini engine failed"
    fi
    cat "$out"
    grep -q '^verify: .* 0 mismatches$' "$out" || fail "run $run: restored KV differs from a full recompute"
    loads=$(tier_loads "$out" 2)
    [ -n "$loads" ] || fail "run $run: no per-tier load counts in the summary"
    [ "$loads" -gt 0 ] || fail "run $run: no chunk was loaded from the redis tier"
    echo "run $run: $loads chunks loaded from the redis tier"
done
keys=$(redis-cli -s "$sock" --scan --pattern 'kvs1:verify:*' | wc -l)
[ "$keys" -gt 0 ] || fail "no kvs1:verify:* key is in the server"
echo "redis_verify: $keys objects in the server under kvs1:verify:"
grep -q 'load errors 0' "$work/run2.out" || fail "run 2 reported load errors"
