# written in session 52 (its device calls after the second could not start) for session 53's
# first device call (about 330 s): the static-cache move-in (opt-in, DNNTUNE_STATIC_CACHE_MOVE_IN=1)
# and its GPU tests; a generate() loop's recordings without and with it; generate.py --cache
# static without and with it. Run from the repo root:
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; bash benchmarks/results/h100_2026-12-06_s52/next/s53c1.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[s53c1 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/s53c1; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src
save() { tar -czf $OUT/s53c1.tgz -C /tmp s53c1; }
S=benchmarks/results/h100_2026-12-06_s52
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_t timeout 80 python3 -m pytest -q -m gpu -p no:cacheprovider tests/torch/test_static_caches.py \
  tests/torch/test_cuda_graphs.py > $D/pytest.txt 2>&1; tail -4 $D/pytest.txt; say tests; save
for m in 0 1; do
  DNNTUNE_STATIC_CACHE_MOVE_IN=$m DNNTUNE_CACHE_DIR=/tmp/c_r$m timeout 60 python3 $S/static_reuse.py > $D/reuse_$m.log 2>&1
  grep "\[reuse\]" $D/reuse_$m.log || tail -20 $D/reuse_$m.log; say "reuse move_in=$m"; save
done
for m in 0 1; do
  DNNTUNE_STATIC_CACHE_MOVE_IN=$m DNNTUNE_CACHE_DIR=/tmp/c_g$m timeout 70 python3 benchmarks/generate.py --prompt 128 \
    --rounds 3 --new-tokens 48 --cache static --policy heuristic --out $D/gen_static_$m > $D/gen_static_$m.log 2>&1
  grep "\[generate\]" $D/gen_static_$m.log || tail -20 $D/gen_static_$m.log; say "generate static move_in=$m"; save
done
