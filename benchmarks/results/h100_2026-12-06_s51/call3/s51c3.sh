# session 51 call 3: static-cache decode replay (GPU tests + generate.py --cache static), then
# the CUDA-graph GPU tests, within TOTAL seconds (default 330)
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[s51c3 $(($(date +%s) - T0)) s] $*"; }
TOTAL=${TOTAL:-330}; left() { echo $((TOTAL - $(date +%s) + T0)); }
cd $R; D=/tmp/s51c3; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src
save() { tar -czf $OUT/s51c3.tgz -C /tmp s51c3; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_t timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/torch/test_static_caches.py \
  > $D/pytest_static.txt 2>&1; tail -8 $D/pytest_static.txt; say tests_static; save
DNNTUNE_CACHE_DIR=/tmp/c_gs timeout 130 python3 benchmarks/generate.py --new-tokens 64 --prompt 128 \
    --rounds 4 --without-race --cache static --out $D/gen_static > $D/gen_static.log 2>&1
grep "\[generate\]" $D/gen_static.log || tail -20 $D/gen_static.log; say "generate static"; save
[ $(left) -gt 30 ] && DNNTUNE_CACHE_DIR=/tmp/c_t2 timeout $(left) python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/torch/test_piecewise_capture.py tests/torch/test_replay_state.py tests/torch/test_fresh_outputs.py \
  tests/torch/test_generate.py tests/torch/test_cuda_graphs.py > $D/pytest_graphs.txt 2>&1; tail -8 $D/pytest_graphs.txt; say tests_graphs; save
