#!/bin/sh
# layers.sh SOURCE_DIR - the includes follow one direction (docs/CONVENTIONS.md, "Layers you can see in the
# includes"). A layer may include only the layers below it:
#   common/      abi/, common/
#   schedulers/  abi/, common/, schedulers/
#   kernels/     abi/, common/, kernels/
#   backends/    abi/, common/, schedulers/, kernels/, backends/  (never connector/)
#   connector/   abi/, common/, schedulers/, kernels/, backends/, connector/
#   connector/   (of connector/ext/ only api.c, requests.c, step_meta.c and worker_device.c)
#   connector/ext/NAME/  the same, and of connector/ext/ only its own folder: an extension of the core
#                (plans, lossy, lsc, sparse) never reaches into another one
#   abi/         abi/ only (kvstrata_server.h is how tools/ reach the connector)
#   tools/       abi/, common/, schedulers/, kernels/, backends/, tools/  (never connector/)
# A bare include must name a header beside the including file. Prints each include that breaks a rule
# with the rule; exit 1 if any.
root=${1:-.}
cd "$root" || exit 2
found=$(mktemp) || exit 2
trap 'rm -f "$found"' EXIT
include_re='^[[:space:]]*#[[:space:]]*include[[:space:]]*"'

check_layer() { # layer, allowed top-level folders (space separated)
    layer=$1
    allowed=$2
    find "$layer" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) |
        while IFS= read -r f; do
            grep -nE "${include_re}" "$f" | while IFS= read -r line; do
                name=$(printf '%s\n' "$line" | sed -E 's/^[0-9]+:[^"]*"([^"]*)".*/\1/')
                case "$name" in
                */*)
                    top=${name%%/*}
                    case " $allowed " in
                    *" $top "*) continue ;;
                    esac
                    echo "$f:$line   <- $layer/ may include only: $allowed"
                    ;;
                *)
                    [ -f "$(dirname "$f")/$name" ] && continue
                    echo "$f:$line   <- a bare include must name a header beside the file"
                    ;;
                esac
            done
        done
}

check_layer common "abi common" >"$found"
check_layer schedulers "abi common schedulers" >>"$found"
check_layer kernels "abi common kernels" >>"$found"
check_layer backends "abi common schedulers kernels backends" >>"$found"
check_layer connector "abi common schedulers kernels backends connector" >>"$found"
# Only the core's top files reach into an extension; a lower one takes a table of calls instead.
for f in connector/*.c connector/*.h; do
    case "$f" in
    connector/api.c | connector/requests.c | connector/step_meta.c | connector/worker_device.c) continue ;;
    esac
    grep -nE "${include_re}connector/ext/" "$f" |
        sed "s|^|$f:|; s|\$|   <- only api.c, requests.c, step_meta.c, worker_device.c include an extension|"
done >>"$found"
for ext in connector/ext/*/; do
    ext=${ext%/}
    find "$ext" -type f \( -name '*.c' -o -name '*.h' \) | while IFS= read -r f; do
        grep -nE "${include_re}connector/ext/" "$f" | grep -v "\"$ext/" |
            sed "s|^|$f:|; s|\$|   <- $ext/ may not include another extension|"
    done
done >>"$found"
check_layer abi "abi" >>"$found"
check_layer tools "abi common schedulers kernels backends tools" >>"$found"
if [ -s "$found" ]; then
    cat "$found"
    exit 1
fi
echo "layers: every include follows one direction"
exit 0
