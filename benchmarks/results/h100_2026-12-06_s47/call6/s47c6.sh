# session 47 call 6: the compiled-part GPU test of the lone cat, then (time allowing) GPT-2
# against max-autotune once more, side by side
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c6 $(($(date +%s) - T0)) s] $*"; }
left() { echo $((250 - $(date +%s) + T0)); }
cd $R; D=/tmp/res6; mkdir -p $D /tmp/new
S=$R/.snap; tar -xf $S/s47new.tar -C /tmp/new; R=/tmp/new; cd $R
export PYTHONPATH=/tmp/site
save() { rm -rf $D/*/logs; tar -czf $OUT/r6.tgz -C /tmp res6; }
DNNTUNE_CACHE_DIR=/tmp/c_t PYTHONPATH=/tmp/site:$R/src timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider \
   tests/torch/test_lone_cat.py -o log_cli=false > $D/gpu_tests.txt 2>&1
tail -n 3 $D/gpu_tests.txt; say tests; save
l=$(left); say "left $l"
if [ $l -gt 130 ]; then
PYTHONPATH=/tmp/site:$R/src timeout $((l - 5)) python3 benchmarks/models.py --models gpt2 --variants eager_graph,max_autotune,dnntune_auto \
   --tune-budget-s 12 --rounds 8 --compile-timeout-s $((l - 30)) --model-timeout-s $((l - 8)) --out $D/ma > $D/ma.log 2>&1
say ma; grep "\[models\]" $D/ma.log | head -2; save
fi
say done
