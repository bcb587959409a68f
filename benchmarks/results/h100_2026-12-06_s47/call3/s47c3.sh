# session 47 call 3: GPU tests of the lone-cat copy (and the replay tests it runs under), an A/B
# of GPT-2 (A = 8293f7b, B = 8959d6f: the cache's first cat recorded as a copy), then GPT-2
# against max-autotune side by side (tree B)
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c3 $(($(date +%s) - T0)) s] $*"; }
left() { echo $((575 - $(date +%s) + T0)); }
cd $R; D=/tmp/res3; mkdir -p $D /tmp/new /tmp/a
S=$R/.snap; tar -xf $S/s47new.tar -C /tmp/new; tar -xf $S/s47a.tar -C /tmp/a; R=/tmp/new; cd $R
export PYTHONPATH=/tmp/site:$R/benchmarks
save() { rm -rf $D/*/logs $D/*/*/logs; tar -czf $OUT/r3.tgz -C /tmp res3; }
DNNTUNE_CACHE_DIR=/tmp/c_t PYTHONPATH=/tmp/site:$R/src timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider \
   tests/torch/test_lone_cat.py tests/torch/test_fresh_outputs.py tests/torch/test_replay_state.py tests/torch/test_generate.py > $D/gpu_tests.txt 2>&1
tail -n 3 $D/gpu_tests.txt; say tests; save
AB_FLAGS="--rounds 8 --model-timeout-s 90" timeout 260 bash benchmarks/ab_trees.sh /tmp/a/src $R/src $D/ab gpt2 > $D/ab.log 2>&1
say ab; cat $D/ab/gpt2/summary.txt 2>/dev/null || tail -5 $D/ab.log; save
l=$(left); say "left $l"
PYTHONPATH=/tmp/site:$R/src:$R/benchmarks timeout $((l - 10)) python3 benchmarks/models.py --models gpt2 --variants eager_graph,max_autotune,dnntune_auto \
   --tune-budget-s 12 --rounds 8 --compile-timeout-s $((l - 60)) --model-timeout-s $((l - 15)) --out $D/ma > $D/ma.log 2>&1
say ma; grep "\[models\]" $D/ma.log | head -2; save; say done
