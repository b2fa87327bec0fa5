#!/usr/bin/env bash
# Install the Debian packages kvstrata builds and tests with, if any are missing. Idempotent and quiet
# when everything is present. The CUDA toolkit is optional and never installed here. fio is the
# reference the SSD benchmark measures against, ucx-utils (ucx_perftest) the remote tier's; libssl-dev
# gives libcrypto for the remote tier's handshake; iproute2 the network namespaces of its tests;
# clang-format and cppcheck the checks of `make check-format` and `make cppcheck` (.ci/run); clang and
# libclang-rt-14-dev (libFuzzer) the fuzzing of what a peer sends (tests/fuzz/run.sh); python3-torch
# the Python tests (tests/python), for /usr/bin/python3, which may not be the python3 first on PATH;
# gnuplot-nox draws the pictures of `make bench-report` (docs/benchmarks.md) and of `kvstrata
# compare` (docs/operations.md); redis-server and
# redis-tools (redis-cli, redis-benchmark) because the redis tier's tests start their own servers
# (tests/support/redis_servers.h: temp directories, picked ports, never 6379 nor a service Debian may
# start) and redis-benchmark is the reference its benchmark measures against; openssl (the command)
# makes their TLS certificates; python3-prometheus-client parses the metrics endpoint in
# tests/python/test_metrics.py.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libyaml-dev libmsgpack-dev libxxhash-dev check liburing-dev
      libucx-dev ucx-utils libssl-dev iproute2 fio clang-format cppcheck clang libclang-rt-14-dev
      python3-torch gnuplot-nox redis-server redis-tools openssl python3-prometheus-client)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
