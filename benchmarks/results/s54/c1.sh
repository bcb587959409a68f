# session 54, first device call. On an H200: issue 23's table of the default path on the 8 real
# models (as session 50's s50c2.sh on an H100), after the GPU tests of s54c1.sh. On any other
# card: session 53's next/s54c1.sh (GPU tests, route_probe.py, generate.py dynamic and static).
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[s54 $(($(date +%s) - T0)) s] $*"; }
cd $R; export PYTHONPATH=/tmp/site:$R/src
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); say "$GPU"
case "$GPU" in
*H200*)
  D=/tmp/s54h; mkdir -p $D; echo "$GPU" > $D/gpu.txt; save() { tar -czf $OUT/s54h.tgz -C /tmp s54h; }
  DNNTUNE_CACHE_DIR=/tmp/c_t timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/torch/test_static_caches.py \
    tests/torch/test_cuda_graphs.py tests/torch/test_route_race.py > $D/pytest.txt 2>&1; tail -4 $D/pytest.txt; say tests; save
  for m in ${MODELS:-resnet50 efficientnet_b0 convnext_tiny vit_b16 bert_base gpt2 llama_prefill whisper_encoder}; do
    left=$((585 - $(date +%s) + T0)); [ $left -lt 60 ] && { say "skip $m"; continue; }
    DNNTUNE_CACHE_DIR=/tmp/c_$m timeout $left python3 benchmarks/models.py --models $m --variants eager,eager_graph,dnntune,dnntune_auto \
      --skip-compile --tune-budget-s 15 --rounds 8 --out $D/$m > $D/$m.log 2>&1
    grep "\[models\]" $D/$m.log | tail -3; rm -rf $D/$m/logs; say $m; save
  done;;
*) bash benchmarks/results/h100_2026-12-06_s53/next/s54c1.sh;;
esac
