# session 57, fifth device call (about 250 s): the Whisper encoder after optimize makes its
# residual stream row-major once (_stream_layout), side by side with eager, the plain capture
# and max-autotune; then the GPU tests of CUDA-graph capture and auto's choice.
#   export R=$PWD; export PYTHONUNBUFFERED=1; bash benchmarks/results/s57/c5.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[s57c5 $(($(date +%s) - T0)) s] $*"; }
cd $R; export PYTHONPATH=$R/src; D=/tmp/s57c5; mkdir -p $D
save() { tar -czf $OUT/s57c5.tgz -C /tmp s57c5; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_w5 timeout 170 python3 benchmarks/models.py --models whisper_encoder \
  --variants eager,eager_graph,max_autotune,dnntune,dnntune_auto --compile-timeout-s 110 --tune-budget-s 15 --rounds 8 \
  --out $D/whisper > $D/whisper.log 2>&1; grep "\[models\]" $D/whisper.log | tail -2; say whisper; save
left=$((265 - $(date +%s) + T0))
[ $left -gt 30 ] && { DNNTUNE_CACHE_DIR=/tmp/c_t5 timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/torch/test_graph_choice.py tests/torch/test_piecewise_capture.py tests/torch/test_cuda_graphs.py > $D/pytest.txt 2>&1
  tail -3 $D/pytest.txt; say tests; save; }
