unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c1 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w1; mkdir -p $W /tmp/old40 /tmp/res1
tar -xf .snap/old40.tar -C /tmp/old40; cp -r benchmarks /tmp/old40/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
DNNTUNE_CACHE_DIR=$W/c1 timeout 230 python3 -m pytest -m gpu -q -p no:cacheprovider -rs -x \
    tests/torch tests/autotune > $OUT/gpu_tests.txt 2>&1; echo "rc=$?" >> $OUT/gpu_tests.txt
say tests; tail -n 3 $OUT/gpu_tests.txt
run() { # tag tree models timeout
  ( cd $2 && PYTHONPATH=/tmp/site timeout $4 python3 benchmarks/models.py --models $3 \
      --variants eager,eager_graph,dnntune_auto --skip-compile --tune-budget-s 15 --rounds 8 \
      --model-timeout-s 150 --out /tmp/res1/$1 > /tmp/res1/$1.log 2>&1 )
  say "$1"; grep -A3 "^| model" /tmp/res1/$1/models.md | head -3
}
left=$((500 - $(date +%s) + T0)); say "timing with $left s"
run new $R vit_b16 $((left / 2))
run old /tmp/old40 vit_b16 $((left / 2 - 5))
rm -rf /tmp/res1/*/logs; tar -czf $OUT/p1.tgz -C /tmp res1
say done
