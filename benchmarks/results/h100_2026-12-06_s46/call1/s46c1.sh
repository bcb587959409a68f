# GPU tests (masks, dtypes seen, trace guards, output tails); the shared additive mask A/B on decode (ab_trees, A = before it); GPT-2 kernels against max-autotune
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c1 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w1; D=/tmp/res1; mkdir -p $W $D /tmp/pre /tmp/new
S=$R/.snap; tar -xf $S/s46new.tar -C /tmp/new; tar -xf $S/s46pre_mask.tar -C /tmp/pre; R=/tmp/new; cd $R
export PYTHONPATH=/tmp/site:$R/benchmarks
save() { rm -rf $D/*/logs $D/*/*/logs; tar -czf $OUT/r1.tgz -C /tmp res1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
PYTHONPATH=/tmp/site:$R/src DNNTUNE_CACHE_DIR=$W/c timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/torch/test_masks.py tests/torch/test_dtypes_seen.py tests/torch/test_trace_guards.py tests/torch/test_output_tails.py > $D/gpu_tests.txt 2>&1; tail -n 3 $D/gpu_tests.txt; say tests; save
AB_FLAGS="--rounds 8 --model-timeout-s 70" timeout 260 bash benchmarks/ab_trees.sh /tmp/pre/src $R/src $D/ab_mask llama_decode > $D/ab_mask.txt 2>&1; cat $D/ab_mask.txt | tail -6; say ab_mask; save
left=$((580 - $(date +%s) + T0)); say "left $left"
PYTHONPATH=/tmp/site:$R/src:$R/benchmarks timeout $left python3 benchmarks/graph_kernels.py --models gpt2 --forms dnntune_auto --compile-mode max-autotune \
      --tune-budget-s 12 --rounds 8 --out $D/gk_gpt2 > $D/gk_gpt2.txt 2>&1
say gk; head -n 40 $D/gk_gpt2.txt; save; say done
