# session 56, first device call, on whichever card comes (H200 asked for): session 54's GPU tests
# of its stream fix (s55c1.sh's); issue 23's table of the default path on the real models (as
# session 50's call 2, as many as fit by 440 s), now on session 55's trace guards; then
# generate.py --eager-copy and, if time is left, pytorch_route_cost.py. Run from the repo root:
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; bash benchmarks/results/s56/c1.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
END=${END:-585}; T0=$(date +%s); say() { echo "[s56c1 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/s56c1; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src
save() { tar -czf $OUT/s56c1.tgz -C /tmp s56c1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt; git log -1 --format=%h > $D/tree.txt 2>/dev/null
# session 54's stream-fix tests and the files its full run failed in (the full suite is call 2)
DNNTUNE_CACHE_DIR=/tmp/c_t timeout $((END / 4)) python3 -m pytest -q -m gpu -p no:cacheprovider tests/backend/test_recording.py \
  tests/torch/test_graph_choice.py tests/torch/test_workspace.py tests/torch/test_static_caches.py \
  tests/torch/test_route_race.py > $D/pytest.txt 2>&1
tail -4 $D/pytest.txt; say tests; save
for m in ${MODELS:-resnet50 convnext_tiny bert_base llama_prefill gpt2 vit_b16 efficientnet_b0 whisper_encoder}; do
  left=$((END - 145 - $(date +%s) + T0)); [ $left -lt 40 ] && { say "skip $m"; continue; }
  DNNTUNE_CACHE_DIR=/tmp/c_$m timeout $left python3 benchmarks/models.py --models $m --variants eager,eager_graph,dnntune,dnntune_auto \
    --skip-compile --tune-budget-s 15 --rounds 8 --out $D/$m > $D/$m.log 2>&1
  grep "\[models\]" $D/$m.log | tail -3; rm -rf $D/$m/logs; say $m; save
done
left=$((END - $(date +%s) + T0)); [ $left -gt 150 ] && left=150
[ $left -gt 60 ] && { DNNTUNE_CACHE_DIR=/tmp/c_gd timeout $((left)) python3 benchmarks/generate.py --prompt 128 --rounds 6 --new-tokens 48 \
  --policy heuristic --eager-copy --out $D/gen_dynamic > $D/gen_dynamic.log 2>&1
  grep "\[generate\]\|Traceback" $D/gen_dynamic.log | tail -3; say "generate dynamic"; save; }
left=$((END - $(date +%s) + T0))
[ $left -gt 60 ] && { DNNTUNE_CACHE_DIR=/tmp/c_rc OUT=$D timeout $left python3 benchmarks/results/h100_2026-12-07_s54/next/pytorch_route_cost.py > $D/route_cost.log 2>&1
  grep "route_cost\]\|Traceback" $D/route_cost.log | head -30; say "route cost"; save; }
