#!/usr/bin/env bash
# The H200 checks, grouped into device calls of at most 10 minutes. Run from the repository
# root on the device, after installing the cuDNN frontend wheel (README "GPU"):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD/src:$PWD/benchmarks PYTHONUNBUFFERED=1
#   STEPS="tests oracle" bash benchmarks/h200_verify.sh
# STEPS picks what runs, in this order (default "tests oracle", about 8 minutes; session 11):
#   tests        pytest -m gpu, two processes side by side (about 4 minutes)
#   conformance  benchmarks/conformance.py, four shards side by side, merged; CONF_ARGS sets
#                its options (default: the variants phase, 285 s)
#   modelconf    benchmarks/model_conformance.py: random models through optimize() against a
#                float64 eager copy, bfloat16, each drawing cuda_graph False/True/"auto"
#                (MODELCONF_ARGS, default --count 400 --time-budget-s 480)
#   zoo          benchmarks/model_conformance.py --zoo all: the 49 real architectures of
#                torchvision, timm and transformers through the same checks (ZOO_ARGS, default
#                --count 49 --time-budget-s 480)
#   oracle       dnntune bench --oracle --validate reference on examples/graphs, alone (113 s)
#   dq           benchmarks/decision_quality.py, the 41 graphs in two shards, merged (about 6
#                minutes with 5 tunes; DQ_ARGS adds options, e.g. --quick)
#   models       benchmarks/models.py --models $MODELS (MODELS_ARGS adds options)
#   overhead     benchmarks/execute_overhead.py --devices cuda
#   paths        benchmarks/call_paths.py on the small GEMMs where the tuner's clock and the
#                user's path disagreed (session 16; about a minute); PATHS_GRAPHS names others
#                (session 21's disagreement: gemm_m1_k4096_n4096_fp16 gemm_m16_k4096_n4096_fp16)
#   kernels      benchmarks/graph_kernels.py: the plain capture, cuda_graph="auto" and
#                cuda_graph=True profiled kernel by kernel (KERNELS_MODELS, default vit_b16;
#                about 80 s a model); KERNELS_COMPILE=max-autotune adds that torch.compile mode
#                (KERNELS_TIMEOUT, default 300 s: max-autotune compiles the Whisper encoder in
#                about 80 s, ViT-B/16 in 65-121 s)
#   suite        benchmarks/run.py with issue 25's comparison (the default tune against EXHAUSTIVE
#                and max-autotune, HeuristicMode.B against A): SUITE_SHARDS (default "1/4 2/4")
#                of the 46 graphs one after the other, about 220 s each (session 23); each
#                shard's folder in one .tgz (merge them with run.py --merge)
#   profile      benchmarks/profile_optimize.py: optimize(cuda_graph="auto") under cProfile, where
#                its seconds go beside the tuning (PROFILE_MODELS, default bert_base; PROFILE_AB=1
#                also without the helpers' background build, each in its own process)
# Correctness steps (tests, conformance) may share the GPU; the timing steps (oracle, dq,
# models, overhead) must run alone, so they come after them. Each step leaves at most two files
# in $OUT (the device returns at most 8), the rest in a .tgz.
set -uo pipefail
OUT=${OUT:-/tmp/h200_verify}
STEPS=${STEPS:-tests oracle}
WORK=$(mktemp -d)
mkdir -p "$OUT"
has() { [[ " $STEPS " == *" $1 "* ]]; }
T0=$(date +%s)
say() { echo "[h200_verify $(($(date +%s) - T0)) s] $*"; }

if has tests; then
  triton=$(ls tests/providers/test_triton*.py)
  ( DNNTUNE_CACHE_DIR=$WORK/c1 timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider -rs \
      tests/torch tests/autotune tests/workflows $triton > "$OUT/gpu_tests_a.txt" 2>&1
    echo "rc=$?" >> "$OUT/gpu_tests_a.txt" ) &
  ( DNNTUNE_CACHE_DIR=$WORK/c2 timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider -rs \
      tests --ignore=tests/torch --ignore=tests/autotune --ignore=tests/workflows \
      $(printf -- '--ignore=%s ' $triton) > "$OUT/gpu_tests_b.txt" 2>&1
    echo "rc=$?" >> "$OUT/gpu_tests_b.txt" ) &
  wait
  say "tests"; tail -n 2 "$OUT/gpu_tests_a.txt" "$OUT/gpu_tests_b.txt"
fi

if has conformance; then
  read -r -a conf_args <<< "${CONF_ARGS:---phases variants --variant-cases 1 --time-budget-s 285 --compile-cap 10}"
  for k in 1 2 3 4; do
    DNNTUNE_CACHE_DIR=$WORK/cc$k timeout 560 python3 benchmarks/conformance.py --device cuda \
      --size full --count 1500 --shard $k/4 "${conf_args[@]}" --out "$WORK/conf/s$k" \
      > "$WORK/conf_s$k.log" 2>&1 &
  done
  wait
  python3 benchmarks/conformance.py merge "$WORK"/conf/s*/results.json --out "$WORK/conf/merged" \
    > "$WORK/conf_merge.log" 2>&1
  say "conformance"; grep -h "done:\|merged" "$WORK"/conf_s*.log "$WORK/conf_merge.log"
  cp "$WORK/conf/merged/matrix.md" "$OUT/conformance_matrix.md" 2>/dev/null
  tar -czf "$OUT/conformance.tgz" -C "$WORK" conf conf_s1.log conf_s2.log conf_s3.log conf_s4.log \
    conf_merge.log 2>/dev/null
fi

if has modelconf; then
  read -r -a mc_args <<< "${MODELCONF_ARGS:---count 400 --time-budget-s 480}"
  DNNTUNE_CACHE_DIR=$WORK/mc timeout 560 python3 benchmarks/model_conformance.py --device cuda \
    "${mc_args[@]}" --out "$WORK/modelconf" > "$WORK/modelconf.log" 2>&1
  say "modelconf"; tail -n 1 "$WORK/modelconf.log"
  tar -czf "$OUT/model_conformance.tgz" -C "$WORK" modelconf modelconf.log 2>/dev/null
fi

if has zoo; then
  read -r -a zoo_args <<< "${ZOO_ARGS:---count 49 --time-budget-s 480}"
  DNNTUNE_CACHE_DIR=$WORK/zoo timeout 560 python3 benchmarks/model_conformance.py --device cuda \
    --zoo all "${zoo_args[@]}" --out "$WORK/zoo" > "$WORK/zoo.log" 2>&1
  say "zoo"; tail -n 1 "$WORK/zoo.log"
  tar -czf "$OUT/model_zoo.tgz" -C "$WORK" zoo zoo.log 2>/dev/null
fi

if has oracle; then
  # a user's install has bytecode; the device sets PYTHONDONTWRITEBYTECODE=1, so every process
  # would compile PyTorch from source (9 s of a run; session 25): write it once, outside the run
  ( unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=$WORK/pyc
    python3 -c "import torch, torch._inductor.compile_fx, torch._dynamo, triton, dnntune.cli.app" )
  start=$(date +%s)
  PYTHONPYCACHEPREFIX=$WORK/pyc \
  DNNTUNE_CACHE_DIR=$WORK/o timeout 300 python3 -m dnntune bench -g examples/graphs --oracle \
    --validate reference --device cuda -o "$OUT/oracle.json" > "$OUT/oracle.txt" 2>&1
  echo "rc=$? wall $(($(date +%s) - start)) s" >> "$OUT/oracle.txt"
  say "oracle"; grep -E "^Summary|^Oracle|wall" "$OUT/oracle.txt"
fi

if has dq; then
  read -r -a dq_args <<< "${DQ_ARGS:-}"
  for shard in 0/2 1/2; do
    DNNTUNE_CACHE_DIR=$WORK/dq timeout 280 python3 benchmarks/decision_quality.py \
      --shard $shard --out "$WORK/dq" "${dq_args[@]}" > "$WORK/dq_${shard/\//of}.log" 2>&1
  done
  python3 benchmarks/decision_quality.py --merge --out "$WORK/dq" > /dev/null 2>&1
  say "dq"; tail -n 6 "$WORK/dq/decision_quality.md" 2>/dev/null
  cp "$WORK/dq/decision_quality.md" "$OUT/" 2>/dev/null
  tar -czf "$OUT/decision_quality.tgz" -C "$WORK" dq dq_0of2.log dq_1of2.log 2>/dev/null
fi

if has models; then
  read -r -a models_args <<< "${MODELS_ARGS:-}"
  timeout 560 python3 benchmarks/models.py --models "${MODELS:-resnet50,vit_b16,bert_base}" \
    --out "$WORK/models" "${models_args[@]}" > "$WORK/models.log" 2>&1
  say "models"; tail -n 20 "$WORK/models.log"
  tar -czf "$OUT/models.tgz" -C "$WORK" models models.log 2>/dev/null
fi

if has overhead; then
  timeout 300 python3 benchmarks/execute_overhead.py --devices cuda --calls 400 --rounds 21 \
    --stat both > "$OUT/execute_overhead.txt" 2>&1
  say "overhead"; tail -n 20 "$OUT/execute_overhead.txt"
fi
if has paths; then
  read -r -a path_graphs <<< \
    "${PATHS_GRAPHS:-gemm_m64_k4096_n4096 gemm_m1_k4096_n14336 gemm_m64_k14336_n4096}"
  DNNTUNE_CACHE_DIR=$WORK/p timeout 300 python3 benchmarks/call_paths.py "${path_graphs[@]}" \
    --tunes 2 --rounds 120 > "$OUT/call_paths.txt" 2>&1
  say "paths"; grep -E "tune|heuristic / winner" "$OUT/call_paths.txt"
fi
if has kernels; then
  kernels_args=()
  [[ -n "${KERNELS_COMPILE:-}" ]] && kernels_args=(--compile-mode "$KERNELS_COMPILE")
  DNNTUNE_CACHE_DIR=$WORK/k timeout "${KERNELS_TIMEOUT:-300}" python3 benchmarks/graph_kernels.py \
    --models "${KERNELS_MODELS:-vit_b16}" --rounds 10 --tune-budget-s 15 --out "$WORK/k" \
    ${kernels_args[@]+"${kernels_args[@]}"} > "$OUT/graph_kernels.txt" 2>&1
  say "kernels"; grep "^==" "$OUT/graph_kernels.txt"
fi

if has suite; then
  for shard in ${SUITE_SHARDS:-1/4 2/4}; do
    name=suite_${shard/\//of}
    timeout 290 python3 benchmarks/run.py --tune-defaults --exhaustive --heuristic-b \
      --modes warm --shard "$shard" --budget-s 235 --compile-budget-s 100000 \
      --compile-timeout-s 60 --candidate-timeout-s 60 --out "$WORK/$name" > "$WORK/$name.log" 2>&1
    say "suite $shard"; grep "^warm" "$WORK/$name.log"
  done
  tar -czf "$OUT/suite.tgz" -C "$WORK" $(cd "$WORK" && ls -d suite_*) 2>/dev/null
fi

if has profile; then
  # PROFILE_AB=1: also without the background build of the compiled helpers, each way in its
  # own process with its own empty dnntune, Inductor and Triton caches
  modes="prefetch"; [[ -n "${PROFILE_AB:-}" ]] && modes="no-prefetch prefetch"
  for mode in $modes; do
    flag=(); [[ $mode == no-prefetch ]] && flag=(--no-prefetch)
    DNNTUNE_CACHE_DIR=$WORK/pc_$mode TORCHINDUCTOR_CACHE_DIR=$WORK/pi_$mode \
      TRITON_CACHE_DIR=$WORK/pt_$mode timeout 300 python3 benchmarks/profile_optimize.py \
      --models "${PROFILE_MODELS:-bert_base}" --out "$WORK/p_$mode" "${flag[@]}" ${PROFILE_ARGS:-} \
      > "$WORK/profile_$mode.log" 2>&1
  done
  say "profile"; grep -h "^# " "$WORK"/profile_*.log
  tar -czf "$OUT/profile_optimize.tgz" -C "$WORK" $(cd "$WORK" && ls -d p_* profile_*.log) \
    2>/dev/null
fi
rm -rf "$WORK"
