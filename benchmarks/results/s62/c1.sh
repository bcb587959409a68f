# session 62, first device call (any card, say which): the whole GPU suite (`pytest -m gpu tests`)
# on session 61's final tree (c62c404), none of whose commits after 3ad737b had run on a GPU.
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; END=560 bash benchmarks/results/s62/c1.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
END=${END:-560}; T0=$(date +%s); left() { echo $((END - $(date +%s) + T0)); }
cd $R; D=$OUT/s62c1; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
git -C $R log -1 --format=%H > $D/tree.txt 2>/dev/null
DNNTUNE_CACHE_DIR=/tmp/c_all timeout $(( $(left) - 10 )) python3 -m pytest -q -p no:cacheprovider -m gpu tests -rs \
  --durations=15 > $D/gpu_suite.txt 2>&1; echo "rc=$?" >> $D/gpu_suite.txt; tail -25 $D/gpu_suite.txt
