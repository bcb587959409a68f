# session 60, second device call (any card, say which): the GPU tests of what landed after c1
# (the compile/export fix, thread-local optimize settings, the fork reset, settings outside the
# forward, TORCH_COMPILE_ENGINE's in-place shortcut, the cache-file fixes, unbatched inputs),
# then the whole files of the changed torch paths while time lasts.
#   export R=$PWD; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#     .whl/*.whl 2>/dev/null; export PYTHONUNBUFFERED=1; END=170 bash benchmarks/results/s60/c2.sh
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
END=${END:-170}; T0=$(date +%s); left() { echo $((END - $(date +%s) + T0)); }
cd $R; D=$OUT/s60c2; mkdir -p $D; export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
T="tests/torch/test_checkpointed_layers.py tests/torch/test_settings_outside_forward.py
  tests/torch/test_policy_optimize.py tests/torch/test_fork.py tests/torch/test_native.py
  tests/providers/test_cudnn_plan_store.py tests/providers/test_triton_codegen_temp_files.py
  tests/torch/test_unbatched_inputs.py tests/torch/test_user_errors.py tests/backend/test_plans.py
  tests/providers/test_torch_fused.py tests/torch/test_functional.py tests/providers/test_torch_compile.py"
T=$(for f in $T; do [ -f $f ] && echo $f; done)
DNNTUNE_CACHE_DIR=/tmp/c_a timeout $(( $(left) * 6 / 10 )) python3 -m pytest -q -p no:cacheprovider -m gpu $T -rs \
  > $D/gpu_marked.txt 2>&1; tail -3 $D/gpu_marked.txt
DNNTUNE_CACHE_DIR=/tmp/c_b timeout $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider -m "not gpu" \
  tests/torch/test_traced_programs.py tests/torch/test_unbatched_inputs.py tests/torch/test_settings_outside_forward.py \
  tests/providers/test_torch_fused.py -rs > $D/files.txt 2>&1; tail -3 $D/files.txt
