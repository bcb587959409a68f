unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c6 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w6; mkdir -p $W /tmp/old40 /tmp/res6
tar -xf .snap/old40.tar -C /tmp/old40; cp -r benchmarks /tmp/old40/
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
DNNTUNE_CACHE_DIR=$W/c1 timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider -rs \
    tests/providers/test_torch_fused.py tests/torch/test_module_tails.py > $OUT/gpu_tests.txt 2>&1; echo "rc=$?" >> $OUT/gpu_tests.txt
say tests; tail -n 2 $OUT/gpu_tests.txt
python3 .snap/vitgemm.py $W/g > /dev/null 2>&1
DNNTUNE_CACHE_DIR=$W/c2 timeout 80 python3 -m dnntune tune -g $W/g/gpt2_cfc_gelu_tanh.json $W/g/vit_fc1_gelu.json --device cuda --ranking-metric device \
     -o $W/ov.json --report $OUT/tune6.json > $OUT/tune6.txt 2>&1; echo "rc=$?" >> $OUT/tune6.txt
say tune; grep "│" $OUT/tune6.txt | tail -3
run() { # tag tree models timeout
  ( cd $2 && PYTHONPATH=/tmp/site timeout $4 python3 benchmarks/models.py --models $3 \
      --variants eager,eager_graph,dnntune_auto --skip-compile --tune-budget-s 15 --rounds 8 \
      --model-timeout-s 150 --out /tmp/res6/$1 > /tmp/res6/$1.log 2>&1 )
  say "$1"; grep -A3 "^| model" /tmp/res6/$1/models.md | head -3
}
left=$((380 - $(date +%s) + T0)); say "timing with $left s"
run new $R gpt2 $((left / 2))
run old /tmp/old40 gpt2 $((left / 2 - 5))
rm -rf /tmp/res6/*/logs; tar -czf $OUT/p6.tgz -C /tmp res6
say done
