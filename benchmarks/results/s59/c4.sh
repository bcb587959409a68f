# session 59, fourth device call: a GPU conformance sweep with a quarter of its cases on buffers
# one element off a 16-byte boundary (_conformance_plans.shifted_case), two shards side by side.
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; END=230 bash benchmarks/results/s59/c4.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
END=${END:-230}; T0=$(date +%s); say() { echo "[s59c4 $(($(date +%s) - T0)) s] $*"; }
left() { echo $((END - $(date +%s) + T0)); }
cd $R; D=/tmp/s59c4; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
save() { tar -czf $OUT/s59c4.tgz -C /tmp s59c4; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
l=$(left)
for k in 1 2; do DNNTUNE_CACHE_DIR=/tmp/c_cf$k timeout $((l - 10)) python3 benchmarks/conformance.py --device cuda --size full \
  --count 400 --seed 5901 --shard $k/2 --time-budget-s $((l - 45)) --compile-cap 10 --out $D/conf$k > $D/conf$k.log 2>&1 & done; wait
tail -6 $D/conf1.log $D/conf2.log; say conformance; save
