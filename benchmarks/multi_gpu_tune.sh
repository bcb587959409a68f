#!/usr/bin/env bash
# Issue 12: distributed tuning on a multi-GPU machine (nvidia-h200-x2 or larger).
# Run from the repository root on the device, with PYTHONPATH set to src (and the cuDNN frontend
# wheel installed as benchmarks/README or the device notes say). Writes everything under $OUT.
#   1. one GPU: dnntune tune over the suite (the reference file and wall time)
#   2. graph-sharded: torchrun --nproc-per-node N ... --distributed (wall time, same file?)
#   3. candidate-sharded: --shard candidates on a few graphs (ranks agree?)
#   4. a rank killed mid-run: the others report and exit (no hang)
set -uo pipefail
N=${NPROC:-2}
SUITE=${SUITE:-benchmarks/suite}
OUT=${OUT:-/tmp/multi_gpu}
ARGS=${TUNE_ARGS:---strategy fixed_average --iters 5 --warmup 2 --engine TORCH_ENGINE,CUDNN_ENGINE,TRITON_ENGINE}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DNNTUNE_CACHE_DIR="$OUT/cache" DNNTUNE_DISABLE_EXACT_ENGINE_CACHE=1

t0=$(date +%s.%N)
python3 -m dnntune tune -g "$SUITE" -o "$OUT/single.json" --overwrite $ARGS > "$OUT/single.log" 2>&1
t1=$(date +%s.%N)
torchrun --nproc-per-node "$N" -m dnntune tune -g "$SUITE" -o "$OUT/graphs.json" --overwrite \
  --distributed $ARGS > "$OUT/graphs.log" 2>&1
t2=$(date +%s.%N)
torchrun --nproc-per-node "$N" -m dnntune tune -g "$SUITE"/conv_fprop_resnet50_res2a*.json \
  -o "$OUT/candidates.json" --overwrite --distributed --shard candidates $ARGS \
  > "$OUT/candidates.log" 2>&1
python3 - "$OUT" "$t0" "$t1" "$t2" <<'PY'
import json, sys
out, t0, t1, t2 = sys.argv[1], *map(float, sys.argv[2:])
def entries(p):
    d = json.load(open(p))
    return sorted((e["op"], e["engine_name"], json.dumps(e["tensors"], sort_keys=True),
                   json.dumps(e.get("criteria", {}), sort_keys=True)) for e in d["engine_overrides"])
single, graphs = entries(f"{out}/single.json"), entries(f"{out}/graphs.json")
same = sum(a == b for a, b in zip(single, graphs))
print(f"one GPU {t1 - t0:.1f} s; graph-sharded {t2 - t1:.1f} s; speedup {(t1 - t0) / (t2 - t1):.2f}x")
print(f"override entries: {len(single)} vs {len(graphs)}; identical (modulo timings): {same}")
PY
# 4. kill rank 1 after a few seconds: rank 0 must exit with an error within the timeout
( torchrun --nproc-per-node "$N" -m dnntune tune -g "$SUITE" -o "$OUT/killed.json" --overwrite \
    --distributed --dist-timeout-s 60 $ARGS > "$OUT/killed.log" 2>&1; echo "exit $?" >> "$OUT/killed.log" ) &
# torchrun starts workers as `python -u -m dnntune tune ...`: kill the newest one (one rank)
sleep 20; pkill -9 -n -f -- "-u -m dnntune tune"; wait
tail -5 "$OUT/killed.log"
