# session 47 call 4: the lone-cat GPU test, the wide-copy micro, then GPT-2's kernels under
# A (8293f7b) and B (this tree): is the cache's cat gone from B's recording, and what do A's
# copies cost on this machine
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c4 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/res4; mkdir -p $D /tmp/new /tmp/a
S=$R/.snap; tar -xf $S/s47new.tar -C /tmp/new; tar -xf $S/s47a.tar -C /tmp/a; R=/tmp/new; cd $R
save() { tar -czf $OUT/r4.tgz -C /tmp res4; }
DNNTUNE_CACHE_DIR=/tmp/c_t PYTHONPATH=/tmp/site:$R/src timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider \
   tests/torch/test_lone_cat.py > $D/gpu_tests.txt 2>&1; tail -n 2 $D/gpu_tests.txt; say tests
PYTHONPATH=/tmp/site python3 $S/wide_micro.py > $D/wide_micro.txt 2>&1; tail -n 2 $D/wide_micro.txt; say micro; save
for t in a new; do
  DNNTUNE_CACHE_DIR=/tmp/c_$t PYTHONPATH=/tmp/site:/tmp/$t/src:$R/benchmarks timeout 200 python3 benchmarks/graph_kernels.py --models gpt2 \
     --forms dnntune_auto --tune-budget-s 12 --out $D/gk_$t > $D/gk_$t.log 2>&1
  say "gk $t"; grep -A9 "^== gpt2" $D/gk_$t.log | head -10; grep -i "cat\|memcpy" $D/gk_$t.log | head -4; save
done
say done
