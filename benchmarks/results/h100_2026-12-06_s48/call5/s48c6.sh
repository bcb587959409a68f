# session 48 call 5: the Triton attention kernel's GPU tests with its small-tile default, then Swin-T as a
# user runs it (optimize's default 15 s budget, fresh caches and override file per run): A = 673f23d
# (before the kernel), B = the kernel + short attention on Triton first; runs alternated A, B, A, B
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c6 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/res6; mkdir -p $D /tmp/new /tmp/a
S=$R/.snap; tar -xf $S/s48k.tar -C /tmp/new; tar -xf $S/s48new.tar -C /tmp/a; R=/tmp/new; cd $R
save() { rm -rf $D/*/logs $D/*/*/logs; tar -czf $OUT/r6.tgz -C /tmp res6; }
DNNTUNE_CACHE_DIR=/tmp/c_t PYTHONPATH=/tmp/site:$R/src timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider \
   tests/providers/test_triton_gpu.py -k attention > $D/gpu_tests.txt 2>&1
tail -n 2 $D/gpu_tests.txt; say tests; save
for run in a1 b1 a2 b2; do
  left=$((400 - $(date +%s) + T0)); [ $left -lt 60 ] && break
  case $run in a*) src=/tmp/a/src;; b*) src=$R/src;; esac
  DNNTUNE_CACHE_DIR=/tmp/cache_$run PYTHONPATH=/tmp/site:$src timeout $left python3 benchmarks/models.py --models swin_t \
     --variants eager_graph,dnntune_auto --tune-budget-s 15 --rounds 8 --overrides /tmp/ov_$run.json --out $D/$run > $D/$run.log 2>&1
  grep "\[models\]" $D/$run.log; python3 -c "import json;j=json.load(open('$D/$run/models.json'));print(j['versions']['dnntune_path'])"; say $run; save
done
say done
