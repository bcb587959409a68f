# session 57, third device call (about 120 s): where the Whisper encoder's copies and adds come
# from (benchmarks/results/s57/copies.py), eager and dnntune uncaptured, with the model lines.
#   export R=$PWD; export PYTHONUNBUFFERED=1; bash benchmarks/results/s57/c3.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
cd $R; export PYTHONPATH=$R/src; D=/tmp/s57c3; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_w OUT=$D timeout 240 python3 benchmarks/results/s57/copies.py > $D/copies.log 2>&1
grep -v "Warning\|warn" $D/copies.log | sed -n '/== eager_sources/,$p' | head -80; tar -czf $OUT/s57c3.tgz -C /tmp s57c3
