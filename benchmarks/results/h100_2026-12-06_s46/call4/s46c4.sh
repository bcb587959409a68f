# which threads run while optimize waits (GPT-2, decode; budget 12 s, empty caches); GPT-2 with the cuDNN build processes off; the batched output copy's GPU test
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c4 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/res4; mkdir -p $D /tmp/new
S=$R/.snap; tar -xf $S/s46new.tar -C /tmp/new; R=/tmp/new; cd $R
export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
save() { tar -czf $OUT/r4.tgz -C /tmp res4; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_t timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/torch/test_fresh_outputs.py tests/torch/test_replay_state.py tests/torch/test_piecewise_capture.py tests/torch/test_speed_check.py > $D/gpu_tests.txt 2>&1; tail -n 3 $D/gpu_tests.txt; say tests; save
python3 -c "import torch, torch._inductor, triton, dnntune.torch, transformers" 2>/dev/null; say imports
for m in gpt2 llama_decode; do
  DNNTUNE_CACHE_DIR=/tmp/c_$m timeout 90 python3 $S/thread_samples.py $m > $D/threads_$m.txt 2>&1; say "threads $m"; head -n 3 $D/threads_$m.txt; save
done
DNNTUNE_CUDNN_BUILD_PROCESSES=0 DNNTUNE_CACHE_DIR=/tmp/c_gpt2_np timeout 90 python3 $S/thread_samples.py gpt2 > $D/threads_gpt2_noproc.txt 2>&1; say "threads gpt2 no processes"; head -n 3 $D/threads_gpt2_noproc.txt; save
say done
