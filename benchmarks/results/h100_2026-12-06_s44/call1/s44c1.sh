unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c1 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w1; D=/tmp/res1; mkdir -p $W $D /tmp/base /tmp/nogqa
save() { rm -rf $D/*/logs; tar -czf $OUT/r1.tgz -C /tmp res1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
cp .snap/ov43/dec_ov.json $W/
tar -xf .snap/s42end.tar -C /tmp/base; cp -r benchmarks /tmp/base/
cp -r src benchmarks /tmp/nogqa/
sed -i 's/grouped = install_grouped_heads()/grouped = False/' /tmp/nogqa/src/dnntune/torch/optimize.py
sed -i 's/^    install_grouped_heads()$/    pass/' /tmp/nogqa/benchmarks/_models_run.py
echo "seds: $(grep -c 'grouped = False' /tmp/nogqa/src/dnntune/torch/optimize.py) $(grep -c '^    pass$' /tmp/nogqa/benchmarks/_models_run.py)"
timeout 60 python3 benchmarks/grouped_attention.py > $D/grouped_attention.txt 2>&1; tail -n 30 $D/grouped_attention.txt
say gattn; save
DNNTUNE_CACHE_DIR=$W/c timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider tests/torch/test_grouped_heads.py tests/torch/test_gated_mlp.py > $D/gpu_tests.txt 2>&1; tail -n 3 $D/gpu_tests.txt
say tests; save
run() { # tag tree model timeout ov
  ( cd $2 && PYTHONPATH=/tmp/site:$2/src:$2/benchmarks timeout $4 python3 benchmarks/models.py --models $3 \
      --variants eager,eager_graph,dnntune_auto --skip-compile --tune-budget-s 12 --rounds 8 \
      --overrides $W/$5 --model-timeout-s $(($4 - 5)) --out $D/$1 > $D/$1.log 2>&1 )
  say "$1"; grep "^| $3" $D/$1/models.md; cp $W/*.json $D/ 2>/dev/null; save
}
run dec_new $R llama_decode 45 dec_ov.json
run dec_base /tmp/base llama_decode 45 dec_ov.json
run dec_nogqa /tmp/nogqa llama_decode 45 dec_ov.json
run dec_new2 $R llama_decode 45 dec_ov.json
left=$((580 - $(date +%s) + T0))
if [ $left -gt 150 ]; then
  ( PYTHONPATH=/tmp/site:$R/src:$R/benchmarks timeout $((left - 5)) python3 benchmarks/models.py --models llama_decode \
      --variants eager,eager_graph,max_autotune,dnntune_auto --tune-budget-s 12 --rounds 8 \
      --compile-timeout-s $((left - 40)) --model-timeout-s $((left - 10)) --out $D/dec_ma > $D/dec_ma.log 2>&1 )
  say dec_ma; grep "^| llama" $D/dec_ma/models.md
fi
save; say done
