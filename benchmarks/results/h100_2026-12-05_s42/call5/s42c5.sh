unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c5 $(($(date +%s) - T0)) s] $*"; }
cd $R; mkdir -p /tmp/res5
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/res5/gpu.txt
timeout 265 python3 benchmarks/models.py --models llama_prefill \
    --variants eager,eager_graph,max_autotune,dnntune_auto --tune-budget-s 12 --rounds 8 \
    --compile-timeout-s 220 --model-timeout-s 258 --out /tmp/res5/pre_ma > /tmp/res5/pre_ma.log 2>&1
say "rc $?"; grep "^| llama" /tmp/res5/pre_ma/models.md; grep -i "recompiled\|timeout" /tmp/res5/pre_ma/models.json | head -3
rm -rf /tmp/res5/*/logs; tar -czf $OUT/p5.tgz -C /tmp res5
say done
