# session 57, fourth device call (about 60 s): stream_layout.py (the Whisper encoder's residual
# stream made contiguous once, against the model as it is, both replayed).
#   export R=$PWD; export PYTHONUNBUFFERED=1; bash benchmarks/results/s57/c4.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
cd $R; export PYTHONPATH=$R/src; D=/tmp/s57c4; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
timeout 200 python3 benchmarks/results/s57/stream_layout.py > $D/stream.log 2>&1; grep "\[stream\]\|Error" $D/stream.log
tar -czf $OUT/s57c4.tgz -C /tmp s57c4
