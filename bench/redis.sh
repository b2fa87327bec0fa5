#!/bin/sh
# redis.sh - kvs-bench-redis on servers this script starts: one standalone redis-server and a Redis
# Cluster of three masters (no replicas: their replication would take CPU from the measurement), on
# 127.0.0.1 ports it picks (never 6379), without persistence (--save '' --appendonly no), maxmemory
# 2 GiB each, in a temporary directory. Every server is stopped and the directory removed when the
# script exits, also on a failure or a signal.
#
# usage: bench/redis.sh [BENCH_BINARY] [kvs-bench-redis flags...]
#        (default binary: build/bin/kvs-bench-redis beside this script's repository)
# Exit 77 (skipped) when redis-server, redis-cli or redis-benchmark is missing (Debian: redis-server
# and redis-tools).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
bench=$here/build/bin/kvs-bench-redis
if [ $# -gt 0 ] && [ -x "$1" ]; then
    bench=$1
    shift
fi
for tool in redis-server redis-cli redis-benchmark; do
    command -v $tool >/dev/null 2>&1 || { echo "redis.sh: $tool is not installed" >&2; exit 77; }
done
[ -x "$bench" ] || { echo "redis.sh: $bench is not built (make)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/kvs-bench-redis.XXXXXX")
pids=""
cleanup() {
    rc=$?
    trap - EXIT INT TERM
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    for p in $pids; do
        n=0
        while kill -0 "$p" 2>/dev/null && [ $n -lt 50 ]; do
            n=$((n + 1))
            sleep 0.1
        done
        kill -9 "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$work"
    exit $rc
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# 0 when something listens on TCP port $1 (IPv4 or IPv6).
listening() {
    hex=$(printf '%04X' "$1")
    awk -v p="$hex" '$4 == "0A" { split($2, a, ":"); if (a[length(a)] == p) f = 1 } END { exit !f }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# Four consecutive ports and the cluster bus ports of the last three (port + 10000), all free.
base=$((20000 + $$ % 9000))
tries=0
while :; do
    ok=1
    for p in $base $((base + 1)) $((base + 2)) $((base + 3)) \
        $((base + 10001)) $((base + 10002)) $((base + 10003)); do
        if listening "$p"; then ok=0; fi
    done
    [ $ok -eq 0 ] || break
    tries=$((tries + 1))
    [ $tries -lt 100 ] || { echo "redis.sh: no free ports found" >&2; exit 1; }
    base=$((base + 7))
done

# start PORT [redis-server flags...]: a server in $work/PORT, answering PING within 10 s.
start() {
    port=$1
    shift
    mkdir -p "$work/$port"
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --maxmemory 2gb \
        --maxmemory-policy noeviction --dir "$work/$port" --logfile "$work/$port/redis.log" \
        --daemonize no "$@" &
    pids="$pids $!"
    n=0
    until redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; do
        n=$((n + 1))
        if [ $n -ge 100 ]; then
            cat "$work/$port/redis.log" >&2
            echo "redis.sh: redis-server on port $port did not start" >&2
            exit 1
        fi
        sleep 0.1
    done
}

standalone=$base
c1=$((base + 1)) c2=$((base + 2)) c3=$((base + 3))
start $standalone
for p in $c1 $c2 $c3; do
    start "$p" --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000
done
redis-cli --cluster create 127.0.0.1:$c1 127.0.0.1:$c2 127.0.0.1:$c3 --cluster-replicas 0 \
    --cluster-yes >"$work/cluster-create.log" 2>&1 || {
    cat "$work/cluster-create.log" >&2
    echo "redis.sh: the cluster was not formed" >&2
    exit 1
}
for p in $c1 $c2 $c3; do
    n=0
    until redis-cli -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; do
        n=$((n + 1))
        [ $n -lt 200 ] || { echo "redis.sh: the cluster's state is not ok on $p" >&2; exit 1; }
        sleep 0.1
    done
done
echo "redis.sh: standalone on 127.0.0.1:$standalone, cluster of 3 masters on 127.0.0.1:$c1-$c3" \
    "($(redis-server --version | cut -d' ' -f3))" >&2
"$bench" --standalone 127.0.0.1:$standalone --cluster 127.0.0.1:$c1,127.0.0.1:$c2,127.0.0.1:$c3 "$@"
