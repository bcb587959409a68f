# written in session 53 (its device budget went on refused starts) for session 54's first device
# call (about 400 s): the GPU tests of the static caches (the move-in on by default; the check
# of the second call's recording relaxed), CUDA graphs and the race of routes (a choice of
# dnntune's route races again after 64 forwards); route_probe.py (what keeps a recording on the
# second call; each route's forward time early and late in a generation); generate.py with the
# default DynamicCache (does the second race undo session 53's 0.86x?) and with a static cache.
# Run from the repo root:
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; bash benchmarks/results/h100_2026-12-06_s53/next/s54c1.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[s54c1 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/s54c1; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src
save() { tar -czf $OUT/s54c1.tgz -C /tmp s54c1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_t timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/torch/test_static_caches.py \
  tests/torch/test_cuda_graphs.py tests/torch/test_route_race.py > $D/pytest.txt 2>&1; tail -4 $D/pytest.txt; say tests; save
DNNTUNE_CACHE_DIR=/tmp/c_rp timeout 150 python3 benchmarks/results/h100_2026-12-06_s53/route_probe.py > $D/route_probe.log 2>&1
grep "route_probe\]\|Traceback" $D/route_probe.log | cut -c1-1500; say probe; save
DNNTUNE_CACHE_DIR=/tmp/c_gd timeout 100 python3 benchmarks/generate.py --prompt 128 --rounds 6 --new-tokens 48 \
  --policy heuristic --out $D/gen_dynamic > $D/gen_dynamic.log 2>&1
grep "\[generate\]" $D/gen_dynamic.log || tail -20 $D/gen_dynamic.log; say "generate dynamic"; save
DNNTUNE_CACHE_DIR=/tmp/c_gs timeout 75 python3 benchmarks/generate.py --prompt 128 --rounds 4 --new-tokens 48 \
  --cache static --policy heuristic --out $D/gen_static > $D/gen_static.log 2>&1
grep "\[generate\]" $D/gen_static.log || tail -20 $D/gen_static.log; say "generate static"; save
