# session 48 call 4: dnntune's new Triton attention kernel: its GPU tests, a micro against PyTorch's SDPA
# backends on Swin-T's windows, then Swin-T A/B (A = HEAD before the kernel, B = the kernel), tuned to completion
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c5 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/res5; mkdir -p $D /tmp/new /tmp/a
S=$R/.snap; tar -xf $S/s48k.tar -C /tmp/new; tar -xf $S/s48new.tar -C /tmp/a; R=/tmp/new; cd $R
export PYTHONPATH=/tmp/site
save() { rm -rf $D/*/logs $D/*/*/logs; tar -czf $OUT/r5.tgz -C /tmp res5; }
DNNTUNE_CACHE_DIR=/tmp/c_t PYTHONPATH=/tmp/site:$R/src timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider \
   tests/providers/test_triton_gpu.py -k attention > $D/gpu_tests.txt 2>&1
tail -n 4 $D/gpu_tests.txt; say tests; save
OUTF=$D/attn_micro.json PYTHONPATH=/tmp/site:$R/src timeout 150 python3 $S/attn_micro.py > $D/attn_micro.txt 2>&1
cat $D/attn_micro.txt | cut -c1-600; say micro; save
left=$((530 - $(date +%s) + T0))
AB_FLAGS="--rounds 8 --model-timeout-s 100" timeout $left bash benchmarks/ab_trees.sh /tmp/a/src $R/src $D/ab swin_t > $D/ab.txt 2>&1
cat $D/ab/swin_t/summary.txt 2>/dev/null; tail -2 $D/ab.txt; say done; save
