#!/usr/bin/env bash
# One device call (about 7 minutes on the H200) that checks what session 3 changed after its
# last GPU run, then measures it. Run from the repository root on the device, after installing the
# cuDNN frontend wheel (see README "GPU"):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1; bash benchmarks/h200_verify.sh
# Writes everything under $OUT (tests.txt, e2e.txt, torch_e2e.json).
# STEPS picks the steps to run (default "tests e2e"; "workspace" runs the cuBLAS-workspace
# replay check with and without session 5's fix for it; "profile" writes profiler tables of an
# inference forward and a training step). The one-off probes of sessions 3-5 (clock_probe.py,
# the "clocks" step; fault_repro.py, the "fault" step) are gone: git show 4013e8e / b27fa75.
set -uo pipefail
OUT=${OUT:-/tmp/h200_verify}
STEPS=${STEPS:-tests e2e}
mkdir -p "$OUT"
has() { [[ " $STEPS " == *" $1 "* ]]; }
# 1. gpu tests of what session 3 changed without a GPU run after it: gelu/silu out=, the
#    PyTorch-op fast path of every dnntune.torch op, the cheaper-build tie break, the watchdog
has tests && timeout 220 python3 -m pytest -p no:benchmark -q -m gpu \
  tests/providers/test_torch_fused.py tests/providers/test_torch_eager.py tests/torch \
  tests/autotune/test_variants.py tests/autotune/test_measurement_decision.py \
  tests/autotune/test_measurement_failures.py tests/autotune/test_measurement_timer.py \
  tests/autotune/test_end_to_end_torch.py tests/test_reference_tolerance.py \
  2>&1 | tail -60 > "$OUT/tests.txt"
has tests && tail -5 "$OUT/tests.txt"
# 2. dnntune.torch end to end against eager and max-autotune
has e2e && timeout 330 python3 benchmarks/torch_e2e.py --dtype bf16 --also-throughput --also-refine > "$OUT/e2e.txt" 2>&1
has e2e && grep -A5 "^| model" "$OUT/e2e.txt"
# 3. the cause of session 4's prefill fault: a CUDA graph whose cuBLAS workspace was freed under
#    it (expect a fault, or wrong numbers, "unprotected"; "replays ok" protected)
if has workspace; then
  script=$(python3 -c "import sys; sys.path.insert(0, 'tests/torch'); import test_cuda_graphs as t; print(t._WORKSPACE_SCRIPT)")
  for how in unprotected protected; do
    timeout 120 python3 -c "$script" /tmp/ws_$how.json $how > "$OUT/workspace_$how.txt" 2>&1
    echo "workspace $how: exit $? $(grep -m1 -E 'replays ok|Error' "$OUT/workspace_$how.txt")"
  done
fi
# 4. profiler tables (inference and one training step, eager vs dnntune), archived
if has profile; then
  mkdir -p "$OUT/profile"
  OUT="$OUT/profile" timeout 300 python3 benchmarks/torch_e2e.py --dtype bf16 --skip-compile \
    --profile --iters 5 --models ${PROFILE_MODELS:-resnet_stack,decoder_decode} > "$OUT/profile/e2e.txt" 2>&1
  echo "profile: exit $?"; grep -A4 "^| model" "$OUT/profile/e2e.txt"
  tar -C "$OUT" -czf "$OUT/profile.tgz" profile && rm -rf "$OUT/profile"
fi
# then, in a second call: python3 benchmarks/run.py --suite benchmarks/suite --out $OUT/suite
#   --modes warm --budget-s 540 (warm only fits all 46 graphs in one call)
