unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c5 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/res5; mkdir -p $D /tmp/base
save() { rm -rf $D/*/logs; tar -czf $OUT/r5.tgz -C /tmp res5; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
tar -xf .snap/s44base.tar -C /tmp/base; cp -r benchmarks /tmp/base/
DNNTUNE_CACHE_DIR=/tmp/gt timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/providers/test_cudnn_suggested.py tests/backend/test_estimates.py tests/autotune/test_budget_search.py tests/torch/test_budget.py > $D/gpu_tests.txt 2>&1; tail -n 3 $D/gpu_tests.txt; say tests; save
run() { # tag tree model timeout
  ( cd $2 && PYTHONPATH=/tmp/site:$2/src:$2/benchmarks timeout $4 python3 benchmarks/models.py --models $3 \
      --variants eager,eager_graph,dnntune_auto --skip-compile --tune-budget-s 12 --rounds 8 \
      --model-timeout-s $(($4 - 5)) --out $D/$1 > $D/$1.log 2>&1 )
  say "$1"; grep "^| $3" $D/$1/models.md; save
}
run dec_new $R llama_decode 42
run dec_base /tmp/base llama_decode 42
left=$((185 - $(date +%s) + T0)); if [ $left -gt 75 ]; then run gpt2_new $R gpt2 37; run gpt2_base /tmp/base gpt2 37; fi
save; say done
