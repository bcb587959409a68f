# session 62, first device call (about 570 s; any card, say which):
# on an H200: issue 23's table of the default path on the 8 real models, each with eager_copy (a deep
#   copy's eager forward: the noise floor between two copies of one forward) beside eager, the plain
#   capture and dnntune's automatic choice;
# on an H100: the whole GPU suite (`pytest -m gpu tests`) on session 61's final tree (c62c404), none
#   of whose commits after 3ad737b had run on a GPU.
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; END=570 bash benchmarks/results/s62/c1.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
END=${END:-570}; T0=$(date +%s); say() { echo "[s62c1 $(($(date +%s) - T0)) s] $*"; }
left() { echo $((END - $(date +%s) + T0)); }
cd $R; D=$OUT/s62c1; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); echo "$GPU" > $D/gpu.txt; say "$GPU"
git -C $R log -1 --format=%H > $D/tree.txt 2>/dev/null
case "$GPU" in
*H200*)
  for m in resnet50 efficientnet_b0 convnext_tiny vit_b16 bert_base llama_prefill llama_decode whisper_encoder; do
    l=$(left); [ $l -lt 50 ] && { say "skip $m"; continue; }
    DNNTUNE_CACHE_DIR=/tmp/c_$m timeout $l python3 benchmarks/models.py --models $m \
      --variants eager,eager_copy,eager_graph,dnntune_auto --skip-compile --tune-budget-s 15 --rounds 8 \
      --out /tmp/o_$m > $D/$m.log 2>&1
    grep "\[models\]" $D/$m.log | tail -3; cp /tmp/o_$m/*.json $D/ 2>/dev/null; say $m
  done;;
*)
  DNNTUNE_CACHE_DIR=/tmp/c_all timeout $(( $(left) - 10 )) python3 -m pytest -q -p no:cacheprovider -m gpu tests -rs \
    --durations=15 > $D/gpu_suite.txt 2>&1; echo "rc=$?" >> $D/gpu_suite.txt; tail -25 $D/gpu_suite.txt;;
esac
