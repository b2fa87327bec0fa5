#!/bin/bash
# device-run.sh - every GPU check in one pass, for a GPU machine that cannot build the project.
#
#   tests/gpu/device-run.sh stage [BUILD]   here: copy what the GPU checks need into .gpu/
#                                           (binaries, libraries, the Debian libraries they link)
#   tests/gpu/device-run.sh run [OUTDIR]    there: run the checks from .gpu/, logs into OUTDIR
#
# `run` needs only a driver, python3 with torch, and the CUDA runtime the test binaries link
# (libcudart.so.13: the CUDA toolkit's or PyTorch's). It places .gpu/ where the binaries were built
# (their rpath and the module path compiled into the gpu tests point there), then runs, each with a
# time limit: the gpu-labelled tests, the Python replay suites and the Llama restore with the pages
# in CUDA memory (KVS_TEST_DEVICE=cuda), kvs-bench-cuda, the peer_gpu tier over CUDA IPC
# (test_peer_gpu_cuda, kvs-bench-peer --device cuda:0), and compute-sanitizer (every tool). Each
# stage's log is OUTDIR/<stage>.log; OUTDIR/summary.txt has one line per stage with its exit code.
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
cmd=${1:-}

stage() {
    local build=${1:-$here/build} dst=$here/.gpu
    rm -rf "$dst"
    mkdir -p "$dst/bin" "$dst/lib" "$dst/deps"
    cp -a "$build"/lib/libkvstrata.so* "$build"/lib/libkvstrata-cuda.so.1 "$dst/lib/"
    for b in test_cuda_device test_cuda_graph test_cuda_abi test_cuda_module kvs-bench-cuda \
             kvs-mini-engine kvstrata-lend test_peer_gpu_cuda kvs-bench-peer; do
        cp -a "$build/bin/$b" "$dst/bin/"
    done
    # The Debian libraries they link that a CUDA image may lack (libcrypto stays: every image has
    # one, and an older copy first on the path would shadow it for python's ssl).
    ldd "$dst"/bin/* "$dst"/lib/libkvstrata.so.1 | awk '/=> \/(usr\/)?lib/ {print $3}' | sort -u |
        grep -E 'lib(yaml|xxhash|uc[pstm]|uring|numa|subunit|msgpack)' |
        while read -r so; do cp -L "$so" "$dst/deps/"; done
    echo "$build" > "$dst/built-in"
    du -sh "$dst"
}

run() {
    local out=${1:-$here/.gpu-out} gpu=$here/.gpu
    mkdir -p "$out"
    local built
    built=$(cat "$gpu/built-in")
    if [ ! -e "$built" ] || [ -L "$built" ]; then # a build folder that is there is used as it is
        mkdir -p "$(dirname "$built")"
        rm -f "$built"
        ln -s "$gpu" "$built"
    fi
    local cudart
    cudart=$(find /usr/local/cuda*/ /opt -name 'libcudart.so.13*' 2>/dev/null | head -n 1)
    cudart=${cudart:+$(dirname "$cudart")}
    export LD_LIBRARY_PATH="$gpu/deps:/usr/local/cuda/lib64:/usr/local/cuda/lib:${cudart}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export KVSTRATA_LIBRARY=$built/lib/libkvstrata.so PYTHONPATH=$here/python:$here/tests/python
    export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 CK_FORK=no
    : > "$out/summary.txt"
    step() { # step NAME SECONDS COMMAND...
        local name=$1 secs=$2
        shift 2
        local t0=$SECONDS
        echo "== $name: $*" | tee "$out/$name.log"
        timeout -k 5 "$secs" "$@" >> "$out/$name.log" 2>&1
        local rc=$?
        echo "$name rc=$rc $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
        tail -n 25 "$out/$name.log"
    }
    {
        date -u
        nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max \
            --format=csv
        python3 -c 'import torch, sys; print(sys.version.split()[0], "torch", torch.__version__, torch.cuda.get_device_name(0))'
        python3 -c 'import transformers; print("transformers", transformers.__version__)'
        ldd "$gpu"/bin/* "$gpu"/lib/libkvstrata.so.1 | grep 'not found' | sort -u
    } 2>&1 | tee "$out/machine.txt"
    step gpu_module 15 "$gpu/bin/test_cuda_module"
    cd "$here/tests/python" || return 1
    KVS_TEST_DEVICE=cuda step py_llama 100 python3 -m unittest -v test_llama_restore
    KVS_TEST_DEVICE=cuda step py_replay 240 python3 -m unittest -v test_replay_sync test_replay_abi15
    cd "$here" || return 1
    step gpu_abi 40 "$gpu/bin/test_cuda_abi"
    step gpu_device 100 "$gpu/bin/test_cuda_device"
    step gpu_graph 40 "$gpu/bin/test_cuda_graph"
    step bench_cuda 60 "$gpu/bin/kvs-bench-cuda"
    step gpu_peer 120 "$gpu/bin/test_peer_gpu_cuda"
    step bench_peer_cuda 60 "$gpu/bin/kvs-bench-peer" --device cuda:0
    step bench_peer_host 60 "$gpu/bin/kvs-bench-peer"
    KVS_LEND_DEVICE=cuda:0 step e2e_peer_cuda 240 sh tests/e2e/peer_verify.sh \
        "$gpu/bin/kvs-mini-engine" "$gpu/bin/kvstrata-lend" "$out/e2e-peer" \
        --sessions 3 --turns 3 --doc-tokens 600
    step sanitizer 200 tests/gpu/run-sanitizer.sh "$gpu/bin"
    cat "$out/summary.txt"
}

case $cmd in
stage) shift; stage "$@" ;;
run) shift; run "$@" ;;
*) sed -n '2,14p' "$0"; exit 2 ;;
esac
