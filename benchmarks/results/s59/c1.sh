# session 59, first device call: every gpu-marked test (about 405 s on an H100), first run of
# session 57's late commits and session 58's (optimize renovation, report, Graph API checks)
# on a GPU; then, with what is left, a GPU conformance sweep (graphs, 2 shards side by side).
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; END=570 bash benchmarks/results/s59/c1.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
END=${END:-570}; T0=$(date +%s); say() { echo "[s59c1 $(($(date +%s) - T0)) s] $*"; }
left() { echo $((END - $(date +%s) + T0)); }
cd $R; D=/tmp/s59c1; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
save() { tar -czf $OUT/s59c1.tgz -C /tmp s59c1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
git -C $R log -1 --format=%h > $D/head.txt 2>/dev/null
DNNTUNE_CACHE_DIR=/tmp/c_al timeout 90 python3 benchmarks/results/s59/align_probe.py > $D/align.txt 2>&1; cat $D/align.txt | tail -25; say align
DNNTUNE_CACHE_DIR=/tmp/c_all timeout $(( $(left) - 20 )) python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --durations=15 tests \
  > $D/pytest.txt 2>&1; echo "rc $?" >> $D/pytest.txt
tail -30 $D/pytest.txt; say tests; save
l=$(left); if [ $l -gt 120 ]; then
  for k in 1 2; do DNNTUNE_CACHE_DIR=/tmp/c_cf$k timeout $((l - 30)) python3 benchmarks/conformance.py --device cuda --size full \
    --count 400 --seed 5901 --shard $k/2 --time-budget-s $((l - 60)) --compile-cap 20 --out $D/conf$k > $D/conf$k.log 2>&1 & done; wait
  tail -5 $D/conf1.log $D/conf2.log; say conformance; save
fi
