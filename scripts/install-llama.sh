#!/usr/bin/env bash
# Install llama.cpp for the checks that run kvstrata's models in a real engine (examples/llama, docs in
# examples/llama/README.md). Nothing of llama.cpp is in the repository: it comes from the npm registry,
# pinned by version and SHA-256, and lands in ${KVS_LLAMA_DIR:-build/llama} (relative to the
# repository root), where CMake looks for it:
#
#   include/   llama.h and the ggml headers, from the llama.cpp source that node-llama-cpp ships as
#              a git bundle (llama/gitRelease.bundle)
#   lib/       libllama, libggml, libggml-base and the CPU backend modules (libggml-cpu-<level>.so,
#              one per x86-64 instruction-set level; ggml loads the best the CPU runs)
#   llama.cpp.bundle, llama.env (versions, the bundle's commit and date)
#
# KVS_LLAMA_BUILD=prebuilt (the default on x86-64 Linux) takes the libraries @node-llama-cpp/linux-x64
# ships, built from that same source; KVS_LLAMA_BUILD=source builds them from the bundle with CMake
# (the CPU backend only, for this machine's CPU, KVS_LLAMA_JOBS parallel jobs, default 2) - minutes
# instead of seconds.
# Neither package's install scripts run: `npm pack` only fetches the tarballs.
# Idempotent and quiet when the pinned version is already there. Needs npm, git, tar, sha256sum
# (and cmake and a C++ compiler for a source build).
set -euo pipefail

NLC_VERSION=3.22.1
NLC_SHA256=a0d9dd80eacd2ab1cfe71aee57ac8a806487fd70b3d2a38fbec637752d9e5c5f
NLC_X64_SHA256=0d953e1503d5ab4608d8ed5b739132308c81ac05ffeb760d2a7f30e08a9f90e0

root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${KVS_LLAMA_DIR:-build/llama}"
case "$dir" in /*) ;; *) dir="$root/$dir" ;; esac
mode="${KVS_LLAMA_BUILD:-}"
if [ -z "$mode" ]; then
  if [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ]; then mode=prebuilt; else mode=source; fi
fi
case "$mode" in prebuilt | source) ;; *)
  echo "install-llama: KVS_LLAMA_BUILD is '$mode': prebuilt or source" >&2
  exit 1 ;;
esac
stamp="node-llama-cpp-$NLC_VERSION-$mode"

if [ -f "$dir/llama.env" ] && grep -qx "KVS_LLAMA_STAMP=$stamp" "$dir/llama.env" &&
   [ -f "$dir/include/llama.h" ] && [ -e "$dir/lib/libllama.so" ]; then
  exit 0
fi

need=(npm git tar sha256sum)
[ "$mode" = source ] && need+=(cmake c++)
for tool in "${need[@]}"; do
  if ! command -v "$tool" >/dev/null; then
    echo "install-llama: '$tool' is needed and not found" >&2
    exit 1
  fi
done
# Only a folder this script made is ever replaced.
if [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ] && [ ! -f "$dir/llama.env" ]; then
  echo "install-llama: $dir exists and was not made by this script; set KVS_LLAMA_DIR" >&2
  exit 1
fi

start=$(date +%s)
echo "install-llama: node-llama-cpp $NLC_VERSION ($mode) into $dir"
mkdir -p "$(dirname "$dir")"
new="$dir.new.$$"
rm -rf "$new"
mkdir -p "$new/download" "$new/include" "$new/lib"
trap 'rm -rf "$new"' EXIT

fetch() { # fetch SPEC SHA256: the package's tarball into $new/download, checked; prints its path
  local json file sum
  json=$(cd "$new/download" && npm pack --json --ignore-scripts --silent "$1")
  file="$new/download/$(printf '%s' "$json" | sed -n 's/.*"filename": *"\([^"]*\)".*/\1/p' | head -n 1)"
  if [ ! -f "$file" ]; then
    echo "install-llama: npm pack $1 gave no tarball" >&2
    return 1
  fi
  sum=$(sha256sum "$file" | cut -d' ' -f1)
  if [ "$sum" != "$2" ]; then
    echo "install-llama: $1: SHA-256 $sum, pinned $2" >&2
    return 1
  fi
  printf '%s\n' "$file"
}

main_tgz=$(fetch "node-llama-cpp@$NLC_VERSION" "$NLC_SHA256")
tar -xzf "$main_tgz" -C "$new/download" package/llama/gitRelease.bundle \
  package/llama/llama.cpp.info.json package/llama/patches
mv "$new/download/package/llama/gitRelease.bundle" "$new/llama.cpp.bundle"
release=$(sed -n 's/.*"tag": *"\([^"]*\)".*/\1/p' "$new/download/package/llama/llama.cpp.info.json")

# The source: a bare clone of the bundle, read with git archive.
git clone --quiet --bare "$new/llama.cpp.bundle" "$new/download/src.git"
gd="$new/download/src.git"
commit=$(git --git-dir="$gd" rev-parse HEAD)
date=$(git --git-dir="$gd" log -1 --format=%cI HEAD)
ggml_version=$(git --git-dir="$gd" show HEAD:ggml/CMakeLists.txt |
  sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' | paste -sd. -)
git --git-dir="$gd" archive HEAD include/llama.h include/llama-cpp.h ggml/include |
  tar -x -C "$new/download"
cp "$new/download/include/"*.h "$new/download/ggml/include/"*.h "$new/include/"

if [ "$mode" = prebuilt ]; then
  x64_tgz=$(fetch "@node-llama-cpp/linux-x64@$NLC_VERSION" "$NLC_X64_SHA256")
  tar -xzf "$x64_tgz" -C "$new/download" package/bins/linux-x64
  bins="$new/download/package/bins/linux-x64"
  # libllama-common (llama.cpp's example helpers) and the Node addon are not needed.
  cp "$bins"/libllama.*so "$bins"/libggml.*so "$bins"/libggml-base.so "$bins"/libggml-cpu-*.so \
    "$new/lib/"
  # Their sonames carry llama.cpp's release (libllama.v0.5.0.so); links to them under the usual
  # names let a build name them without knowing it.
  for lib in llama ggml; do
    real=$(cd "$new/lib" && ls "lib$lib".v*.so)
    ln -s "$real" "$new/lib/lib$lib.so"
  done
else
  mkdir -p "$new/download/src"
  git --git-dir="$gd" archive HEAD | tar -x -C "$new/download/src"
  # The patches node-llama-cpp builds its own binaries with, so both modes run the same code. The
  # tree is made a repository of its own first: inside another one, git apply would take paths from
  # that one's root.
  git -C "$new/download/src" init --quiet
  for p in "$new/download/package/llama/patches/"*.diff; do
    [ -e "$p" ] && git -C "$new/download/src" apply "$p"
  done
  # RUNPATH $ORIGIN: libggml finds libggml-cpu beside it once the build folder is gone.
  cmake -S "$new/download/src" -B "$new/download/build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
    "-DCMAKE_INSTALL_RPATH=\$ORIGIN" \
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    >"$new/download/cmake.log" 2>&1 || { cat "$new/download/cmake.log" >&2; exit 1; }
  cmake --build "$new/download/build" -j "${KVS_LLAMA_JOBS:-2}" >"$new/download/build.log" 2>&1 ||
    { tail -n 50 "$new/download/build.log" >&2; exit 1; }
  find "$new/download/build/bin" "$new/download/build/src" "$new/download/build/ggml" \
    \( -name 'libllama.so*' -o -name 'libggml*.so*' \) -exec cp -a {} "$new/lib/" \;
fi

cat >"$new/llama.env" <<EOF
KVS_LLAMA_STAMP=$stamp
KVS_LLAMA_BUILD=$mode
NODE_LLAMA_CPP_VERSION=$NLC_VERSION
LLAMA_CPP_RELEASE=$release
LLAMA_BUNDLE_COMMIT=$commit
LLAMA_BUNDLE_DATE=$date
GGML_VERSION=$ggml_version
EOF
rm -rf "$new/download"
rm -rf "$dir"
mv "$new" "$dir"
trap - EXIT
echo "install-llama: llama.cpp $release (bundle commit ${commit:0:12}, $date), $(du -sh "$dir/lib" | cut -f1) of libraries, $(($(date +%s) - start)) s"
