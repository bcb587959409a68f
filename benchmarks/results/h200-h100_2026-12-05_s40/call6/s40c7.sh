unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c7 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w7; mkdir -p $W /tmp/old40 /tmp/res7
tar -xf .snap/old40.tar -C /tmp/old40; cp -r benchmarks /tmp/old40/
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
git log -1 --format=%h > $OUT/tree.txt 2>/dev/null
DNNTUNE_CACHE_DIR=$W/c1 timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider -rs \
    tests/providers/test_torch_fused.py tests/providers/test_torch_fused_conv.py > $OUT/gpu_tests.txt 2>&1; echo "rc=$?" >> $OUT/gpu_tests.txt
say tests; tail -n 2 $OUT/gpu_tests.txt
run() { # tag tree models timeout
  ( cd $2 && PYTHONPATH=/tmp/site timeout $4 python3 benchmarks/models.py --models $3 \
      --variants eager,eager_graph,dnntune_auto --skip-compile --tune-budget-s 15 --rounds 8 \
      --model-timeout-s 100 --out /tmp/res7/$1 > /tmp/res7/$1.log 2>&1 )
  say "$1"; grep -A4 "^| model" /tmp/res7/$1/models.md | head -4
}
left=$((320 - $(date +%s) + T0)); say "timing with $left s"
run new $R gpt2,vit_b16 $((left / 2))
run old /tmp/old40 gpt2,vit_b16 $((left / 2 - 5))
rm -rf /tmp/res7/*/logs; tar -czf $OUT/p7.tgz -C /tmp res7
say done
