# GPU tests (warm start, batched output copy); optimize's wall time A/B (A = before the Triton warm start, B = HEAD), cold caches each run; GPT-2 against max-autotune; the batched copy A/B on GPT-2 if time is left
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c5 $(($(date +%s) - T0)) s] $*"; }
left() { echo $((575 - $(date +%s) + T0)); }
cd $R; D=/tmp/res5; mkdir -p $D /tmp/new /tmp/prewarm /tmp/precopy
S=$R/.snap; tar -xf $S/s46new.tar -C /tmp/new; tar -xf $S/s46pre_warm.tar -C /tmp/prewarm; tar -xf $S/s46pre_copy.tar -C /tmp/precopy; R=/tmp/new; cd $R
save() { rm -rf $D/*/logs $D/*/*/logs; tar -czf $OUT/r5.tgz -C /tmp res5; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
PYTHONPATH=/tmp/site:$R/src DNNTUNE_CACHE_DIR=/tmp/c_t timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/providers/test_triton_warm_start.py tests/torch/test_fresh_outputs.py > $D/gpu_tests.txt 2>&1; tail -n 2 $D/gpu_tests.txt; say tests; save
python3 -c "import torch, torch._inductor, triton, transformers" 2>/dev/null; say imports
n=0
for round in 1 2; do for m in gpt2 llama_decode; do for tree in prewarm new; do
  n=$((n + 1)); src=/tmp/$tree/src; [ $tree = new ] && src=$R/src
  CUDA_CACHE_DISABLE=1 DNNTUNE_CACHE_DIR=/tmp/ot_$n TRITON_CACHE_DIR=/tmp/tc_$n PYTHONPATH=/tmp/site:$src:$R/benchmarks \
    timeout 80 python3 $S/optimize_time.py $m > $D/ot_${m}_${tree}_$round.txt 2>&1
  echo "$tree r$round $(tail -n 1 $D/ot_${m}_${tree}_$round.txt | cut -c1-200)"
done; done; done | tee $D/optimize_time.txt; say "optimize times"; save
l=$(left); say "left $l"
[ $l -gt 200 ] && PYTHONPATH=/tmp/site:$R/src:$R/benchmarks timeout $((l - 10)) python3 benchmarks/models.py --models gpt2 \
   --variants eager_graph,max_autotune,dnntune_auto --tune-budget-s 12 --rounds 8 --compile-timeout-s $((l - 60)) \
   --model-timeout-s $((l - 15)) --out $D/gpt2_ma > $D/gpt2_ma.log 2>&1
say "gpt2 ma"; grep "^| gpt2\|\[models\]" $D/gpt2_ma/models.md $D/gpt2_ma.log 2>/dev/null | head -3; save
l=$(left); say "left $l"
[ $l -gt 190 ] && PYTHONPATH=/tmp/site:$R/benchmarks AB_FLAGS="--rounds 8 --model-timeout-s 60" timeout $((l - 5)) bash benchmarks/ab_trees.sh /tmp/precopy/src $R/src $D/ab_copy gpt2 > $D/ab_copy.txt 2>&1
tail -n 5 $D/ab_copy.txt; say done; save
