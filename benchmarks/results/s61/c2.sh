# session 61, second device call (any card, say which): issue 23's table of the default path
# (eager, eager + plain CUDA graph, dnntune uncaptured, dnntune's automatic choice) on the real
# models, one process per model, fresh caches, while time lasts. On an H200 the 8 models of the
# issue's list first; on an H100 the models not timed since session 57 first (decode with a
# StaticCache, Swin-T, CLIP, timm's EfficientNet), then the 8.
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; END=480 bash benchmarks/results/s61/c2.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
END=${END:-480}; T0=$(date +%s); say() { echo "[s61c2 $(($(date +%s) - T0)) s] $*"; }
left() { echo $((END - $(date +%s) + T0)); }
cd $R; D=$OUT/s61c2; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); echo "$GPU" > $D/gpu.txt; say "$GPU"
EIGHT="resnet50 efficientnet_b0 convnext_tiny vit_b16 bert_base gpt2 llama_prefill whisper_encoder"
case "$GPU" in
*H200*) M="$EIGHT llama_decode";;
*) M="llama_decode swin_t clip_vision timm_efficientnet_b0 $EIGHT";;
esac
for m in $M; do
  l=$(left); [ $l -lt 70 ] && { say "skip $m"; continue; }
  DNNTUNE_CACHE_DIR=/tmp/c_$m timeout $l python3 benchmarks/models.py --models $m --variants eager,eager_graph,dnntune,dnntune_auto \
    --skip-compile --tune-budget-s 15 --rounds 8 --out $D/$m > $D/$m.log 2>&1
  grep "\[models\]" $D/$m.log | tail -3; rm -rf $D/$m/logs; say $m
done
