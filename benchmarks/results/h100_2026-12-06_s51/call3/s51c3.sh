# session 51 call 3: static-cache decode replay (GPU tests + generate.py --cache static), the
# dynamic cache with two forms, and the CUDA-graph GPU tests
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[s51c3 $(($(date +%s) - T0)) s] $*"; }
left() { echo $(($1 - $(date +%s) + T0)); }
cd $R; D=/tmp/s51c3; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src
save() { tar -czf $OUT/s51c3.tgz -C /tmp s51c3; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_t timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/torch/test_static_caches.py \
  > $D/pytest_static.txt 2>&1; tail -8 $D/pytest_static.txt; say tests_static; save
DNNTUNE_CACHE_DIR=/tmp/c_gs timeout 150 python3 benchmarks/generate.py --new-tokens 64 --prompt 128 \
    --rounds 6 --without-race --cache static --out $D/gen_static > $D/gen_static.log 2>&1
grep "\[generate\]" $D/gen_static.log || tail -20 $D/gen_static.log; say "generate static"; save
DNNTUNE_CACHE_DIR=/tmp/c_t2 timeout $(left 370) python3 -m pytest -q -m gpu -p no:cacheprovider tests/torch/test_piecewise_capture.py \
  tests/torch/test_fresh_outputs.py tests/torch/test_replay_state.py tests/torch/test_generate.py tests/torch/test_cuda_graphs.py \
  > $D/pytest_graphs.txt 2>&1; tail -8 $D/pytest_graphs.txt; say tests_graphs; save
# the dynamic cache without the third form: is the per-call gap the without-race form's doing?
[ $(left 440) -gt 60 ] && DNNTUNE_CACHE_DIR=/tmp/c_gd timeout $(left 440) python3 benchmarks/generate.py --new-tokens 64 --prompt 128 \
    --rounds 6 --cache dynamic --out $D/gen_dynamic2 > $D/gen_dynamic2.log 2>&1
grep "\[generate\]" $D/gen_dynamic2.log; say "generate dynamic, two forms"; save
