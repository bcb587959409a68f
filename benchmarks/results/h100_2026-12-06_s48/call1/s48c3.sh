# session 48 call 3 (written in session 47): the GPU tests of Swin's window attention and the
# lone cat, then an A/B of Swin-T: A = before the window attention (9e6d635~1), B = HEAD.
# Before running: bash .snap/mk_s48.sh (s48new.tar); s48_preswin.tar is in .snap
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c3 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/res3; mkdir -p $D /tmp/new /tmp/a
S=$R/.snap; tar -xf $S/s48new.tar -C /tmp/new; tar -xf $S/s48_preswin.tar -C /tmp/a; R=/tmp/new; cd $R
export PYTHONPATH=/tmp/site
save() { rm -rf $D/*/logs $D/*/*/logs; tar -czf $OUT/r3.tgz -C /tmp res3; }
DNNTUNE_CACHE_DIR=/tmp/c_t PYTHONPATH=/tmp/site:$R/src timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider \
   tests/torch/test_window_attention.py tests/torch/test_lone_cat.py > $D/gpu_tests.txt 2>&1
DNNTUNE_CACHE_DIR=/tmp/c_t PYTHONPATH=/tmp/site:$R/src timeout 150 python3 -m pytest -q -p no:cacheprovider \
   tests/torch/test_window_attention.py -k torchvisions_swin >> $D/gpu_tests.txt 2>&1
tail -n 3 $D/gpu_tests.txt; say tests; save
left=$((580 - $(date +%s) + T0))
AB_FLAGS="--rounds 8 --model-timeout-s 100" timeout $left bash benchmarks/ab_trees.sh /tmp/a/src $R/src $D/ab swin_t > $D/ab.txt 2>&1
cat $D/ab/swin_t/summary.txt 2>/dev/null; tail -2 $D/ab.txt; say done; save
