unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c1 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w1; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
git log -1 --format=%h > $OUT/tree.txt 2>/dev/null
triton=$(ls tests/providers/test_triton*.py)
( DNNTUNE_CACHE_DIR=$W/c2 timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rs \
    tests --ignore=tests/torch --ignore=tests/autotune $(printf -- '--ignore=%s ' $triton) \
    > "$OUT/gpu_tests_b.txt" 2>&1; echo "rc=$?" >> "$OUT/gpu_tests_b.txt" ) &
( DNNTUNE_CACHE_DIR=$W/zoo timeout 230 python3 benchmarks/model_conformance.py --device cuda \
    --zoo timm_efficientnet_b0,timm_regnety_002 --count 8 --time-budget-s 200 --out "$W/zoo" \
    > "$W/zoo.log" 2>&1; echo "rc=$?" >> $W/zoo.log ) &
( python3 .snap/se_graphs.py $W/se > $OUT/se_graphs.txt 2>&1
  DNNTUNE_CACHE_DIR=$W/c3 timeout 100 python3 -m dnntune run -g $W/se --device cuda --json $W/se_run.json >> $OUT/se_graphs.txt 2>&1; echo "run rc=$?" >> $OUT/se_graphs.txt ) &
wait
say "phase 1"; tail -n 3 $OUT/gpu_tests_b.txt $W/zoo.log; grep -c PASS $OUT/se_graphs.txt; grep -c MISMATCH $OUT/se_graphs.txt
tar -czf "$OUT/p1.tgz" -C "$W" zoo zoo.log se_run.json 2>/dev/null
left=$((520 - $(date +%s) + T0)); say "timing with $left s"
timeout $left python3 benchmarks/models.py --models llama_prefill,llama_prefill_cache \
  --variants eager,eager_graph,max_autotune,dnntune_auto --tune-budget-s 15 --rounds 8 \
  --compile-timeout-s 170 --model-timeout-s 250 --budget-s $((left - 60)) --out /tmp/res1 > $OUT/models1.log 2>&1
cp -r /tmp/res1 $OUT/res1
say done; grep -A4 "^| model" /tmp/res1/models.md | head -6
