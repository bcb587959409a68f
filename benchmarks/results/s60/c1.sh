# session 60, first device call (any card, say which): the GPU tests of the commits session 59 did
# not run on a GPU (constant-input check, Conv1D gradient fix, test refactors), then the GPU
# conformance sweep with a quarter of its cases on buffers one element off a 16-byte boundary
# (on an H100), or issue 23's 8-model table of the default path (on an H200).
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; END=560 bash benchmarks/results/s60/c1.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
END=${END:-560}; T0=$(date +%s); say() { echo "[s60c1 $(($(date +%s) - T0)) s] $*"; }
left() { echo $((END - $(date +%s) + T0)); }
cd $R; D=/tmp/s60c1; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
save() { tar -czf $OUT/s60c1.tgz -C /tmp s60c1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
DNNTUNE_CACHE_DIR=/tmp/c_t timeout 170 python3 -m pytest -q -p no:cacheprovider \
  tests/torch/test_written_activations.py tests/torch/test_heuristic_verification.py \
  tests/providers/test_cudnn_alignment_gpu.py tests/providers/test_cudnn_direct_gpu.py \
  tests/providers/test_fast_path_gpu.py tests/benchmarks/test_conformance_script.py \
  tests/providers/test_cudnn_gpu.py tests/providers/test_cudnn_sdpa_support.py \
  tests/torch/test_checkpointed_layers.py -rs > $D/pytest.txt 2>&1
tail -4 $D/pytest.txt; say tests; save
GPU=$(cat $D/gpu.txt)
case "$GPU" in
*H200*)  # issue 23's table of the default path on the 8 real models (as s58/c1.sh), while time lasts
  for m in resnet50 efficientnet_b0 convnext_tiny vit_b16 bert_base gpt2 llama_prefill whisper_encoder; do
    l=$(left); [ $l -lt 60 ] && { say "skip $m"; continue; }
    DNNTUNE_CACHE_DIR=/tmp/c_$m timeout $l python3 benchmarks/models.py --models $m --variants eager,eager_graph,dnntune_auto \
      --skip-compile --tune-budget-s 15 --rounds 8 --out $D/$m > $D/$m.log 2>&1
    grep "\[models\]" $D/$m.log | tail -2; rm -rf $D/$m/logs; say $m; save
  done;;
*)
  l=$(left)
  for k in 1 2; do DNNTUNE_CACHE_DIR=/tmp/c_cf$k timeout $((l - 10)) python3 benchmarks/conformance.py --device cuda --size full \
    --count 400 --seed 5901 --shard $k/2 --time-budget-s $((l - 45)) --compile-cap 10 --out $D/conf$k > $D/conf$k.log 2>&1 & done; wait
  tail -6 $D/conf1.log $D/conf2.log; say conformance; save;;
esac
