#!/bin/sh
# remote_verify.sh - the mini engine with a small DRAM tier over a remote tier served by two
# kvstrata-node daemons on 127.0.0.1 (replicas 2), twice: chunks evicted from DRAM must come back
# from the nodes bit for bit, and a second engine process must be served what the first one left
# on the nodes. The nodes hold 64 objects of up to 1 MiB each (the DRAM tier has one slab per
# largest object). The daemons are started here and stopped (SIGTERM, exit 0 checked) at the end.
# With KVS_E2E_ENCRYPT=1 the nodes run with --encrypt on and the tier with encrypt: true (TLS on
# every control connection, every request and object on it).
#
# usage: remote_verify.sh MINI_ENGINE KVSTRATA_NODE WORKDIR [mini engine workload flags...]
set -eu
engine=$1
node=$2
work=$3
shift 3
encrypt_flag=off
encrypt_option=false
if [ "${KVS_E2E_ENCRYPT:-0}" = 1 ]; then
    encrypt_flag=on
    encrypt_option=true
fi

rm -rf "$work"
mkdir -p "$work"
pids=""
cleanup() {
    for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

fail() {
    echo "remote_verify: $*" >&2
    for f in "$work"/node*.out; do [ -f "$f" ] && sed "s|^|$(basename "$f"): |" "$f" >&2; done
    exit 1
}

head -c 48 /dev/urandom >"$work/psk"
chmod 600 "$work/psk"
# the engine holds its tenant's key only, derived from the nodes' master key
"$node" --psk-file "$work/psk" --tenant-key e2e --out "$work/e2e.key"
cat >"$work/node.yaml" <<'YAML'
version: 1
tiers:
  - name: dram
    type: dram
    capacity: 64MiB
YAML

# Start node $1; wait for its readiness line; print its port.
start_node() {
    "$node" --listen 127.0.0.1:0 --psk-file "$work/psk" --config "$work/node.yaml" --max-object-bytes 1MiB \
        --encrypt "$encrypt_flag" >"$work/node$1.out" 2>"$work/node$1.err" &
    echo $! >"$work/node$1.pid"
    i=0
    while ! grep -q '^kvstrata-node ready ' "$work/node$1.out" 2>/dev/null; do
        i=$((i + 1))
        [ $i -le 600 ] || fail "node $1 printed no readiness line in 60 s"
        kill -0 "$(cat "$work/node$1.pid")" 2>/dev/null || fail "node $1 exited before it was ready"
        sleep 0.1
    done
}

start_node 1
start_node 2
pids="$(cat "$work/node1.pid") $(cat "$work/node2.pid")"
port1=$(sed -n 's/^kvstrata-node ready listen=127.0.0.1:\([0-9]*\) .*/\1/p' "$work/node1.out")
port2=$(sed -n 's/^kvstrata-node ready listen=127.0.0.1:\([0-9]*\) .*/\1/p' "$work/node2.out")
[ -n "$port1" ] && [ -n "$port2" ] || fail "no port in a readiness line"

cat >"$work/config.yaml" <<YAML
version: 1
chunk_tokens: 256
tiers:
  - name: dram
    type: dram
    capacity: 512KiB      # two chunks of the mini model: sessions evict each other into the remote tier
  - name: far
    type: remote
    nodes: [127.0.0.1:$port1, 127.0.0.1:$port2]
    options:
      psk_file: e2e.key   # relative to this file
      tenant: e2e
      replicas: 2
      timeout_ms: 5000
      encrypt: $encrypt_option
YAML

for run in 1 2; do
    out="$work/run$run.out"
    if ! "$engine" --verify --quiet --config "$work/config.yaml" "$@" >"$out" 2>"$work/run$run.err"; then
        cat "$out" "$work/run$run.err" >&2
        fail "run $run: the mini engine failed"
    fi
    cat "$out"
    grep -q '^verify: .* 0 mismatches$' "$out" || fail "run $run: restored KV differs from a full recompute"
    grep -q 'load errors 0' "$out" || fail "run $run: load errors"
    far=$(sed -n 's/^connector:.*loaded per tier \[\(.*\)\]$/\1/p' "$out" | tr -d ' ' | cut -d, -f2)
    [ -n "$far" ] && [ "$far" -gt 0 ] || fail "run $run: no chunk was loaded from the remote tier"
    echo "run $run: $far chunks loaded from the remote tier"
done

for n in 1 2; do
    pid=$(cat "$work/node$n.pid")
    kill -TERM "$pid"
    wait "$pid" || fail "node $n did not exit 0 on SIGTERM"
    grep -q '^kvstrata-node stopped on SIGTERM .* puts=[1-9]' "$work/node$n.out" || fail "node $n stored nothing"
done
pids=""
