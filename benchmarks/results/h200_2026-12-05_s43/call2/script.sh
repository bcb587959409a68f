unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c2 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w2; D=/tmp/res2; mkdir -p $W $D /tmp/base /tmp/nogqa /tmp/nomul
save() { rm -rf $D/*/logs; tar -czf $OUT/r2.tgz -C /tmp res2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
cp .snap/ov43/*.json $W/
tar -xf .snap/s42end.tar -C /tmp/base; cp -r benchmarks /tmp/base/
cp -r src benchmarks /tmp/nogqa/; cp -r src benchmarks /tmp/nomul/
sed -i 's/grouped = install_grouped_heads()/grouped = False/' /tmp/nogqa/src/dnntune/torch/optimize.py
sed -i 's/^    install_grouped_heads()$/    pass/' /tmp/nogqa/benchmarks/_models_run.py
sed -i 's/        for layer in _fuse_products(graph, module)/        for layer in []/' /tmp/nomul/src/dnntune/torch/fusion.py
echo "seds: $(grep -c 'grouped = False' /tmp/nogqa/src/dnntune/torch/optimize.py) $(grep -c '^    pass$' /tmp/nogqa/benchmarks/_models_run.py) $(grep -c 'for layer in \[\]' /tmp/nomul/src/dnntune/torch/fusion.py)"
timeout 60 python3 .snap/attn_decode.py > $D/attn_decode.txt 2>&1; cat $D/attn_decode.txt
say attn; save
run() { # tag tree model timeout ov [variants]
  ( cd $2 && PYTHONPATH=/tmp/site:$2/src:$2/benchmarks timeout $4 python3 benchmarks/models.py --models $3 \
      --variants ${6:-eager,eager_graph,dnntune_auto} --skip-compile --tune-budget-s 12 --rounds 8 \
      --overrides $W/$5 --model-timeout-s $(($4 - 5)) --out $D/$1 > $D/$1.log 2>&1 )
  say "$1"; grep "^| $3" $D/$1/models.md; cp $W/*.json $D/ 2>/dev/null; save
}
run dec_new $R llama_decode 50 dec_ov.json
run dec_nogqa /tmp/nogqa llama_decode 50 dec_ov.json
run dec_nomul /tmp/nomul llama_decode 50 dec_ov.json
run dec_base /tmp/base llama_decode 50 dec_ov.json
run dec_new2 $R llama_decode 50 dec_ov.json
left=$((575 - $(date +%s) + T0))
if [ $left -gt 200 ]; then
  ( PYTHONPATH=/tmp/site:$R/src:$R/benchmarks timeout $((left - 5)) python3 benchmarks/models.py --models llama_prefill \
      --variants eager,eager_graph,max_autotune,dnntune_auto --tune-budget-s 12 --rounds 8 \
      --compile-timeout-s $((left - 60)) --model-timeout-s $((left - 10)) --out $D/pre_ma > $D/pre_ma.log 2>&1 )
  say pre_ma; grep "^| llama" $D/pre_ma/models.md
fi
save; say done
