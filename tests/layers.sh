#!/bin/sh
# layers.sh SOURCE_DIR - the includes follow one direction (CONVENTIONS.md, "Layers you can see in the
# includes"): nothing under backends/, schedulers/ or kernels/ includes a connector/ header, and
# common/ includes only common/ and abi/ headers. Prints each include that breaks a rule; exit 1 if any.
root=${1:-.}
cd "$root" || exit 2
bad=0
found=$(mktemp) || exit 2
trap 'rm -f "$found"' EXIT
sources() { find "$@" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null; }
include_re='^[[:space:]]*#[[:space:]]*include[[:space:]]*"'

for f in $(sources backends schedulers kernels); do
    if grep -nE "${include_re}connector/" "$f" >"$found" 2>/dev/null; then
        sed "s|^|$f:|; s|\$|   <- backends/, schedulers/ and kernels/ may not include connector/|" "$found"
        bad=1
    fi
done

for f in $(sources common); do
    grep -nE "${include_re}" "$f" | while IFS= read -r line; do
        name=$(printf '%s\n' "$line" | sed -E 's/^[0-9]+:[^"]*"([^"]*)".*/\1/')
        case "$name" in
        abi/* | common/*) continue ;;
        */*) ;;
        *) [ -f "common/$name" ] && continue ;;
        esac
        echo "$f:$line   <- common/ may include only common/ and abi/"
    done >"$found"
    if [ -s "$found" ]; then
        cat "$found"
        bad=1
    fi
done
[ "$bad" -eq 0 ] && echo "layers: every include follows one direction"
exit "$bad"
