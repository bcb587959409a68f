# session 50 call 1: GPU tests of sessions 48-49 (OneKernel launcher, attention grid, the race of routes),
# generate() with and without the race of routes (prompts 128 and 1024), Swin-T under the default budget
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c1 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=$OUT/c1; mkdir -p $D
export PYTHONPATH=/tmp/site:$R/src
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
python3 -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)" >> $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_t timeout 260 python3 -m pytest -m gpu -q -p no:cacheprovider -x --no-header \
  tests/providers/test_triton_gpu.py tests/providers/test_batchnorm_gpu.py tests/providers/test_pool_gpu.py \
  tests/providers/test_fast_path_gpu.py tests/torch/test_route_race.py tests/torch/test_generate.py > $D/gpu_tests.txt 2>&1
tail -n 15 $D/gpu_tests.txt; say tests
for n in 128 1024; do
  left=$((560 - $(date +%s) + T0)); [ $left -lt 60 ] && break
  DNNTUNE_CACHE_DIR=/tmp/c_g$n timeout $((left < 150 ? left : 150)) python3 benchmarks/generate.py --new-tokens 64 --prompt $n --rounds 4 \
    --without-race --out $D/gen_$n > $D/gen_$n.log 2>&1
  grep "\[generate\]" $D/gen_$n.log; say "generate prompt $n"
done
left=$((570 - $(date +%s) + T0)); say "left $left"
if [ $left -gt 70 ]; then
  DNNTUNE_CACHE_DIR=/tmp/c_s timeout $left python3 benchmarks/models.py --models swin_t --variants eager_graph,dnntune_auto \
    --tune-budget-s 15 --rounds 8 --overrides /tmp/ov_s.json --out $D/swin > $D/swin.log 2>&1
  grep "\[models\]" $D/swin.log; rm -rf $D/swin/logs
fi
say done
