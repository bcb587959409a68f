unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c5 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w5; mkdir -p $W /tmp/old41b /tmp/res5
tar -xf .snap/old41b.tar -C /tmp/old41b; cp -r benchmarks /tmp/old41b/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
run() { # tag tree models timeout
  ( cd $2 && PYTHONPATH=/tmp/site timeout $4 python3 benchmarks/models.py --models $3 \
      --variants eager,eager_graph,dnntune_auto --skip-compile --tune-budget-s 12 --rounds 6 \
      --model-timeout-s 100 --out /tmp/res5/$1 > /tmp/res5/$1.log 2>&1 )
  say "$1"; grep "^| $3" /tmp/res5/$1/models.md
}
run new_llama $R llama_prefill 55
run old_llama /tmp/old41b llama_prefill 55
left=$((215 - $(date +%s) + T0))
[ $left -gt 90 ] && run new_gpt2 $R gpt2 45 && run old_gpt2 /tmp/old41b gpt2 45
left=$((250 - $(date +%s) + T0))
[ $left -gt 30 ] && DNNTUNE_CACHE_DIR=$W/c timeout $left python3 -m pytest -m gpu -q -p no:cacheprovider tests/torch/test_module_tails.py tests/providers/test_torch_patch_gemm.py > $OUT/gpu_tests.txt 2>&1; tail -n 2 $OUT/gpu_tests.txt
rm -rf /tmp/res5/*/logs; tar -czf $OUT/p5.tgz -C /tmp res5
say done
