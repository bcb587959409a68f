# session 50 call 2: the default path on real models, HEAD, side by side per model (one process each):
# eager, eager captured in a plain CUDA graph, dnntune uncaptured (cuda_graph=False), dnntune's default (auto)
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c2 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=$OUT/c2; mkdir -p $D
export PYTHONPATH=/tmp/site:$R/src
nvidia-smi --query-gpu=name --format=csv,noheader > $D/gpu.txt
for m in ${MODELS:-efficientnet_b0 whisper_encoder bert_base vit_b16 resnet50 llama_prefill gpt2 convnext_tiny}; do
  left=$((575 - $(date +%s) + T0)); [ $left -lt 75 ] && { say "skip $m"; continue; }
  DNNTUNE_CACHE_DIR=/tmp/c_$m timeout $left python3 benchmarks/models.py --models $m --variants eager,eager_graph,dnntune,dnntune_auto \
    --skip-compile --tune-budget-s 15 --rounds 8 --out $D/$m > $D/$m.log 2>&1
  grep "\[models\]" $D/$m.log; rm -rf $D/$m/logs; say $m
done
say done
