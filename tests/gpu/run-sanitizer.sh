#!/bin/sh
# run-sanitizer.sh - the gpu-labelled tests under NVIDIA compute-sanitizer.
#
#   tests/gpu/run-sanitizer.sh [BIN_DIR]          (default: build/bin)
#   KVS_SANITIZER_TOOLS="memcheck racecheck" tests/gpu/run-sanitizer.sh
#
# Runs each test binary once per tool (default: memcheck with leak checking, racecheck, synccheck,
# initcheck). A sanitizer report fails the run (exit 1); a test that fails on its own fails it too.
# Exits 77 (CTest: skipped) when compute-sanitizer is missing or no GPU is usable. Also registered
# as the CTest `compute_sanitizer` (label compute-sanitizer): cd build && ctest -L compute-sanitizer -V
set -u
BIN_DIR=${1:-build/bin}
TOOLS=${KVS_SANITIZER_TOOLS:-"memcheck racecheck synccheck initcheck"}
TESTS="test_cuda_device test_cuda_graph test_cuda_abi"

SANITIZER=$(command -v compute-sanitizer 2>/dev/null)
if [ -z "$SANITIZER" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
    SANITIZER=/usr/local/cuda/bin/compute-sanitizer
fi
if [ -z "$SANITIZER" ]; then
    echo "run-sanitizer: skipped: compute-sanitizer not found (it ships with the CUDA toolkit)"
    exit 77
fi
if command -v nvidia-smi >/dev/null 2>&1 && ! nvidia-smi -L >/dev/null 2>&1; then
    echo "run-sanitizer: skipped: nvidia-smi sees no GPU"
    exit 77
fi

failed=0
for tool in $TOOLS; do
    extra=""
    [ "$tool" = memcheck ] && extra="--leak-check full"
    for t in $TESTS; do
        echo "== compute-sanitizer --tool $tool $extra $t"
        # CK_FORK=no: the suites already run unforked; kept explicit for runs outside CTest.
        CK_FORK=no "$SANITIZER" --tool "$tool" $extra --error-exitcode 99 "$BIN_DIR/$t"
        rc=$?
        case $rc in
        0) ;;
        77) echo "run-sanitizer: skipped: $t found no usable GPU"; exit 77 ;;
        99) echo "run-sanitizer: $tool reported errors in $t"; failed=1 ;;
        *) echo "run-sanitizer: $t failed under $tool (exit $rc)"; failed=1 ;;
        esac
    done
done
exit $failed
