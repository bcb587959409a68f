unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c4 $(($(date +%s) - T0)) s] $*"; }
cd $R
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu4.txt
( DNNTUNE_CACHE_DIR=/tmp/c1 timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider -rs \
    tests/torch/test_replay_state.py tests/torch/test_written_activations.py tests/autotune/test_use_cases.py \
    > $OUT/gpu_tests4.txt 2>&1; echo "rc=$?" >> $OUT/gpu_tests4.txt )
say tests; tail -n 3 $OUT/gpu_tests4.txt
timeout 100 python3 benchmarks/models.py --models gpt2 --variants eager,eager_graph,dnntune_auto \
  --skip-compile --policy heuristic --rounds 6 --model-timeout-s 90 --out /tmp/res4 > $OUT/models4.log 2>&1
cp /tmp/res4/models.md $OUT/models4.md 2>/dev/null
say models; grep -A3 "^| model" /tmp/res4/models.md | head -3
