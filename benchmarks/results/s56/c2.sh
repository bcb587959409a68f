# session 56, second device call: every gpu-marked test (about 405 s on an H100), with session
# 54's stream fix and session 55's trace guards and NumPy refusal; no -x, so every failure shows.
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; bash benchmarks/results/s56/c2.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
cd $R; D=/tmp/s56c2; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_all timeout ${LIMIT:-570} python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --durations=15 tests \
  > $D/pytest.txt 2>&1; echo "rc $?" >> $D/pytest.txt
tail -40 $D/pytest.txt; tar -czf $OUT/s56c2.tgz -C /tmp s56c2
