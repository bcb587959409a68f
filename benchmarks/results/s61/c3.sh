# session 61, third device call (any card, say which): the noise floor of call 2's reverted
# rows (ConvNeXt-T's uncaptured dnntune read 0.91x eager although reverted to PyTorch's forward;
# Swin-T's 1.18x): eager_copy (a deep copy's eager forward) beside them; then the rest of the
# 8 models' default path, each with its eager_copy.
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; END=470 bash benchmarks/results/s61/c3.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
END=${END:-470}; T0=$(date +%s); say() { echo "[s61c3 $(($(date +%s) - T0)) s] $*"; }
left() { echo $((END - $(date +%s) + T0)); }
cd $R; D=$OUT/s61c3; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); echo "$GPU" > $D/gpu.txt; say "$GPU"
one() {  # model variants
  l=$(left); [ $l -lt 60 ] && { say "skip $1"; return; }
  DNNTUNE_CACHE_DIR=/tmp/c_$1 timeout $l python3 benchmarks/models.py --models $1 --variants $2 \
    --skip-compile --tune-budget-s 15 --rounds 8 --out /tmp/o_$1 > $D/$1.log 2>&1
  grep "\[models\]" $D/$1.log | tail -3; say $1
}
one convnext_tiny eager,eager_copy,eager_graph,dnntune,dnntune_auto
for m in vit_b16 bert_base gpt2 llama_prefill whisper_encoder swin_t; do one $m eager,eager_copy,eager_graph,dnntune_auto; done
