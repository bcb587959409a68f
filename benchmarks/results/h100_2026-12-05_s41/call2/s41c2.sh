unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c2 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w2; mkdir -p $W /tmp/old41 /tmp/res2
tar -xf .snap/old41.tar -C /tmp/old41; cp -r benchmarks /tmp/old41/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
timeout 90 python3 benchmarks/patch_embed.py --graphs $W/g > $OUT/patch_embed.txt 2>&1; echo "rc=$?" >> $OUT/patch_embed.txt
say micro; cat $OUT/patch_embed.txt
DNNTUNE_CACHE_DIR=$W/c2 timeout 120 python3 -m dnntune tune -g $W/g --device cuda --ranking-metric device \
     -o $W/ov.json --report $OUT/tune2.json > $OUT/tune2.txt 2>&1; echo "rc=$?" >> $OUT/tune2.txt
say tune; grep "^\[" $OUT/tune2.txt
DNNTUNE_CACHE_DIR=$W/c3 timeout 40 python3 -m pytest -m gpu -q -p no:cacheprovider tests/providers/test_torch_patch_gemm.py > $OUT/gpu_tests.txt 2>&1; echo "rc=$?" >> $OUT/gpu_tests.txt
say tests; tail -n 2 $OUT/gpu_tests.txt
run() { # tag tree models timeout
  ( cd $2 && PYTHONPATH=/tmp/site timeout $4 python3 benchmarks/models.py --models $3 \
      --variants eager,eager_graph,dnntune_auto --skip-compile --tune-budget-s 15 --rounds 8 \
      --model-timeout-s 150 --out /tmp/res2/$1 > /tmp/res2/$1.log 2>&1 )
  say "$1"; grep -A3 "^| model" /tmp/res2/$1/models.md | tail -1
}
for m in vit_b16 clip_vision swin_t convnext_tiny; do
  left=$((540 - $(date +%s) + T0)); [ $left -lt 80 ] && break
  run new_$m $R $m 70
  run old_$m /tmp/old41 $m 70
done
rm -rf /tmp/res2/*/logs; tar -czf $OUT/p2.tgz -C /tmp res2
say done
