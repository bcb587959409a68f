# written in session 51 (whose device calls after the first two could not start) for session 52's
# first device call: the static-cache decode replay (its GPU tests, then generate.py --cache
# static, opted in), the CUDA-graph GPU tests the session's changes touch, and generate.py's
# dynamic cache with two forms (is the per-call gap the without-race form's doing?), within
# TOTAL seconds (default 560). Run from the repo root:
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; bash benchmarks/results/h100_2026-12-06_s51/next/s52c1.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[s52c1 $(($(date +%s) - T0)) s] $*"; }
TOTAL=${TOTAL:-560}; left() { echo $((TOTAL - $(date +%s) + T0)); }
cd $R; D=/tmp/s52c1; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src
save() { tar -czf $OUT/s52c1.tgz -C /tmp s52c1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_t timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/torch/test_static_caches.py \
  > $D/pytest_static.txt 2>&1; tail -8 $D/pytest_static.txt; say tests_static; save
DNNTUNE_STATIC_CACHE_REPLAY=1 DNNTUNE_CACHE_DIR=/tmp/c_gs timeout 130 python3 benchmarks/generate.py --new-tokens 64 --prompt 128 \
    --rounds 4 --without-race --cache static --out $D/gen_static > $D/gen_static.log 2>&1
grep "\[generate\]" $D/gen_static.log || tail -20 $D/gen_static.log; say "generate static"; save
[ $(left) -gt 30 ] && DNNTUNE_CACHE_DIR=/tmp/c_t2 timeout $(($(left) - 100)) python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/torch/test_piecewise_capture.py tests/torch/test_replay_state.py tests/torch/test_fresh_outputs.py \
  tests/torch/test_generate.py tests/torch/test_cuda_graphs.py tests/torch/test_route_race.py > $D/pytest_graphs.txt 2>&1
tail -8 $D/pytest_graphs.txt; say tests_graphs; save
[ $(left) -gt 90 ] && DNNTUNE_CACHE_DIR=/tmp/c_gd timeout $(left) python3 benchmarks/generate.py --new-tokens 64 --prompt 128 \
    --rounds 6 --cache dynamic --out $D/gen_dynamic2 > $D/gen_dynamic2.log 2>&1
grep "\[generate\]" $D/gen_dynamic2.log; say "generate dynamic, two forms"; save
