# written in session 54 for session 55's first device call (about 420 s with session 55's generate run): the GPU tests of
# session 54's stream fix (backend.recording.capture: a failed capture leaves the caller's
# stream current) and the file whose test a leaked stream failed in session 54's full GPU run;
# then pytorch_route_cost.py (what PyTorch's route costs over eager per decode forward on the
# GPU, where the CPU reads none). Session 55's second call: the whole GPU suite
# (`pytest -m gpu tests`, about 405 s on an H100), which session 54 ran before the fix.
# Run from the repo root:
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; bash benchmarks/results/h100_2026-12-07_s54/next/s55c1.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[s55c1 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/s55c1; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src
save() { tar -czf $OUT/s55c1.tgz -C /tmp s55c1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_t timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/backend/test_recording.py \
  tests/torch/test_graph_choice.py tests/torch/test_workspace.py tests/torch/test_static_caches.py \
  tests/torch/test_route_race.py > $D/pytest.txt 2>&1
tail -4 $D/pytest.txt; say tests; save
DNNTUNE_CACHE_DIR=/tmp/c_rc OUT=$D timeout 150 python3 benchmarks/results/h100_2026-12-07_s54/next/pytorch_route_cost.py > $D/route_cost.log 2>&1
grep "route_cost\]\|Traceback" $D/route_cost.log | head -30; say "route cost"; save
# added in session 55: generate() with the default DynamicCache beside an untouched eager copy
# (two copies of one model read apart on a host-bound forward: is 0.96x within that spread?)
DNNTUNE_CACHE_DIR=/tmp/c_gd timeout 120 python3 benchmarks/generate.py --prompt 128 --rounds 6 --new-tokens 48 \
  --policy heuristic --eager-copy --out $D/gen_dynamic > $D/gen_dynamic.log 2>&1
grep "\[generate\]\|Traceback" $D/gen_dynamic.log | tail -3; say "generate dynamic"; save
