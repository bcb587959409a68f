# A/B: the output tails (base a337dac) on decode, GPT-2, prefill, one override file per model; decode with a 5 s budget; then kernels of Whisper and decode against max-autotune
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c2 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w2; D=/tmp/res2; mkdir -p $W $D /tmp/base /tmp/base2 /tmp/new
S=$R/.snap; tar -xf $S/s45new.tar -C /tmp/new; R=/tmp/new; cd $R; export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
save() { rm -rf $D/*/logs; tar -czf $OUT/r2.tgz -C /tmp res2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
tar -xf $S/s44pre_tails.tar -C /tmp/base; cp -r benchmarks /tmp/base/
tar -xf $S/s45base.tar -C /tmp/base2; cp -r benchmarks /tmp/base2/
run() { # tag tree model timeout overrides
  ( cd $2 && PYTHONPATH=/tmp/site:$2/src:$2/benchmarks timeout $4 python3 benchmarks/models.py --models $3 \
      --variants eager,eager_graph,dnntune_auto --skip-compile --tune-budget-s ${BUDGET:-12} --rounds 8 \
      --overrides $W/$5.json --model-timeout-s $(($4 - 5)) --out $D/$1 > $D/$1.log 2>&1 )
  say "$1"; grep "^| $3" $D/$1/models.md; cp $W/*.json $D/ 2>/dev/null; save
}
DNNTUNE_CACHE_DIR=$W/c timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/torch/test_dtypes_seen.py > $D/gpu_tests.txt 2>&1; tail -n 2 $D/gpu_tests.txt; say tests
run dec_new $R llama_decode 45 dec
run dec_base /tmp/base llama_decode 45 dec
run gpt2_new $R gpt2 50 gpt2
run gpt2_base /tmp/base gpt2 50 gpt2
run pre_new $R llama_prefill 50 pre
run pre_base /tmp/base llama_prefill 50 pre
[ $((585 - $(date +%s) + T0)) -gt 45 ] && BUDGET=5 run dec_b5 $R llama_decode 40 dec_b5
for m in whisper_encoder llama_decode; do
  left=$((585 - $(date +%s) + T0)); [ $left -lt 100 ] && break
  timeout $left python3 benchmarks/graph_kernels.py --models $m --forms dnntune_auto --compile-mode max-autotune \
      --tune-budget-s 12 --rounds 8 --out $D/gk_$m > $D/gk_$m.txt 2>&1
  say gk $m; head -n 30 $D/gk_$m.txt; save
done
save; say done
