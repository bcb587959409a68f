# session 52 call 4: a later static cache moves into the memory of the first one's recording
# (Held): the static-cache GPU tests and the CUDA-graph files, a generate() loop's recordings,
# generate.py --cache static (tune, 4 rounds)
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[s52c4 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/s52c4; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src
save() { tar -czf $OUT/s52c4.tgz -C /tmp s52c4; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_t timeout 70 python3 -m pytest -q -m gpu -p no:cacheprovider tests/torch/test_static_caches.py \
  tests/torch/test_cuda_graphs.py > $D/pytest.txt 2>&1; tail -4 $D/pytest.txt; say tests; save
DNNTUNE_CACHE_DIR=/tmp/c_r timeout 60 python3 benchmarks/results/h100_2026-12-06_s52/static_reuse.py > $D/reuse.log 2>&1
grep "\[reuse\]" $D/reuse.log || tail -20 $D/reuse.log; say reuse; save
DNNTUNE_CACHE_DIR=/tmp/c_gs timeout 70 python3 benchmarks/generate.py --prompt 128 \
    --rounds 3 --new-tokens 48 --cache static --policy heuristic --out $D/gen_static > $D/gen_static.log 2>&1
grep "\[generate\]" $D/gen_static.log || tail -20 $D/gen_static.log; say "generate static"; save
