# session 57, second-chance device call (about 560 s; any card, say which):
# on an H200: issue 23's table of the default path on the 8 real models (as s54/c1.sh);
# on an H100: issue 25's suite run with the retrained model (an H100 group since 488987c), so
# HeuristicMode.B's plans are timed beside A's on this card (in-sample: the model was trained
# on these 46 problems' H100 labels), the GPU tests of the stores, then the Whisper encoder
# beside torch.compile(mode="max-autotune") if time is left.
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; bash benchmarks/results/s57/c2.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
END=${END:-570}; T0=$(date +%s); say() { echo "[s57c2 $(($(date +%s) - T0)) s] $*"; }
cd $R; export PYTHONPATH=/tmp/site:$R/src; D=/tmp/s57c2; mkdir -p $D
save() { tar -czf $OUT/s57c2.tgz -C /tmp s57c2; }
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); echo "$GPU" > $D/gpu.txt; say "$GPU"
case "$GPU" in
*H200*)
  for m in resnet50 efficientnet_b0 convnext_tiny vit_b16 bert_base gpt2 llama_prefill whisper_encoder; do
    left=$((END - $(date +%s) + T0)); [ $left -lt 60 ] && { say "skip $m"; continue; }
    DNNTUNE_CACHE_DIR=/tmp/c_$m timeout $left python3 benchmarks/models.py --models $m --variants eager,eager_graph,dnntune_auto \
      --skip-compile --tune-budget-s 15 --rounds 8 --out $D/$m > $D/$m.log 2>&1
    grep "\[models\]" $D/$m.log | tail -2; rm -rf $D/$m/logs; say $m; save
  done;;
*)
  DNNTUNE_CACHE_DIR=/tmp/c_s timeout 200 python3 benchmarks/run.py --ranking-metric latency --skip-compile --heuristic-b \
    --modes warm --budget-s 180 --seed 4 --out $D/suite_b > $D/suite_b.log 2>&1; tail -2 $D/suite_b.log; say suite; save
  DNNTUNE_CACHE_DIR=/tmp/c_t timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/stores tests/providers/test_cudnn_plan_store_gpu.py \
    tests/learning > $D/pytest.txt 2>&1; tail -3 $D/pytest.txt; say tests; save
  left=$((END - $(date +%s) + T0))
  [ $left -gt 200 ] && { DNNTUNE_CACHE_DIR=/tmp/c_w timeout $left python3 benchmarks/models.py --models whisper_encoder \
    --variants eager,eager_graph,max_autotune,dnntune_auto --compile-timeout-s $((left - 90)) --tune-budget-s 15 --rounds 8 \
    --out $D/whisper_ma > $D/whisper_ma.log 2>&1; grep "\[models\]" $D/whisper_ma.log | tail -2; rm -rf $D/whisper_ma/logs; say whisper; save; };;
esac
