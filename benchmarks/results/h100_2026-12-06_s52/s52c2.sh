# session 52 call 2: the mended GPU tests (test_cuda_graphs: a recording redone on the first call
# after optimize; test_static_caches: transformers' own compile turned off in the harness), the
# static-cache replay's default against transformers' default compile, then every gpu-marked test
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[s52c2 $(($(date +%s) - T0)) s] $*"; }
TOTAL=${TOTAL:-570}; left() { echo $((TOTAL - $(date +%s) + T0)); }
cd $R; D=/tmp/s52c2; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src
save() { tar -czf $OUT/s52c2.tgz -C /tmp s52c2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_t timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/torch/test_static_caches.py \
  tests/torch/test_cuda_graphs.py > $D/pytest_mended.txt 2>&1; tail -4 $D/pytest_mended.txt; say mended; save
DNNTUNE_CACHE_DIR=/tmp/c_p timeout 200 python3 benchmarks/results/h100_2026-12-06_s52/static_vs_compile.py \
  > $D/static_vs_compile.log 2>&1; grep "\[static_vs_compile\]" $D/static_vs_compile.log || tail -30 $D/static_vs_compile.log
say probe; save
DNNTUNE_CACHE_DIR=/tmp/c_all timeout $(($(left) - 10)) python3 -m pytest -v -m gpu -p no:cacheprovider -rf tests \
  --ignore=tests/torch/test_static_caches.py --ignore=tests/torch/test_cuda_graphs.py > $D/pytest_all.txt 2>&1
grep -c PASSED $D/pytest_all.txt; grep -E "FAILED|ERROR" $D/pytest_all.txt | head -30; tail -3 $D/pytest_all.txt; say all; save
