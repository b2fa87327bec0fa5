#!/bin/sh
# run-all.sh [BUILD_DIR] - what `make bench` runs: every BUILD_DIR/bin/kvs-bench-* with its defaults
# (kvs-bench-redis through bench/redis.sh, which starts its servers), then kvs-bench-dram --threads 2,
# kvs-bench-ucx --shared-memory auto and bench/ucx-netns.sh. Each program's output is shown and kept
# in bench/results/raw/<UTC time>-<commit>/<name>.out, and bench/report.py parse turns the JSON lines
# there into rows.jsonl of that folder, the schema of bench/results/*.jsonl (docs/benchmarks.md,
# "Running them and the data"). Stops at the first benchmark that fails; exit status 77 (hardware or
# a tool this machine lacks) is a skip.
# KVS_BENCH_MACHINE names the machine in the rows (default: its CPU model and core count).
set -u
build=${1:-build}
here=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)
raw=$here/bench/results/raw/$(date -u +%Y-%m-%dT%H%M%SZ)-$commit
mkdir -p "$raw" || exit 1
machine=${KVS_BENCH_MACHINE:-$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) cores}

parse() {
    python3 "$here/bench/report.py" parse "$raw" --commit "$commit" --machine "$machine" || exit 1
}

# run NAME SKIP_REASON COMMAND [ARG...]: runs COMMAND, keeps its output in NAME.out.
run() {
    name=$1 skip=$2
    shift 2
    { "$@"; echo $? >"$raw/$name.rc"; } 2>&1 | tee "$raw/$name.out"
    rc=$(cat "$raw/$name.rc")
    rm -f "$raw/$name.rc"
    if [ "$rc" -eq 77 ]; then
        echo "   (skipped: $skip)"
    elif [ "$rc" -ne 0 ]; then
        parse
        exit "$rc"
    fi
}

for b in "$build"/bin/kvs-bench-*; do
    case $b in */kvs-bench-redis) continue ;; esac # below, on the servers redis.sh starts
    echo "== $b"
    run "$(basename "$b")" "needs hardware this machine lacks" "$b"
done
echo "== bench/redis.sh (the redis tier, standalone and cluster, against a TCP stream and redis-benchmark)"
run kvs-bench-redis "needs redis-server, redis-cli and redis-benchmark" "$here/bench/redis.sh" "$build/bin/kvs-bench-redis"
echo "== $build/bin/kvs-bench-dram --threads 2 (device.host_threads: 2, against two copying threads)"
run kvs-bench-dram-threads-2 "needs hardware this machine lacks" "$build/bin/kvs-bench-dram" --threads 2
echo "== $build/bin/kvs-bench-ucx --shared-memory auto (payloads over shared memory, against one copy)"
run kvs-bench-ucx-shared-memory "needs UCX and ucx_perftest" "$build/bin/kvs-bench-ucx" --shared-memory auto
echo "== bench/ucx-netns.sh (the remote tier across two network namespaces, against a TCP stream)"
run ucx-netns "needs root and iproute2" "$here/bench/ucx-netns.sh" "$build/bin/kvs-bench-ucx"
parse
