unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c3 $(($(date +%s) - T0)) s] $*"; }
cd $R; mkdir -p /tmp/res3
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
for m in $MODELS; do
  left=$((560 - $(date +%s) + T0)); [ $left -lt 120 ] && break
  timeout $left python3 benchmarks/models.py --models $m \
    --variants eager,eager_graph,max_autotune,dnntune_auto --tune-budget-s 15 --rounds 8 \
    --compile-timeout-s $CT --model-timeout-s $((left - 10)) --out /tmp/res3/$m > /tmp/res3/$m.log 2>&1
  say $m; grep -A3 "^| model" /tmp/res3/$m/models.md | tail -1
done
rm -rf /tmp/res3/*/logs; tar -czf $OUT/p3.tgz -C /tmp res3
say done
