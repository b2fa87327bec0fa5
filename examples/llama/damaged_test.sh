#!/bin/sh
# damaged_test.sh PYTHON CONVERTER KVSW: a copy of KVSW with one weight byte flipped is refused
# (exit 1, a sentence naming the checksum) and no GGUF is written.
set -u
python=$1 converter=$2 kvsw=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$kvsw" "$tmp/damaged.kvsw"
# byte 100000 lies in the weights (after the 48-byte header and the description)
printf '\377' | dd of="$tmp/damaged.kvsw" bs=1 seek=100000 conv=notrunc 2>/dev/null
"$python" "$converter" "$tmp/damaged.kvsw" "$tmp/out.gguf" 2>"$tmp/err"
status=$?
cat "$tmp/err"
[ "$status" -eq 1 ] || { echo "damaged_test: exit $status, expected 1" >&2; exit 1; }
grep -q checksum "$tmp/err" || { echo "damaged_test: no word of the checksum" >&2; exit 1; }
[ ! -e "$tmp/out.gguf" ] || { echo "damaged_test: a GGUF was written" >&2; exit 1; }
"$python" "$converter" "$kvsw" "$tmp/out.gguf" || { echo "damaged_test: the intact file fails" >&2; exit 1; }
[ -s "$tmp/out.gguf" ] || { echo "damaged_test: no GGUF from the intact file" >&2; exit 1; }
echo "damaged_test: refused the damaged copy, converted the intact file"
