#!/bin/sh
# netns_remote.sh - the remote tier across "hosts": three network namespaces (one engine, two nodes)
# with a veth each to a bridge in a fourth, addresses 10.77.0.0/24. The namespaces carry this
# script's PID in their names and are deleted by the EXIT trap, with every process in them.
#   1. the mini engine (DRAM 512KiB over `type: remote`, replicas 2) --verify against two
#      kvstrata-node daemons: exact restores, chunks loaded from the remote tier, bytes on the veths;
#   2. a second engine process, and node 1 killed with SIGKILL while it loads from the nodes: still
#      no mismatch (load errors allowed), done within `timeout 120`;
#   3. node 1 restarted on the same address and port, a third engine process: no mismatch, chunks
#      from the remote tier, and the restarted node served lookups or gets.
# The daemons are stopped with SIGTERM at the end (exit 0 checked). Exit 77 when namespaces cannot
# be made (not root, or `ip netns add` refused).
#
# usage: netns_remote.sh MINI_ENGINE KVSTRATA_NODE WORKDIR [mini engine workload flags...]
set -eu
engine=$1
node=$2
work=$3
shift 3

skip() {
    echo "netns_remote: SKIP: $*"
    exit 77
}
[ "$(id -u)" -eq 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null 2>&1 || skip "no ip (iproute2)"

tag=$$
ns_br=kvs-br-$tag
ns_eng=kvs-eng-$tag
ns_n1=kvs-n1-$tag
ns_n2=kvs-n2-$tag
made=""
pids=""
started=$(date +%s)

rm -rf "$work"
mkdir -p "$work"

cleanup() {
    rc=$?
    trap - EXIT INT TERM
    for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
    for ns in $made; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    done
    for ns in $made; do ip netns del "$ns" 2>/dev/null || echo "netns_remote: could not delete $ns" >&2; done
    exit $rc
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
    echo "netns_remote: FAIL: $*" >&2
    for f in "$work"/node*.out "$work"/node*.err; do
        [ -s "$f" ] && sed "s|^|$(basename "$f"): |" "$f" >&2
    done
    exit 1
}

# Namespaces: the bridge "switch" and three hosts, each with lo up.
if ! ip netns add "$ns_br" 2>"$work/netns.err"; then
    grep -q 'File exists' "$work/netns.err" && fail "namespace $ns_br exists already (left by a killed run?)"
    skip "ip netns add is not permitted here: $(cat "$work/netns.err")"
fi
made=$ns_br
for ns in "$ns_eng" "$ns_n1" "$ns_n2"; do
    ip netns add "$ns" || fail "ip netns add $ns"
    made="$made $ns"
done
ip -n "$ns_br" link add br0 type bridge || fail "no bridge in $ns_br"
ip -n "$ns_br" link set br0 up
ip -n "$ns_br" link set lo up
# link_host NAMESPACE ADDRESS PORT: a veth from the host's eth0 to bridge port PORT.
link_host() {
    ip -n "$ns_br" link add "$3" type veth peer name eth0 netns "$1" || fail "veth pair $3 to $1"
    ip -n "$ns_br" link set "$3" master br0
    ip -n "$ns_br" link set "$3" up
    ip -n "$1" addr add "$2/24" dev eth0
    ip -n "$1" link set eth0 up
    ip -n "$1" link set lo up
}
addr1=10.77.0.11
addr2=10.77.0.12
link_host "$ns_eng" 10.77.0.1 p-eng
link_host "$ns_n1" "$addr1" p-n1
link_host "$ns_n2" "$addr2" p-n2

head -c 48 /dev/urandom >"$work/psk"
chmod 600 "$work/psk"
# the engine holds its tenant's key only, derived from the nodes' master key
"$node" --psk-file "$work/psk" --tenant-key netns --out "$work/netns.key"
cat >"$work/node.yaml" <<'YAML'
version: 1
tiers:
  - name: dram
    type: dram
    capacity: 64MiB
YAML

# start_node N NAMESPACE ADDRESS PORT: start node N, wait for its readiness line; 1 if it exited first.
# The files of an earlier node N go first: the background job truncates them only once it runs, and
# until then the loop below would find the earlier node's readiness line (and node_port, a moment
# later, an empty file: "node 1 did not come back" under load in an asan CI run).
start_node() {
    rm -f "$work/node$1.out" "$work/node$1.err"
    ip netns exec "$2" "$node" --listen "$3:$4" --psk-file "$work/psk" --config "$work/node.yaml" \
        --max-object-bytes 1MiB >"$work/node$1.out" 2>"$work/node$1.err" &
    echo $! >"$work/node$1.pid"
    pids="$pids $!"
    i=0
    while ! grep -q '^kvstrata-node ready ' "$work/node$1.out" 2>/dev/null; do
        i=$((i + 1))
        [ $i -le 600 ] || fail "node $1 printed no readiness line in 60 s"
        kill -0 "$(cat "$work/node$1.pid")" 2>/dev/null || return 1
        sleep 0.1
    done
}
node_port() {
    sed -n "s/^kvstrata-node ready listen=$2:\([0-9]*\) .*/\1/p" "$work/node$1.out"
}
# stop_node N: SIGTERM, exit 0, the stats line into $work/node$N.stats.
stop_node() {
    pid=$(cat "$work/node$1.pid")
    kill -TERM "$pid"
    wait "$pid" || fail "node $1 did not exit 0 on SIGTERM"
    grep '^kvstrata-node stopped on SIGTERM ' "$work/node$1.out" >"$work/node$1.stats" ||
        fail "node $1 printed no stats line"
}
counter() { # counter NAME "stats line"
    echo "$2" | sed -n "s/.* $1=\([0-9]*\).*/\1/p"
}
# link_bytes NAMESPACE rx|tx: bytes through the host's eth0 so far.
link_bytes() { ip netns exec "$1" cat "/sys/class/net/eth0/statistics/$2_bytes"; }

start_node 1 "$ns_n1" "$addr1" 0 || fail "node 1 exited before it was ready"
start_node 2 "$ns_n2" "$addr2" 0 || fail "node 2 exited before it was ready"
port1=$(node_port 1 "$addr1")
port2=$(node_port 2 "$addr2")
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
    nodes: [$addr1:$port1, $addr2:$port2]
    options:
      psk_file: $work/netns.key
      tenant: netns
      replicas: 2
      timeout_ms: 2000
YAML

# check_run N: the engine's verdict and how many chunks the remote tier served (printed).
check_run() {
    out="$work/run$1.out"
    grep -q '^verify: .* 0 mismatches$' "$out" || fail "run $1: restored KV differs from a full recompute"
    far=$(sed -n 's/^connector:.*loaded per tier \[\(.*\)\]$/\1/p' "$out" | tr -d ' ' | cut -d, -f2)
    [ -n "$far" ] && [ "$far" -gt 0 ] || fail "run $1: no chunk was loaded from the remote tier"
}
engine_failed() {
    cat "$work/run$1.out" "$work/run$1.err" >&2
    fail "run $1: the mini engine failed ($2)"
}

# 1. Two nodes, one engine: exact restores from the remote tier, over the veths.
t0=$(date +%s)
ip netns exec "$ns_eng" timeout 120 "$engine" --verify --quiet --config "$work/config.yaml" "$@" \
    >"$work/run1.out" 2>"$work/run1.err" || engine_failed 1 "exit $?"
check_run 1
grep -q 'load errors 0' "$work/run1.out" || fail "run 1: load errors with both nodes up"
rx1=$(link_bytes "$ns_n1" rx)
rx2=$(link_bytes "$ns_n2" rx)
[ "$rx1" -gt 200000 ] && [ "$rx2" -gt 200000 ] ||
    fail "run 1: the nodes received $rx1 and $rx2 bytes on their veths; the chunks did not cross the bridge"
echo "case 1: $far chunks from the remote tier, nodes received $rx1 + $rx2 bytes on their veths ($(($(date +%s) - t0)) s)"

# 2. A second engine process loads what the first left; node 1 gets SIGKILL once the first turn with
# a connector hit is done, while the engine goes on to the next turns' gets.
t0=$(date +%s)
ip netns exec "$ns_eng" timeout 120 "$engine" --verify --config "$work/config.yaml" "$@" \
    >"$work/run2.out" 2>"$work/run2.err" &
epid=$!
pids="$pids $epid"
i=0
while ! grep -q '^\[connector *\].* connector *[1-9]' "$work/run2.out" 2>/dev/null; do
    i=$((i + 1))
    kill -0 "$epid" 2>/dev/null || break
    [ $i -le 3000 ] || fail "run 2: no turn with a connector hit in 60 s"
    sleep 0.02
done
kill -9 "$(cat "$work/node1.pid")"
grep -q '^connector:' "$work/run2.out" && fail "run 2: the engine finished before node 1 was killed; make the workload longer"
kill -0 "$epid" 2>/dev/null || fail "run 2: the engine exited before node 1 was killed"
turns_before=$(grep -c '^\[connector' "$work/run2.out" || true)
wait "$(cat "$work/node1.pid")" 2>/dev/null || true
rc=0
wait "$epid" || rc=$?
[ $rc -eq 0 ] || engine_failed 2 "exit $rc$([ $rc -eq 124 ] && echo ': not done in 120 s')"
turns_all=$(grep -c '^\[connector' "$work/run2.out" || true)
check_run 2
grep -q "node $addr1:$port1 is down" "$work/run2.err" || fail "run 2: the client never noticed that node 1 died"
errors=$(sed -n 's/.*load errors \([0-9]*\).*/\1/p' "$work/run2.out")
echo "case 2: node 1 killed after $turns_before of $turns_all turns; $far chunks from the remote tier, $errors load errors, $(($(date +%s) - t0)) s"

# 3. Node 1 back on the same address and port; a fresh engine process uses both nodes again.
t0=$(date +%s)
ip netns exec "$ns_n1" ss -tan >"$work/node1-sockets.txt" 2>&1 || true
if ! start_node 1 "$ns_n1" "$addr1" "$port1"; then
    grep -q 'Address already in use' "$work/node1.out" "$work/node1.err" &&
        fail "node 1 cannot listen again on $addr1:$port1: its killed predecessor's TIME-WAIT sockets hold" \
            "the port and the control listener did not get SO_REUSEADDR (backends/ucx/control.c); sockets in" \
            "$ns_n1 before the restart: $(grep -c TIME-WAIT "$work/node1-sockets.txt") in TIME-WAIT"
    fail "node 1 exited before it was ready after its restart on $addr1:$port1"
fi
[ "$(node_port 1 "$addr1")" = "$port1" ] || fail "node 1 did not come back on port $port1"
ip netns exec "$ns_eng" timeout 120 "$engine" --verify --quiet --config "$work/config.yaml" "$@" \
    >"$work/run3.out" 2>"$work/run3.err" || engine_failed 3 "exit $?"
check_run 3
grep -q 'load errors 0' "$work/run3.out" || fail "run 3: load errors with both nodes up"
echo "case 3: node 1 rejoined on $addr1:$port1; $far chunks from the remote tier ($(($(date +%s) - t0)) s)"

stop_node 1
stop_node 2
pids=""
stats1=$(cat "$work/node1.stats")
stats2=$(cat "$work/node2.stats")
echo "node 1 (restarted): $stats1"
echo "node 2: $stats2"
served=$(($(counter lookups "$stats1") + $(counter gets "$stats1")))
[ "$served" -gt 0 ] || fail "the restarted node 1 served no lookup or get"
[ "$(counter puts "$stats1")" -gt 0 ] || fail "the restarted node 1 stored nothing"
[ "$(counter gets "$stats2")" -gt 0 ] || fail "node 2 served no get"
for dir in in out; do
    sent=$(counter bytes_$dir "$stats2")
    [ "$dir" = in ] && link=$(link_bytes "$ns_n2" rx) || link=$(link_bytes "$ns_n2" tx)
    [ "$link" -ge "$sent" ] || fail "node 2 counted bytes_$dir=$sent but its veth carried only $link bytes"
done
echo "netns_remote: passed in $(($(date +%s) - started)) s"
