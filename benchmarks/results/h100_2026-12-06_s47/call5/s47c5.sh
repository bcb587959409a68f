# session 47 call 5: GPU tests (the lone cat, its retry, the replays it runs under), a true A/B of
# GPT-2 (A = 8293f7b, session 46's end; B = this tree; ab_trees.sh now checks each run's tree),
# then GPT-2 against max-autotune side by side (tree B)
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c5 $(($(date +%s) - T0)) s] $*"; }
left() { echo $((575 - $(date +%s) + T0)); }
cd $R; D=/tmp/res5; mkdir -p $D /tmp/new /tmp/a
S=$R/.snap; tar -xf $S/s47new.tar -C /tmp/new; tar -xf $S/s47a.tar -C /tmp/a; R=/tmp/new; cd $R
export PYTHONPATH=/tmp/site
save() { rm -rf $D/*/logs $D/*/*/logs; tar -czf $OUT/r5.tgz -C /tmp res5; }
DNNTUNE_CACHE_DIR=/tmp/c_t PYTHONPATH=/tmp/site:$R/src timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider \
   tests/torch/test_lone_cat.py tests/torch/test_replay_state.py tests/torch/test_fresh_outputs.py tests/torch/test_piecewise_capture.py tests/torch/test_generate.py > $D/gpu_tests.txt 2>&1
tail -n 4 $D/gpu_tests.txt; say tests; save
AB_FLAGS="--rounds 8 --model-timeout-s 90" timeout 250 bash benchmarks/ab_trees.sh /tmp/a/src $R/src $D/ab gpt2 > $D/ab.log 2>&1
say ab; cat $D/ab/gpt2/summary.txt 2>/dev/null; tail -3 $D/ab.log; save
l=$(left); say "left $l"
if [ $l -gt 150 ]; then
PYTHONPATH=/tmp/site:$R/src timeout $((l - 10)) python3 benchmarks/models.py --models gpt2 --variants eager_graph,max_autotune,dnntune_auto \
   --tune-budget-s 12 --rounds 8 --compile-timeout-s $((l - 40)) --model-timeout-s $((l - 15)) --out $D/ma > $D/ma.log 2>&1
say ma; grep "\[models\]" $D/ma.log | head -2; save
fi
say done
