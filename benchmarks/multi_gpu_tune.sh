#!/usr/bin/env bash
# Issue 12: distributed tuning on a multi-GPU machine (nvidia-h200-x2 or larger).
# Run from the repository root on the device, with PYTHONPATH set to src (and the cuDNN frontend
# wheel installed as benchmarks/README or the device notes say). Writes everything under $OUT.
#   1. one GPU: dnntune tune over the suite, default options (the reference file and wall time)
#   2. graph-sharded: torchrun --nproc-per-node N ... --distributed (wall time, same file?)
#   3. candidate-sharded: --shard candidates on a few graphs (ranks agree? same winners?)
#   4. a rank killed mid-run, ranks started without torchrun's agent (which would tear the
#      others down itself): the survivors must report the dead rank and exit, not hang
# Every run starts from empty dnntune, Triton and Inductor caches of its own, so no run reuses
# kernels another compiled. NVLink multicast stays off (the device notes require it).
set -uo pipefail
N=${NPROC:-2}
SUITE=${SUITE:-benchmarks/suite}
OUT=${OUT:-/tmp/multi_gpu}
ARGS=${TUNE_ARGS:-}  # steps 1-2: the command, dnntune tune's defaults
FAST=${FAST_ARGS:---strategy fixed_average --iters 5 --warmup 2 --engine TORCH_ENGINE,CUDNN_ENGINE,TRITON_ENGINE}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DNNTUNE_DISABLE_EXACT_ENGINE_CACHE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv > "$OUT/gpus.txt" 2>&1
nvidia-smi topo -m >> "$OUT/gpus.txt" 2>&1

fresh_caches() {  # $1: a name; points every compile cache at an empty folder of its own
  export DNNTUNE_CACHE_DIR="$OUT/cache_$1/dnntune" TRITON_CACHE_DIR="$OUT/cache_$1/triton"
  export TORCHINDUCTOR_CACHE_DIR="$OUT/cache_$1/inductor"
}

fresh_caches single
t0=$(date +%s.%N)
timeout 270 python3 -m dnntune tune -g "$SUITE" -o "$OUT/single.json" --overwrite \
  --report "$OUT/single_report.json" $ARGS > "$OUT/single.log" 2>&1
echo "single exit $?" >> "$OUT/single.log"
t1=$(date +%s.%N)
fresh_caches graphs
timeout 170 torchrun --standalone --nproc-per-node "$N" -m dnntune tune -g "$SUITE" \
  -o "$OUT/graphs.json" --overwrite --report "$OUT/graphs_report.json" --distributed $ARGS \
  > "$OUT/graphs.log" 2>&1
echo "graphs exit $?" >> "$OUT/graphs.log"
t2=$(date +%s.%N)
fresh_caches candidates
timeout 70 torchrun --standalone --nproc-per-node "$N" -m dnntune tune \
  -g "$SUITE"/conv_fprop_resnet50_res2a*.json "$SUITE"/matmul_llama2_7b_decode*.json \
  -o "$OUT/candidates.json" --overwrite --distributed --shard candidates $FAST \
  > "$OUT/candidates.log" 2>&1
echo "candidates exit $?" >> "$OUT/candidates.log"
grep -h "exit\|ranks built\|tuned .* graphs" "$OUT"/single.log "$OUT"/graphs.log "$OUT"/candidates.log
python3 benchmarks/_multi_gpu_compare.py "$OUT" "$t0" "$t1" "$t2" | tee "$OUT/summary.txt"

# 4. two ranks by hand (RANK/WORLD_SIZE/MASTER_* as torchrun would set them); kill rank 1 once
#    rank 0 has reported its sixth graph
fresh_caches killed
export MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 WORLD_SIZE=2
start=$(date +%s)
for r in 0 1; do
  RANK=$r LOCAL_RANK=$r timeout 90 python3 -m dnntune tune -g "$SUITE" -o "$OUT/killed.json" \
    --overwrite --distributed --dist-timeout-s 30 $FAST > "$OUT/killed_rank$r.log" 2>&1 &
  eval "pid$r=$!"
done
for _ in $(seq 600); do grep -q "^\[6/" "$OUT/killed_rank0.log" 2>/dev/null && break; sleep 0.1; done
kill -9 "$pid1"; killed_at=$(( $(date +%s) - start ))
wait "$pid0"; code=$?
echo "rank 1 killed at ${killed_at} s; rank 0 exited with $code after $(( $(date +%s) - start )) s" \
  | tee -a "$OUT/summary.txt"
grep -E "^\[[0-9]+/|rank|error|Error" "$OUT/killed_rank0.log" | tail -4 | tee -a "$OUT/summary.txt"
python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['engine_overrides']), \
  'winners kept in the file')" "$OUT/killed.json" 2>&1 | tee -a "$OUT/summary.txt"
# at most 8 files come back from the device: everything else in one archive
rm -rf "$OUT"/cache_*
tar -czf /tmp/multi_gpu_logs.tar.gz -C "$OUT" --exclude summary.txt --exclude gpus.txt . \
  && find "$OUT" -mindepth 1 -maxdepth 1 ! -name summary.txt ! -name gpus.txt -exec rm -rf {} + \
  && mv /tmp/multi_gpu_logs.tar.gz "$OUT/"
