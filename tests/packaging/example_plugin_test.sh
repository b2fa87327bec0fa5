#!/bin/sh
# example_plugin_test.sh HELLO MINI_ENGINE LIBRARY BUILD_DIR SOURCE_DIR WORK_DIR [WORKLOAD FLAGS...]
# 1. examples/configs/plugin-example.yaml, copied byte for byte, opens with both tiers: its plugin
#    path (relative to the file: ../../build/lib/...) reaches this build's lib/ through a link, so the
#    file cannot name a .so the build does not make.
# 2. The example backend alone, small enough to evict, serves the mini engine's restores bit for bit
#    (kvs-mini-engine --verify with the workload flags given).
set -eu
hello=$1 engine=$2 lib=$3 build=$4 src=$5 work=$6
shift 6
fail() {
  echo "example_plugin_test: $*" >&2
  exit 1
}
rm -rf "$work"
mkdir -p "$work/examples/configs"
cp "$src/examples/configs/plugin-example.yaml" "$work/examples/configs/"
ln -s "$build" "$work/build"
"$hello" --lib "$lib" --config "$work/examples/configs/plugin-example.yaml" >"$work/hello.out" ||
  fail "kvs-hello failed with examples/configs/plugin-example.yaml"
cat "$work/hello.out"
grep -q ': 2 tiers$' "$work/hello.out" || fail "plugin-example.yaml did not open with its two tiers"

plugin=$(grep -E '^ *plugin: ' "$src/examples/configs/plugin-example.yaml" | sed 's/^ *plugin: *//')
cat >"$work/plugin-only.yaml" <<YAML
version: 1
tiers:
  - name: memory
    type: plugin
    plugin: $work/examples/configs/$plugin
    capacity: 1MiB
YAML
"$engine" --lib "$lib" --config "$work/plugin-only.yaml" --verify --quiet "$@" ||
  fail "the mini engine's restores through the example backend failed"
