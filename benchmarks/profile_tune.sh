#!/usr/bin/env bash
# Where a one-GPU `dnntune tune` over the suite spends its time outside the candidates' timing
# (imports, engine loading, heuristic plans, inputs, verification, the override file): a cProfile
# of the whole command, from empty caches. Writes $OUT/profile_tune.txt.
set -uo pipefail
OUT=${OUT:-/tmp/profile_tune}
ARGS=${TUNE_ARGS:---strategy fixed_average --iters 5 --warmup 2 --engine TORCH_ENGINE,CUDNN_ENGINE,TRITON_ENGINE}
mkdir -p "$OUT"
export DNNTUNE_DISABLE_EXACT_ENGINE_CACHE=1 DNNTUNE_CACHE_DIR=/tmp/pt/dnntune
export TRITON_CACHE_DIR=/tmp/pt/triton TORCHINDUCTOR_CACHE_DIR=/tmp/pt/inductor
rm -rf /tmp/pt
/usr/bin/time -v python3 -X importtime -m cProfile -o /tmp/pt_tune.prof -m dnntune tune \
  -g benchmarks/suite -o /tmp/pt_over.json --overwrite $ARGS > /tmp/pt_stdout.txt 2> /tmp/pt_stderr.txt
{
  tail -3 /tmp/pt_stdout.txt
  grep -E "Elapsed|Maximum resident" /tmp/pt_stderr.txt
  echo "## slowest imports (us, cumulative)"
  grep "import time:" /tmp/pt_stderr.txt | sort -t'|' -k2 -n -r | head -25
  python3 - <<'PY'
import pstats
s = pstats.Stats("/tmp/pt_tune.prof")
s.sort_stats("cumulative").print_stats(70)
s.sort_stats("tottime").print_stats(30)
PY
} > "$OUT/profile_tune.txt" 2>&1
head -5 "$OUT/profile_tune.txt"
