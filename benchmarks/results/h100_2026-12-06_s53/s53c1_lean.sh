# session 53, first device call, lean (device starts kept failing: 6 refusals cost 720 s): the
# static-cache move-in's GPU tests, generate.py --cache static without and with the move-in, and
# generate.py with the default DynamicCache (forms in ABBA order, per-round ratios). Run from the repo root:
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; bash benchmarks/results/h100_2026-12-06_s53/s53c1_lean.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[s53c1 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/s53c1; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src
save() { tar -czf $OUT/s53c1.tgz -C /tmp s53c1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_t timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/torch/test_static_caches.py \
  tests/torch/test_cuda_graphs.py > $D/pytest.txt 2>&1; tail -4 $D/pytest.txt; say tests; save
for m in 1 0; do
  DNNTUNE_STATIC_CACHE_MOVE_IN=$m DNNTUNE_CACHE_DIR=/tmp/c_g$m timeout 75 python3 benchmarks/generate.py --prompt 128 \
    --rounds 4 --new-tokens 48 --cache static --policy heuristic --out $D/gen_static_$m > $D/gen_static_$m.log 2>&1
  grep "\[generate\]" $D/gen_static_$m.log || tail -20 $D/gen_static_$m.log; say "generate static move_in=$m"; save
done
DNNTUNE_CACHE_DIR=/tmp/c_gd timeout 100 python3 benchmarks/generate.py --prompt 128 --rounds 6 --new-tokens 48 \
  --policy heuristic --out $D/gen_dynamic > $D/gen_dynamic.log 2>&1
grep "\[generate\]" $D/gen_dynamic.log || tail -20 $D/gen_dynamic.log; say "generate dynamic"; save
