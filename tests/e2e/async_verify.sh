#!/bin/sh
# async_verify.sh - the mini engine with `loads: {async: always}`: every restore runs between steps
# (the request waits unscheduled until get_finished reports it, while the engine keeps stepping the
# others) and every restored prompt must still match a full recompute bit for bit.
#   dram     a DRAM tier paced by read_bandwidth ($RATE, default 16MB/s) so that a load spans many
#            steps. The run must report asynchronous loads, all of them reported by get_finished,
#            and with --continuous, decode steps of other requests taken while one was in flight.
#   corrupt  a small DRAM tier over an SSD tier, run twice over the same directories. Between the
#            runs every other unit stored on the SSD gets one flipped data byte, so part of the second
#            run's asynchronous loads fail (their blocks come with load_error_blocks after get_finished
#            reports them): the engine must recompute from the first failed block, exactly.
#
# usage: async_verify.sh MINI_RESEARCH WORKDIR dram|corrupt [kvs-mini-research flags...]
# (kvs-mini-research: the reference engine serves no asynchronous load)
# HOST_COPIES=deferred in the environment makes the host device defer its copies like a GPU.
set -eu
engine=$1
work=$2
kind=$3
shift 3

rm -rf "$work"
mkdir -p "$work/ssd0" "$work/ssd1"
fail() {
    echo "async_verify: $*" >&2
    exit 1
}
head='version: 1
chunk_tokens: 256
loads:
  async: always
device:
  host_copies: '"${HOST_COPIES:-immediate}"
case $kind in
dram)
    printf '%s\ntiers:\n  - name: dram\n    type: dram\n    capacity: 1GiB\n    options:\n      read_bandwidth: %s\n' \
        "$head" "${RATE:-16MB/s}" >"$work/config.yaml"
    runs=1
    ;;
corrupt)
    printf '%s\ntiers:\n  - {name: dram, type: dram, capacity: 512KiB}\n  - name: nvme\n    type: ssd\n    capacity: 8MiB\n    paths: [ssd0, ssd1]\n    options:\n      stripe_bytes: 64KiB\n' \
        "$head" >"$work/config.yaml"
    runs=2
    ;;
*) fail "unknown kind '$kind' (dram or corrupt)" ;;
esac

# Flip bit 6 of the byte at offset $2 of file $1.
flip() {
    b=$(od -An -tu1 -j "$2" -N 1 "$1" | tr -d ' ')
    # shellcheck disable=SC2059 # the format is the octal escape of the flipped byte
    printf "$(printf '\\%03o' $((b ^ 64)))" | dd of="$1" bs=1 seek="$2" count=1 conv=notrunc 2>/dev/null
}

# The data byte 1000 of every other used unit on both paths (superblock 4 KiB, then slots of a 4 KiB
# header and 64 KiB of data; a used slot has a header that is not all zero).
corrupt_units() {
    flipped=0
    for f in "$work/ssd0/kvstrata-nvme.data" "$work/ssd1/kvstrata-nvme.data"; do
        size=$(wc -c <"$f")
        k=0
        used=0
        while [ $((4096 + k * 69632 + 8192)) -le "$size" ]; do
            off=$((4096 + k * 69632))
            hdr=$(od -An -v -tx1 -j "$off" -N 16 "$f" | tr -d ' \n')
            if [ "$hdr" != "00000000000000000000000000000000" ]; then
                used=$((used + 1))
                if [ $((used % 2)) = 1 ]; then
                    flip "$f" $((off + 4096 + 1000))
                    flipped=$((flipped + 1))
                fi
            fi
            k=$((k + 1))
        done
    done
    echo "async_verify: flipped a data byte in $flipped units on the ssd tier"
    [ "$flipped" -gt 0 ] || fail "the first run left no unit on the ssd tier to corrupt"
}

run=1
while [ "$run" -le "$runs" ]; do
    out="$work/run$run.out"
    if ! "$engine" --verify --quiet --config "$work/config.yaml" "$@" >"$out" 2>"$work/run$run.err"; then
        cat "$out" "$work/run$run.err" >&2
        fail "run $run: the mini engine failed"
    fi
    cat "$out"
    grep -q '^verify: .* 0 mismatches$' "$out" || fail "run $run: restored KV differs from a full recompute"
    line=$(grep '^connector: hit tokens' "$out")
    started=$(echo "$line" | sed -n 's/.*async loads \([0-9]*\), reported \([0-9]*\), failed \([0-9]*\).*/\1/p')
    reported=$(echo "$line" | sed -n 's/.*async loads \([0-9]*\), reported \([0-9]*\), failed \([0-9]*\).*/\2/p')
    failed=$(echo "$line" | sed -n 's/.*async loads \([0-9]*\), reported \([0-9]*\), failed \([0-9]*\).*/\3/p')
    errors=$(echo "$line" | sed -n 's/.*load errors \([0-9]*\).*/\1/p')
    [ -n "$started" ] && [ "$started" -gt 0 ] || fail "run $run: no load ran asynchronously"
    [ "$reported" = "$started" ] || fail "run $run: $started async loads started, $reported reported by get_finished"
    case " $* " in
    *" --continuous "*)
        during=$(sed -n 's/^connector: decode-only steps: \([0-9]*\) with an async load in flight.*/\1/p' "$out")
        [ -n "$during" ] && [ "$during" -gt 0 ] ||
            fail "run $run: no request decoded while an asynchronous load was in flight (${during:-none})"
        echo "async_verify: run $run: $during decode steps of other requests while a load was in flight"
        ;;
    esac
    echo "async_verify: run $run: $started asynchronous loads, $failed with failed chunks ($errors load errors), KV exact"
    if [ "$kind" = corrupt ] && [ "$run" = 1 ]; then
        [ "$errors" = 0 ] || fail "run 1 had load errors before anything was corrupted"
        corrupt_units
    fi
    if [ "$kind" = corrupt ] && [ "$run" = 2 ]; then
        [ "$errors" -gt 0 ] && [ "$failed" -gt 0 ] ||
            fail "run 2 read corrupted units but reported no failed asynchronous load (errors $errors, failed $failed)"
    fi
    run=$((run + 1))
done
