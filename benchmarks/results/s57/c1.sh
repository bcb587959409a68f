# written in session 56 for session 57's first device call (about 560 s; any card, say which):
# 1. ConvNeXt-T's lost dnntune forward (session 56, H100: auto's check read dnntune's replayed
#    forward at 6.3 ms against PyTorch's replayed 3.4 ms; session 50: dnntune + graph 1.31x
#    eager): models.py with its log kept (the plans per layer, the races, the recordings) and
#    then the same with --tune-budget-s 60 (is it the 15 s
#    budget's untuned signatures?);
# 2. the three models session 56's call had no time for (vit_b16, efficientnet_b0,
#    whisper_encoder), as s56/c1.sh times them.
# Call 2: benchmarks/results/s56/c2.sh (the whole GPU suite, about 405 s).
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; bash benchmarks/results/s57/c1.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
END=${END:-570}; T0=$(date +%s); say() { echo "[s57c1 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/s57c1; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src
save() { tar -czf $OUT/s57c1.tgz -C /tmp s57c1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
for budget in 15 60; do
  left=$((END - 200 - $(date +%s) + T0)); [ $left -lt 60 ] && { say "skip convnext $budget"; continue; }
  DNNTUNE_CACHE_DIR=/tmp/c_cn$budget timeout $left python3 benchmarks/models.py --models convnext_tiny \
    --variants eager,eager_graph,dnntune_auto --skip-compile --tune-budget-s $budget --rounds 8 \
    --out $D/convnext_b$budget > $D/convnext_b$budget.log 2>&1
  grep "\[models\]" $D/convnext_b$budget.log | tail -2; say "convnext budget $budget"; save
done
for m in vit_b16 efficientnet_b0 whisper_encoder; do
  left=$((END - $(date +%s) + T0)); [ $left -lt 50 ] && { say "skip $m"; continue; }
  DNNTUNE_CACHE_DIR=/tmp/c_$m timeout $left python3 benchmarks/models.py --models $m --variants eager,eager_graph,dnntune,dnntune_auto \
    --skip-compile --tune-budget-s 15 --rounds 8 --out $D/$m > $D/$m.log 2>&1
  grep "\[models\]" $D/$m.log | tail -2; rm -rf $D/$m/logs; say $m; save
done
