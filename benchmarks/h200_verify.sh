#!/usr/bin/env bash
# One device call (about 8 minutes on the H200) that checks what session 2 changed without a
# GPU, then measures it. Run from the repository root on the device, after installing the
# cuDNN frontend wheel (see README "GPU"):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1; bash benchmarks/h200_verify.sh
# Writes everything under $OUT (tests.txt, e2e.txt, torch_e2e.json, triton.txt).
set -uo pipefail
OUT=${OUT:-/tmp/h200_verify}
mkdir -p "$OUT"
# 1. gpu tests of code first run on the H200 in session 3: Triton batch norm, residual fusion,
#    CUDA-graph replay, cuDNN fp32 matmul decline, TORCH_ENGINE addmm peephole, pooling
timeout 170 python3 -m pytest -p no:benchmark -q -m gpu \
  tests/providers/test_batchnorm_gpu.py tests/providers/test_pool_gpu.py \
  tests/providers/test_cudnn_gpu.py tests/providers/test_torch_eager.py \
  tests/providers/test_torch_fused.py tests/torch tests/autotune/test_end_to_end_torch.py \
  2>&1 | tail -60 > "$OUT/tests.txt"
tail -5 "$OUT/tests.txt"
# 2. Triton kernels against eager and the copy ceiling (norms; no matmuls)
timeout 70 python3 benchmarks/triton_kernels.py --skip-matmuls > "$OUT/triton.txt" 2>&1
tail -9 "$OUT/triton.txt"
# 3. dnntune.torch end to end against eager and max-autotune
timeout 280 python3 benchmarks/torch_e2e.py --dtype bf16 > "$OUT/e2e.txt" 2>&1
grep -A5 "^| model" "$OUT/e2e.txt"
