# session 48 call 2 (written in session 47): generate() after optimize on the GPU, eager against
# optimized (the prompt decides optimize's choice; the decode steps run uncaptured), then the
# llama_prefill_cache model (its DynamicCache's first cat recorded as a copy) against the plain capture
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c2 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/res2; mkdir -p $D /tmp/new
S=$R/.snap; tar -xf $S/s48new.tar -C /tmp/new; R=/tmp/new; cd $R
export PYTHONPATH=/tmp/site
save() { rm -rf $D/*/logs; tar -czf $OUT/r2.tgz -C /tmp res2; }
for n in 128 1024; do
  timeout 150 python3 benchmarks/generate.py --new-tokens 64 --prompt $n --rounds 4 --out $D/gen_$n > $D/gen_$n.log 2>&1
  grep "\[generate\]" $D/gen_$n.log; say "generate prompt $n"; save
done
timeout 150 python3 benchmarks/models.py --models llama_prefill_cache --variants eager_graph,dnntune_auto --skip-compile \
   --tune-budget-s 12 --rounds 8 --out $D/prefill_cache > $D/prefill_cache.log 2>&1
grep "\[models\]" $D/prefill_cache.log; say done; save
# added in session 48: where Swin-T's replay spends its time now (the window attention on dnntune)
l=$((575 - $(date +%s) + T0)); say "left $l"
if [ $l -gt 150 ]; then
  PYTHONPATH=/tmp/site:$R/src:$R/benchmarks timeout $((l - 10)) python3 benchmarks/graph_kernels.py --models swin_t --compile-mode default \
     --forms dnntune_auto --tune-budget-s 15 --out $D/gk > $D/gk.log 2>&1
  say gk; tail -n 60 $D/gk.log; save
fi
say done2
