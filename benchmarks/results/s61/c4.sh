# session 61, fourth device call (what device time was left; any card, say which): the noise floor of
# call 2's reverted rows only: ConvNeXt-T and Swin-T with eager_copy (a deep copy's eager
# forward) beside eager and dnntune uncaptured (reverted in call 2 at 0.91x and 1.18x).
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; END=200 bash benchmarks/results/s61/c4.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
END=${END:-200}; T0=$(date +%s); say() { echo "[s61c4 $(($(date +%s) - T0)) s] $*"; }
left() { echo $((END - $(date +%s) + T0)); }
cd $R; D=$OUT/s61c4; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); echo "$GPU" > $D/gpu.txt; say "$GPU"
for m in convnext_tiny swin_t; do
  l=$(left); [ $l -lt 50 ] && { say "skip $m"; continue; }
  DNNTUNE_CACHE_DIR=/tmp/c_$m timeout $l python3 benchmarks/models.py --models $m --variants eager,eager_copy,dnntune \
    --skip-compile --tune-budget-s 15 --rounds 8 --out /tmp/o_$m > $D/$m.log 2>&1
  grep "\[models\]" $D/$m.log | tail -3; say $m
done
