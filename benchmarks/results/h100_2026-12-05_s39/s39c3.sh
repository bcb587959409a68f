unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c3 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w1; mkdir -p $W /tmp/old39 /tmp/res2
tar -xf .snap/old39.tar -C /tmp/old39; cp -r benchmarks /tmp/old39/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
python3 -c "import torch, torch._inductor.compile_fx, torch._dynamo, triton, timm, transformers, torchvision, dnntune.torch"
say imports
# phase 1: correctness, side by side (about 280 s)
( timeout 200 python3 benchmarks/results/h100_2026-12-05_s38/diag_se_conv.py > $OUT/diag_se.txt 2>&1; echo "rc=$?" >> $OUT/diag_se.txt ) &
triton=$(ls tests/providers/test_triton*.py)
( DNNTUNE_CACHE_DIR=$W/c1 timeout 270 python3 -m pytest -m gpu -q -p no:cacheprovider -rs \
    tests/torch tests/autotune/test_use_cases.py > "$OUT/gpu_tests.txt" 2>&1
  echo "rc=$?" >> "$OUT/gpu_tests.txt" ) &
( DNNTUNE_CACHE_DIR=$W/zoo timeout 270 python3 benchmarks/model_conformance.py --device cuda \
    --zoo hf_gpt2,hf_clip_vision,timm_convnext_atto,timm_efficientnet_b0,hf_llama,hf_bert,tv_resnet50,timm_regnety_002 \
    --count 16 --time-budget-s 230 --out "$W/zoo" > "$W/zoo.log" 2>&1; echo "rc=$?" >> $W/zoo.log ) &
( python3 .snap/se_graphs.py $W/se > $OUT/se_graphs.txt 2>&1
  DNNTUNE_CACHE_DIR=$W/c3 timeout 100 python3 -m dnntune run -g $W/se --device cuda --json $W/se_run.json >> $OUT/se_graphs.txt 2>&1; echo "run rc=$?" >> $OUT/se_graphs.txt
  DNNTUNE_CACHE_DIR=$W/c4 timeout 150 python3 -m dnntune tune -g $W/se --device cuda --engine CUDNN_ENGINE -o $W/se_over.json --report $W/se_tune.json > $W/se_tune.log 2>&1; echo "tune rc=$?" >> $OUT/se_graphs.txt ) &
( timeout 100 python3 .snap/qg.py > $OUT/qg.txt 2>&1 ) &
wait
say "phase 1"; tail -n 3 $OUT/diag_se.txt $OUT/gpu_tests.txt $W/zoo.log
tar -czf "$OUT/p1.tgz" -C "$W" zoo zoo.log se_run.json se_over.json se_tune.json se_tune.log 2>/dev/null
# phase 2: timing alone, this tree and the one before this session (c45ec89)
run() { # tag tree models timeout
  ( cd $2 && PYTHONPATH=/tmp/site timeout $4 python3 benchmarks/models.py --models $3 \
      --variants eager,eager_graph,dnntune_auto --skip-compile --policy heuristic --rounds 8 \
      --model-timeout-s 110 --out /tmp/res2/$1 > /tmp/res2/$1.log 2>&1 )
  say "$1"; grep -A4 "^| model" /tmp/res2/$1/models.md | head -4
}
left=$((540 - $(date +%s) + T0)); say "timing with $left s"
run new $R gpt2,clip_vision $((left / 2))
run old /tmp/old39 gpt2,clip_vision $((left / 2 - 5))
tar -czf $OUT/p2.tgz -C /tmp res2
say done
