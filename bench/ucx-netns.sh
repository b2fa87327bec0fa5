#!/bin/sh
# ucx-netns.sh - kvs-bench-ucx across network namespaces: the benchmark (the tier and the perftest
# clients) in one namespace, kvstrata-node and the ucx_perftest servers in another, joined by a veth
# pair (10.78.0.1/24 <-> 10.78.0.2/24). The namespaces carry this script's PID in their names and
# are deleted on exit, with every process in them. Needs root and iproute2.
#
# usage: bench/ucx-netns.sh [BENCH_BINARY] [kvs-bench-ucx flags...]
#        (default binary: build/bin/kvs-bench-ucx beside this script's repository)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
bench=$here/build/bin/kvs-bench-ucx
if [ $# -gt 0 ] && [ -x "$1" ]; then
    bench=$1
    shift
fi
[ "$(id -u)" -eq 0 ] || { echo "ucx-netns: needs root to create network namespaces" >&2; exit 77; }
command -v ip >/dev/null 2>&1 || { echo "ucx-netns: needs ip (iproute2)" >&2; exit 77; }
[ -x "$bench" ] || { echo "ucx-netns: $bench is not built (make)" >&2; exit 1; }

cli=kvsb-cli-$$
srv=kvsb-srv-$$
made=""
cleanup() {
    rc=$?
    trap - EXIT INT TERM
    for ns in $made; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    done
    for ns in $made; do ip netns del "$ns" 2>/dev/null || echo "ucx-netns: could not delete $ns" >&2; done
    exit $rc
}
trap cleanup EXIT
trap 'exit 1' INT TERM

for ns in $cli $srv; do
    ip netns add "$ns"
    made="$made $ns"
    ip -n "$ns" link set lo up
done
ip -n "$cli" link add eth0 type veth peer name eth0 netns "$srv"
ip -n "$cli" addr add 10.78.0.1/24 dev eth0
ip -n "$srv" addr add 10.78.0.2/24 dev eth0
ip -n "$cli" link set eth0 up
ip -n "$srv" link set eth0 up
for ns in $cli $srv; do
    n=0
    until [ "$(ip netns exec "$ns" cat /sys/class/net/eth0/operstate)" = up ]; do
        n=$((n + 1))
        [ $n -le 100 ] || { echo "ucx-netns: eth0 in $ns did not come up" >&2; exit 1; }
        sleep 0.05
    done
done
echo "ucx-netns: $cli (10.78.0.1, the tier) <-> $srv (10.78.0.2, kvstrata-node, perftest servers)" >&2
ip netns exec "$cli" "$bench" --server-netns "$srv" --server-addr 10.78.0.2 "$@"
