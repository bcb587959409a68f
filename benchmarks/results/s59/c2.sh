# session 59, second device call (about 560 s; any card, say which):
# on an H200: issue 23's table of the default path on the 8 real models (as s57/c2.sh);
# on an H100 (its GPU tests ran in s59/c1.sh):
# EfficientNet-B0's default path at tune budgets of 15 s and 45 s
# (is its gap to max-autotune the budget?), then its kernels against torch.compile's default
# mode (graph_kernels.py: what the compiler fuses that dnntune's forward leaves apart).
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; bash benchmarks/results/s59/c2.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
END=${END:-570}; T0=$(date +%s); say() { echo "[s59c2 $(($(date +%s) - T0)) s] $*"; }
cd $R; export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks; D=/tmp/s59c2; mkdir -p $D
save() { tar -czf $OUT/s59c2.tgz -C /tmp s59c2; }
left() { echo $((END - $(date +%s) + T0)); }
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); echo "$GPU" > $D/gpu.txt; say "$GPU"
case "$GPU" in
*H200*)
  for m in resnet50 efficientnet_b0 convnext_tiny vit_b16 bert_base gpt2 llama_prefill whisper_encoder; do
    l=$(left); [ $l -lt 60 ] && { say "skip $m"; continue; }
    DNNTUNE_CACHE_DIR=/tmp/c_$m timeout $l python3 benchmarks/models.py --models $m --variants eager,eager_graph,dnntune_auto \
      --skip-compile --tune-budget-s 15 --rounds 8 --out $D/$m > $D/$m.log 2>&1
    grep "\[models\]" $D/$m.log | tail -2; rm -rf $D/$m/logs; say $m; save
  done;;
*)
  for b in 15 45; do
    l=$(left); [ $l -lt 100 ] && { say "skip budget $b"; continue; }
    DNNTUNE_CACHE_DIR=/tmp/c_e$b timeout $l python3 benchmarks/models.py --models efficientnet_b0 --variants eager,eager_graph,dnntune_auto \
      --skip-compile --tune-budget-s $b --rounds 8 --out $D/effnet_b$b > $D/effnet_b$b.log 2>&1
    grep "\[models\]" $D/effnet_b$b.log | tail -2; rm -rf $D/effnet_b$b/logs; say "effnet budget $b"; save
  done
  l=$(left); [ $l -gt 90 ] && { DNNTUNE_CACHE_DIR=/tmp/c_k timeout $l python3 benchmarks/graph_kernels.py --models efficientnet_b0 \
    --compile-mode default --tune-budget-s 15 --forms dnntune_auto --out $D/kernels > $D/kernels.log 2>&1; tail -60 $D/kernels.log; say kernels; save; }
  ;;
esac
