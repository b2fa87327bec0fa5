#!/bin/sh
# install_test.sh CMAKE BUILD_DIR SOURCE_DIR LIBDIR WORK_DIR: what the README tells a new user to do.
# Installs the build into a fresh prefix, builds examples/hello/hello.c with nothing but the flags
# pkg-config gives for that prefix, and runs it with LD_LIBRARY_PATH naming the installed library.
# Also checks that an install staged under DESTDIR names the final prefix, not the staging one.
# $CC and $CFLAGS (the sanitizer flags in a sanitizer build) are used when set.
set -eu
cmake=$1 build=$2 src=$3 libdir=$4 work=$5
fail() {
  echo "install_test: $*" >&2
  exit 1
}
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" || fail "cmake --install failed"
export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
got=$(pkg-config --variable=prefix kvstrata) || fail "pkg-config finds no kvstrata in $PKG_CONFIG_PATH"
[ "$got" = "$prefix" ] || fail "kvstrata.pc says prefix=$got, but the library was installed to $prefix"
flags=$(pkg-config --cflags --libs kvstrata)
echo "install_test: pkg-config --cflags --libs kvstrata: $flags"
# shellcheck disable=SC2086 # the flags are words
${CC:-cc} -std=c11 -Wall -Wextra -Werror ${CFLAGS:-} -o "$work/hello" "$src/examples/hello/hello.c" \
  $flags -ldl || fail "examples/hello/hello.c does not build against the installed library"
LD_LIBRARY_PATH="$prefix/$libdir" "$work/hello" || fail "the installed hello failed"

# Every public header is installed and compiles on its own with the same flags (an extension header
# brings the core with it), and all of them together, the core included last.
cflags=$(pkg-config --cflags kvstrata)
incdir=$(pkg-config --variable=includedir kvstrata)
all=""
for h in kvstrata.h kvstrata_plans.h kvstrata_lossy.h kvstrata_lsc.h kvstrata_sparse.h \
  kvstrata_store.h kvstrata_backend.h; do
  [ -f "$incdir/kvstrata/$h" ] || fail "$h is not installed in $incdir/kvstrata"
  printf '#include <kvstrata/%s>\n' "$h" >"$work/only_$h.c"
  # shellcheck disable=SC2086 # the flags are words
  ${CC:-cc} -std=c11 -Wall -Wextra -Werror -pedantic ${CFLAGS:-} $cflags -c -o /dev/null \
    "$work/only_$h.c" || fail "<kvstrata/$h> does not compile on its own"
  all="#include <kvstrata/$h>
$all"
done
printf '%s\n' "$all" >"$work/all_headers.c"
# shellcheck disable=SC2086 # the flags are words
${CC:-cc} -std=c11 -Wall -Wextra -Werror -pedantic ${CFLAGS:-} $cflags -c -o /dev/null \
  "$work/all_headers.c" || fail "the installed headers do not compile together"

# DESTDIR: the files land under the staging directory; the .pc names the prefix they will have.
DESTDIR="$work/stage" "$cmake" --install "$build" --prefix /opt/kvstrata >/dev/null ||
  fail "cmake --install with DESTDIR failed"
pc="$work/stage/opt/kvstrata/$libdir/pkgconfig/kvstrata.pc"
[ -f "$pc" ] || fail "no $pc after a DESTDIR install"
grep -qx 'prefix=/opt/kvstrata' "$pc" || fail "$pc does not say prefix=/opt/kvstrata: $(grep ^prefix= "$pc")"
echo "install_test: installed, built and ran against $prefix; every header compiles alone; a DESTDIR install names its prefix"
