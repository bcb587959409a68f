# session 47 call 2: GPT-2's cache-update copy kernels (micro), then where Swin-T's and ConvNeXt-T's
# replays spend their time against torch.compile's default mode (graph_kernels.py)
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c2 $(($(date +%s) - T0)) s] $*"; }
left() { echo $((575 - $(date +%s) + T0)); }
cd $R; D=/tmp/res2; mkdir -p $D /tmp/new
S=$R/.snap; tar -xf $S/s47new.tar -C /tmp/new; R=/tmp/new; cd $R
export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
save() { rm -rf $D/*/logs; tar -czf $OUT/r2.tgz -C /tmp res2; }
python3 $S/cat_micro.py > $D/cat_micro.txt 2>&1; head -n 1 $D/cat_micro.txt; say micro; save
l=$(left); say "left $l"
timeout $((l - 10)) python3 benchmarks/graph_kernels.py --models swin_t,convnext_tiny --compile-mode default \
   --forms dnntune_auto --tune-budget-s 15 --out $D/gk > $D/gk.log 2>&1
say gk; tail -n 60 $D/gk.log; save; say done
