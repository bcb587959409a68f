# GPU tests (output tails, dtype-branch traces); GPT-2 and LLaMA prefill against max-autotune side by side; Whisper before/after the dtype traces
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c1 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w1; D=/tmp/res1; mkdir -p $W $D /tmp/base2 /tmp/new
S=$R/.snap; tar -xf $S/s45new.tar -C /tmp/new; R=/tmp/new; cd $R; export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
save() { rm -rf $D/*/logs; tar -czf $OUT/r1.tgz -C /tmp res1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
tar -xf $S/s45base.tar -C /tmp/base2; cp -r benchmarks /tmp/base2/
DNNTUNE_CACHE_DIR=$W/c timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/torch/test_output_tails.py tests/torch/test_pass_through.py tests/torch/test_transformers_modules.py tests/torch/test_dtypes_seen.py > $D/gpu_tests.txt 2>&1; tail -n 3 $D/gpu_tests.txt; say tests; save
ma() { # model timeout
  timeout $2 python3 benchmarks/models.py --models $1 \
      --variants eager,eager_graph,max_autotune,dnntune_auto --tune-budget-s 12 --rounds 8 \
      --overrides $W/$1_ma.json --compile-timeout-s $(($2 - 55)) --model-timeout-s $(($2 - 5)) --out $D/$1_ma > $D/$1_ma.log 2>&1
  say "$1 ma"; grep "^| $1" $D/$1_ma/models.md; save
}
ma gpt2 200
ma llama_prefill 200
run() { # tag tree model timeout overrides
  ( cd $2 && PYTHONPATH=/tmp/site:$2/src:$2/benchmarks timeout $4 python3 benchmarks/models.py --models $3 \
      --variants eager,eager_graph,dnntune_auto --skip-compile --tune-budget-s 12 --rounds 8 \
      --overrides $W/$5.json --model-timeout-s $(($4 - 5)) --out $D/$1 > $D/$1.log 2>&1 )
  say "$1"; grep "^| $3" $D/$1/models.md; save
}
[ $((590 - $(date +%s) + T0)) -gt 45 ] && run wh_new $R whisper_encoder 45 wh_new
[ $((590 - $(date +%s) + T0)) -gt 45 ] && run wh_base /tmp/base2 whisper_encoder 45 wh_base
save; say done
