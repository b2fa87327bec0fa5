#!/usr/bin/env bash
# Build the libFuzzer targets of tests/fuzz/ with clang (AddressSanitizer and UBSan on) and run each
# for a bounded time: the handshake messages (HELLO, CHALLENGE, AUTH, AUTH_OK), every other control
# message, payload headers and the stream's GET answer headers, as a peer sends them; and what a
# Redis server answers, to the redis tier's RESP2 parser and CLUSTER SLOTS reader.
# Usage: tests/fuzz/run.sh BUILD_DIR [SECONDS per target, default 20]
# Exit 77 (skipped) when clang or its libFuzzer runtime (libclang-rt-14-dev) is missing; 1 when a
# target found a crash, a leak or an accepted forgery (the input is kept under BUILD_DIR/fuzz/).
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
out="$(cd "${1:?usage: run.sh BUILD_DIR [SECONDS]}" && pwd)/fuzz"
seconds="${2:-20}"
cc="${KVS_FUZZ_CC:-clang}"
mkdir -p "$out"
probe="$out/probe.c"
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' >"$probe"
if ! command -v "$cc" >/dev/null || ! "$cc" -fsanitize=fuzzer "$probe" -o "$out/probe" 2>/dev/null; then
  echo "fuzz: $cc with -fsanitize=fuzzer is not available (apt-get install clang libclang-rt-14-dev)"
  exit 77
fi
common=(backends/ucx/wire.c backends/ucx/wire_decode.c backends/ucx/wire_encode.c backends/ucx/stream.c backends/ucx/channel.c backends/ucx/auth.c
        common/mp_reader.c common/log.c common/clock.c common/key_file.c common/status.c)
flags=(-g -O1 -Wall -Wextra -Werror -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$src" -D_GNU_SOURCE -std=gnu11)
srcs=()
for f in "${common[@]}"; do srcs+=("$src/$f"); done
mkdir -p "$out/corpus-fuzz_wire" "$out/corpus-fuzz_handshake"
"$cc" -g -O1 -Wall -Wextra -Werror -I"$src" -D_GNU_SOURCE -std=gnu11 "$src/tests/fuzz/seeds.c" "${srcs[@]}" -lssl -lcrypto \
  -lmsgpackc -lpthread -o "$out/seeds"
"$out/seeds" "$out/corpus-fuzz_wire" "$out/corpus-fuzz_handshake"
mkdir -p "$out/corpus-fuzz_resp"
printf '+OK\r\n' >"$out/corpus-fuzz_resp/status"
printf '*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n' >"$out/corpus-fuzz_resp/slots"
printf '$5\r\nhello\r\n' >"$out/corpus-fuzz_resp/bulk"
printf -- '-MOVED 12 127.0.0.1:7001\r\n' >"$out/corpus-fuzz_resp/moved"
"$cc" "${flags[@]}" "$src/tests/fuzz/fuzz_resp.c" "$src/backends/redis/resp.c" "$src/backends/redis/slots.c" -o "$out/fuzz_resp"
echo "fuzz: fuzz_resp for ${seconds}s"
(cd "$out" && "./fuzz_resp" -max_total_time="$seconds" -rss_limit_mb=2048 -error_exitcode=1 -timeout_exitcode=1 \
   -max_len=4096 -print_final_stats=1 corpus-fuzz_resp 2>&1 | tail -n 12)
for target in fuzz_wire fuzz_handshake; do
  "$cc" "${flags[@]}" "$src/tests/fuzz/$target.c" "${srcs[@]}" -lssl -lcrypto -lmsgpackc -lpthread -o "$out/$target"
  echo "fuzz: $target for ${seconds}s"
  (cd "$out" && ASAN_OPTIONS=detect_leaks=1 "./$target" -max_total_time="$seconds" -rss_limit_mb=2048 -error_exitcode=1 -timeout_exitcode=1 \
     -max_len=65536 -print_final_stats=1 "corpus-$target" 2>&1 | tail -n 12)
done
