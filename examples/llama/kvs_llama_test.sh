#!/bin/sh
# kvs_llama_test.sh CASE KVS_LLAMA GGUF PYTHON CONVERTER KVSW: kvs-llama's cases (CTest label llama).
#   two_process  a second process restores from a shared DRAM tier what the first saved, and its
#                logits are the saver's bit for bit
#   concurrent   two processes at once over a shared DRAM tier: the second's first session restores
#                the system prompt the first saved, and both verify bit for bit
#   restart      DRAM over SSD: a new process restores what the last one saved (from the SSD)
#   corrupt      every stored object damaged in the SSD files: misses, recomputed, still verified
#   truncated    states llama.cpp refuses (cut short): misses, recomputed, still verified
#   system_only  a session sharing only the system prompt restores up to its last boundary
#   wrong_model  the same weights as f16, or another chunk size, restore nothing (and the same
#                model and chunk size do)
set -u
case_=$1 bin=$2 gguf=$3 python=$4 converter=$5 kvsw=$6
tmp=$(mktemp -d)
shm=kvs-llama-test-$$
p1= p2=
cleanup() {
    touch "$tmp/done"
    for p in $p1 $p2; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    rm -f "/dev/shm/$shm"
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
    echo "kvs_llama_test $case_: $*" >&2
    exit 1
}
# small sessions: a 200-token system prompt (boundary 192), 300-token documents, 40-token turns
args="--gguf $gguf --system 200 --doc 300 --user 40 --gen 4 --chunk 64 --turns 2"
run() { # OUT ARGS...: run kvs-llama, its output into $tmp/OUT and on stdout
    out=$1
    shift
    "$bin" "$@" >"$tmp/$out" 2>&1
    rc=$?
    cat "$tmp/$out"
    return $rc
}
turn_restored() { # OUT SESSION TURN: tokens that turn restored
    sed -n "s/^session $2 turn $3: prompt [0-9]*, restored \([0-9]*\),.*/\1/p" "$tmp/$1"
}
total_restored() { sed -n 's/.*tokens restored \([0-9]*\),.*/\1/p' "$tmp/$1"; }
verified_ok() { # OUT: --verify passed, with at least one state compared bit for bit
    grep -q 'verify: .* \([1-9][0-9]*\) restored states bit for bit, 0 differ, .*: ok$' "$tmp/$1"
}
ssd_config() {
    mkdir -p "$tmp/ssd"
    cat >"$tmp/ssd.yaml" <<EOF
version: 1
tiers:
  - name: dram
    type: dram
    capacity: 64MiB
    write: through
  - name: ssd
    type: ssd
    capacity: 128MiB
    paths: [$tmp/ssd]
EOF
}

shared_config() {
    cat >"$tmp/shared.yaml" <<EOF
version: 1
tiers:
  - name: dram
    type: dram
    capacity: 128MiB
    options: {shm_name: $shm}
EOF
}

case $case_ in
two_process)
    shared_config
    # the first process keeps the shared tier open until the second is done
    "$bin" $args --config "$tmp/shared.yaml" --seed 3 --probe --linger-until "$tmp/done" \
        >"$tmp/p1" 2>&1 &
    p1=$!
    i=0
    until grep -q lingering "$tmp/p1"; do
        kill -0 "$p1" 2>/dev/null || { cat "$tmp/p1"; fail "the first process ended early"; }
        i=$((i + 1))
        [ $i -lt 1200 ] || fail "the first process did not finish in 120 s"
        sleep 0.1
    done
    cat "$tmp/p1"
    run p2 $args --config "$tmp/shared.yaml" --seed 3 --verify || fail "the second process failed"
    r=$(turn_restored p2 0 0)
    [ "${r:-0}" -gt 192 ] || fail "the second process's first turn restored ${r:-nothing}"
    verified_ok p2 || fail "no bit-for-bit verification"
    touch "$tmp/done"
    wait "$p1" || fail "the first process failed"
    p1=
    ;;
concurrent)
    # two processes at once on one shared DRAM tier, different sessions with one system prompt:
    # each finds the states the other saves, and every restore verifies bit for bit
    shared_config
    "$bin" $args --config "$tmp/shared.yaml" --sessions 3 --session-base 0 --verify \
        --linger-until "$tmp/done" >"$tmp/c1" 2>&1 &
    p1=$!
    # the second starts once the first has saved its system prompt's state
    i=0
    until grep -q "^session 0 turn 0" "$tmp/c1"; do
        kill -0 "$p1" 2>/dev/null || { cat "$tmp/c1"; fail "the first process ended early"; }
        i=$((i + 1))
        [ $i -lt 1200 ] || fail "the first process's first turn took over 120 s"
        sleep 0.1
    done
    "$bin" $args --config "$tmp/shared.yaml" --sessions 3 --session-base 3 --verify \
        --linger-until "$tmp/done" >"$tmp/c2" 2>&1 &
    p2=$!
    i=0
    until grep -q lingering "$tmp/c1" && grep -q lingering "$tmp/c2"; do
        kill -0 "$p1" 2>/dev/null || kill -0 "$p2" 2>/dev/null || break
        i=$((i + 1))
        [ $i -lt 1200 ] || { kill "$p2"; fail "the processes did not finish in 120 s"; }
        sleep 0.1
    done
    touch "$tmp/done"
    wait "$p2"
    rc2=$?
    wait "$p1"
    rc1=$?
    p1= p2=
    cat "$tmp/c1" "$tmp/c2"
    [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] || fail "exit statuses $rc1 and $rc2"
    verified_ok c1 && verified_ok c2 || fail "a process verified nothing bit for bit"
    [ "$(turn_restored c2 3 0)" = 192 ] || fail "the second process did not restore the system prompt"
    ;;
restart)
    ssd_config
    run p1 $args --config "$tmp/ssd.yaml" --seed 4 --probe || fail "the first run failed"
    run p2 $args --config "$tmp/ssd.yaml" --seed 4 --verify || fail "the second run failed"
    r=$(turn_restored p2 0 0)
    [ "${r:-0}" -gt 192 ] || fail "after the restart the first turn restored ${r:-nothing}"
    verified_ok p2 || fail "no bit-for-bit verification"
    grep -q ', 0 corrupt' "$tmp/p2" || fail "corrupt objects after a clean restart"
    ;;
corrupt)
    ssd_config
    run p1 $args --config "$tmp/ssd.yaml" --seed 5 || fail "the first run failed"
    # one byte of each stored value's probe logits, found by the trailer's magic, flipped
    "$python" - "$tmp/ssd" <<'EOF' || fail "no stored object found to damage"
import os, sys
magic, n = b"kvs-llama-probe1", 0
for root, _, files in os.walk(sys.argv[1]):
    for f in files:
        p = os.path.join(root, f)
        with open(p, "r+b") as fh:
            data = fh.read()
            at = data.find(magic)
            while at >= 0:
                fh.seek(at - 100)
                fh.write(bytes([data[at - 100] ^ 0x5A]))
                n += 1
                at = data.find(magic, at + 1)
print(f"damaged {n} stored values")
sys.exit(0 if n else 1)
EOF
    run p2 $args --config "$tmp/ssd.yaml" --seed 5 --verify || fail "the run over damaged objects failed"
    c=$(sed -n 's/.*store: .* \([0-9]*\) corrupt,.*/\1/p' "$tmp/p2")
    [ "${c:-0}" -gt 0 ] || fail "no damaged object was reported corrupt"
    r=$(turn_restored p2 0 0)
    [ "${r:-1}" -eq 0 ] || fail "the first turn restored $r tokens from damaged objects"
    grep -q 'verify: .*: ok$' "$tmp/p2" || fail "the recomputed run does not verify"
    ;;
truncated)
    run p1 $args --sessions 2 --test-store-truncated --verify || fail "the run failed"
    [ "$(total_restored p1)" = 0 ] || fail "a truncated state was restored"
    n=$(sed -n 's/.* \([0-9]*\) refused by llama.cpp.*/\1/p' "$tmp/p1")
    [ "${n:-0}" -gt 0 ] || fail "llama.cpp refused nothing"
    grep -q 'verify: .*: ok$' "$tmp/p1" || fail "the recomputed run does not verify"
    # a refused state is dropped, so the next run that computes that prefix stores a good one
    ssd_config
    run t1 $args --config "$tmp/ssd.yaml" --seed 6 --test-store-truncated || fail "the truncated run failed"
    run t2 $args --config "$tmp/ssd.yaml" --seed 6 --verify || fail "the run over truncated states failed"
    [ "$(turn_restored t2 0 0)" = 0 ] || fail "a truncated state was restored"
    run t3 $args --config "$tmp/ssd.yaml" --seed 6 --verify || fail "the third run failed"
    r=$(turn_restored t3 0 0)
    [ "${r:-0}" -gt 0 ] || fail "a refused state stayed in the store: the third run restored nothing"
    ;;
system_only)
    run p1 $args --sessions 2 --verify || fail "the run failed"
    # session 1 shares only the system prompt with session 0: 200 tokens, boundary 192
    [ "$(turn_restored p1 1 0)" = 192 ] || fail "session 1's first turn restored $(turn_restored p1 1 0)"
    r=$(turn_restored p1 1 1)
    [ "${r:-0}" -gt 192 ] || fail "session 1's second turn restored ${r:-nothing}"
    verified_ok p1 || fail "no bit-for-bit verification"
    ;;
wrong_model)
    ssd_config
    "$python" "$converter" "$kvsw" "$tmp/f16.gguf" --type f16 >/dev/null || fail "no f16 GGUF"
    run p1 $args --config "$tmp/ssd.yaml" --seed 6 || fail "the first run failed"
    one="--sessions 1 --turns 1 --config $tmp/ssd.yaml --seed 6"
    run f16 $args $one --gguf "$tmp/f16.gguf" || fail "the f16 run failed"
    [ "$(total_restored f16)" = 0 ] || fail "the f16 model restored the f32 model's states"
    run c128 $args $one --chunk 128 || fail "the chunk-128 run failed"
    [ "$(total_restored c128)" = 0 ] || fail "chunks of 128 restored states of chunks of 64"
    run same $args $one || fail "the same-model run failed"
    [ "$(total_restored same)" -gt 0 ] || fail "the same model restored nothing"
    ;;
*)
    fail "unknown case"
    ;;
esac
echo "kvs_llama_test $case_: ok"
