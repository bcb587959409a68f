unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c2 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w2; mkdir -p $W /tmp/old40 /tmp/res2
tar -xf .snap/old40.tar -C /tmp/old40; cp -r benchmarks /tmp/old40/
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
( DNNTUNE_CACHE_DIR=$W/c1 timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rs \
    tests/torch/test_module_tails.py tests/torch/test_fusion.py tests/torch/test_written_activations.py \
    > $OUT/gpu_tests.txt 2>&1; echo "rc=$?" >> $OUT/gpu_tests.txt ) &
( DNNTUNE_CACHE_DIR=$W/zoo timeout 150 python3 benchmarks/model_conformance.py --device cuda \
    --zoo timm_vit_tiny,timm_deit_tiny,timm_mobilevit,timm_dla,timm_levit,hf_t5_encoder \
    --count 12 --time-budget-s 135 --out "$W/zoo" > "$W/zoo.log" 2>&1; echo "rc=$?" >> $W/zoo.log ) &
wait
say "phase 1"; tail -n 2 $OUT/gpu_tests.txt; tail -n 2 $W/zoo.log
tar -czf "$OUT/p1.tgz" -C "$W" zoo zoo.log 2>/dev/null
timeout 80 python3 .snap/resid.py > $OUT/resid.txt 2>&1; say resid; cat $OUT/resid.txt | grep -v Warn | tail -7
run() { # tag tree models timeout
  ( cd $2 && PYTHONPATH=/tmp/site timeout $4 python3 benchmarks/models.py --models $3 \
      --variants eager,eager_graph,dnntune_auto --skip-compile --tune-budget-s 15 --rounds 8 \
      --model-timeout-s 150 --out /tmp/res2/$1 > /tmp/res2/$1.log 2>&1 )
  say "$1"; grep -A3 "^| model" /tmp/res2/$1/models.md | head -3
}
left=$((530 - $(date +%s) + T0)); say "timing with $left s"
run new $R vit_b16 $((left / 2))
run old /tmp/old40 vit_b16 $((left / 2 - 5))
rm -rf /tmp/res2/*/logs; tar -czf $OUT/p2.tgz -C /tmp res2
say done
