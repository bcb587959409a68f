# session 59, third device call: the misaligned-view fix (providers/cudnn/alignment.py) on a GPU
# (the probe of c1 again, then its GPU tests), then the GPU tests c1's 560 s did not reach
# (the end of tests/torch and tests/workflows), then whatever of the helpers' fixes' files.
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; END=480 bash benchmarks/results/s59/c3.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
END=${END:-480}; T0=$(date +%s); say() { echo "[s59c3 $(($(date +%s) - T0)) s] $*"; }
left() { echo $((END - $(date +%s) + T0)); }
cd $R; D=/tmp/s59c3; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
save() { tar -czf $OUT/s59c3.tgz -C /tmp s59c3; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_al timeout 90 python3 benchmarks/results/s59/align_probe.py > $D/align.txt 2>&1; cat $D/align.txt | tail -25; say align
DNNTUNE_CACHE_DIR=/tmp/c_t1 timeout $(( $(left) / 2 )) python3 -m pytest -q -m gpu -p no:cacheprovider -rfE \
  tests/providers/test_cudnn_alignment_gpu.py tests/torch/test_misaligned_views.py tests/providers/test_cudnn_direct_gpu.py \
  tests/torch/test_heuristic_verification.py tests/torch/test_policy_optimize.py > $D/pytest_align.txt 2>&1; echo "rc $?" >> $D/pytest_align.txt
tail -15 $D/pytest_align.txt; say "align tests"; save
TAIL=$(ls tests/torch/test_*.py | sort | awk -F/ '$3 >= "test_static"' | tr '\n' ' ')
DNNTUNE_CACHE_DIR=/tmp/c_t2 timeout $(( $(left) - 15 )) python3 -m pytest -q -m gpu -p no:cacheprovider -rfE $TAIL tests/workflows \
  > $D/pytest_tail.txt 2>&1; echo "rc $?" >> $D/pytest_tail.txt
tail -15 $D/pytest_tail.txt; say "tail tests"; save
