# session 47's first call (written in session 46): the GPU cases written after session 46's device time was spent
# (tests/torch/test_fold_capture.py, tests/torch/test_generate.py), then Swin-T against max-autotune with a long compile limit.
# Before running: git archive HEAD src tests pyproject.toml $(git ls-files 'benchmarks/*.py' 'benchmarks/*.sh') > .snap/s47new.tar
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c1 $(($(date +%s) - T0)) s] $*"; }
left() { echo $((575 - $(date +%s) + T0)); }
cd $R; D=/tmp/res1; mkdir -p $D /tmp/new
S=$R/.snap; tar -xf $S/s47new.tar -C /tmp/new; R=/tmp/new; cd $R
export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
save() { rm -rf $D/*/logs; tar -czf $OUT/r1.tgz -C /tmp res1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_t timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/torch/test_fold_capture.py tests/torch/test_generate.py > $D/gpu_tests.txt 2>&1; tail -n 3 $D/gpu_tests.txt; say tests; save
l=$(left); say "left $l"
timeout $((l - 10)) python3 benchmarks/models.py --models swin_t --variants eager_graph,max_autotune,dnntune_auto \
   --tune-budget-s 15 --rounds 8 --compile-timeout-s $((l - 70)) --model-timeout-s $((l - 15)) --out $D/swin > $D/swin.log 2>&1
say swin; grep "\[models\]" $D/swin.log | head -2; save; say done
