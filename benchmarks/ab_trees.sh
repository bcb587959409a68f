#!/usr/bin/env bash
# A/B of two source trees on the models benchmark, with the same plans for every layer the two
# share: one override file per model, tuned to completion by both trees first (no budget), then
# the timed runs alternate A, B, A, B, each a fresh process reading that file and tuning
# nothing it has. Session 45's A/B shared a file between a budgeted new run and a base run
# that came second: the base read the new run's plans, spent its budget on the rest and ran
# fully tuned, where the new run left three signatures untuned, so the difference measured
# the order more than the change.
#
#   benchmarks/ab_trees.sh A_SRC B_SRC OUT MODEL [MODEL ...]
#
# A_SRC, B_SRC: folders holding a `dnntune` package (a checkout's src/, or one unpacked from
# `git archive <commit> src`). The benchmark scripts are this checkout's. OUT gets, per model,
# the override file, each run's models.json/models.md and log, and summary.txt (each run's
# median ms of each variant). The variants timed: $AB_VARIANTS (default
# `eager_graph,dnntune_auto`: the plain capture and auto); more flags for models.py:
# $AB_FLAGS (default `--rounds 8`); the device and dtype are models.py's defaults (CUDA,
# bf16). A CPU smoke run: AB_VARIANTS=eager,dnntune AB_FLAGS="--quick --device cpu".
#
# AB_FILES=own gives each tree its own override file (OUT/MODEL.a.json, OUT/MODEL.b.json),
# each tuned to completion by its tree: the A/B of a change that adds a candidate (an engine,
# a kernel). With the shared file (the default) B reads the plans A tuned and never searches
# those signatures again: session 48's A/B of TRITON_ENGINE's attention kernel on Swin-T read
# no change that way, where runs with their own files read 1.32x.
set -euo pipefail
if [ $# -lt 4 ]; then
    echo "usage: $0 A_SRC B_SRC OUT MODEL [MODEL ...]" >&2
    exit 2
fi
a_src=$(cd "$1" && pwd)
b_src=$(cd "$2" && pwd)
out=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
python=${PYTHON:-python3}
flags=${AB_FLAGS:---rounds 8}
variants=${AB_VARIANTS:-eager_graph,dnntune_auto}
tuned=${variants##*,} # the dnntune variant: the last one

files=${AB_FILES:-shared}
case $files in
shared | own) ;;
*)
    echo "ab_trees: AB_FILES must be shared or own, got '$files'" >&2
    exit 2
    ;;
esac

overrides() { # model tag -> the override file its run reads and writes
    local tree=${2:0:1} # a1, a2 -> a
    [ "${2:0:5}" = warm_ ] && tree=${2:5:1} # warm_a -> a
    if [ "$files" = own ]; then
        echo "$out/$1.$tree.json"
    else
        echo "$out/$1.json"
    fi
}

run() { # tag src model variants [extra flags]
    local tag=$1 src=$2 model=$3 variants=$4
    shift 4
    # shellcheck disable=SC2086  # the flags are words
    PYTHONPATH="$src:$here${PYTHONPATH:+:$PYTHONPATH}" "$python" "$here/models.py" \
        --models "$model" --variants "$variants" --skip-compile \
        --overrides "$(overrides "$model" "$tag")" \
        --out "$out/$model/$tag" $flags "$@" >"$out/$model/$tag.log" 2>&1
}

medians() { # models.json variants -> each variant's median ms
    "$python" - "$1" "$2" <<'PY'
import json, sys
row = json.load(open(sys.argv[1]))["models"][0]["variants"]
def ms(v):
    cell = row.get(v) or {}
    return f"{cell['median_ms']:.4f}" if cell.get("median_ms") else cell.get("status", "-")
print(" ".join(ms(v) for v in sys.argv[2].split(",")))
PY
}

ran_from() { # models.json src: fail unless the run imported the dnntune of src
    "$python" - "$1" "$2" <<'PY'
import json, os, sys
ran = json.load(open(sys.argv[1]))["versions"].get("dnntune_path") or "?"
want = os.path.realpath(os.path.join(sys.argv[2], "dnntune"))
if os.path.realpath(ran) != want:
    sys.exit(f"ab_trees: {sys.argv[1]} ran the dnntune in {ran}, not {want}")
PY
}

for model in "$@"; do
    mkdir -p "$out/$model"
    # every signature of either tree tuned into the file, no budget
    run warm_a "$a_src" "$model" "$tuned"
    run warm_b "$b_src" "$model" "$tuned"
    ran_from "$out/$model/warm_a/models.json" "$a_src"
    ran_from "$out/$model/warm_b/models.json" "$b_src"
    {
        echo "# $model: ms of $variants (A=$a_src, B=$b_src)"
        for tag in a1 b1 a2 b2; do
            src=$a_src
            [ "${tag:0:1}" = b ] && src=$b_src
            run "$tag" "$src" "$model" "$variants"
            ran_from "$out/$model/$tag/models.json" "$src"
            echo "$tag $(medians "$out/$model/$tag/models.json" "$variants")"
        done
    } | tee "$out/$model/summary.txt"
done
