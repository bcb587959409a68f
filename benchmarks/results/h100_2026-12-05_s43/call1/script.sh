unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c1 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w1; D=/tmp/res1; mkdir -p $W $D /tmp/base
save() { rm -rf $D/*/logs; tar -czf $OUT/r1.tgz -C /tmp res1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt
python3 -c "import transformers, torch, triton; print('transformers', transformers.__version__, 'torch', torch.__version__, 'triton', triton.__version__)" >> $D/gpu.txt
cat $D/gpu.txt
tar -xf .snap/s42end.tar -C /tmp/base; cp -r benchmarks /tmp/base/
DNNTUNE_CACHE_DIR=$W/c timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider tests/torch/test_rotary.py tests/torch/test_grouped_heads.py tests/torch/test_gated_mlp.py tests/providers/test_torch_fused.py tests/torch/test_functional.py::test_linear_multiplier_forward_backward_memo_and_fallback tests/torch/test_pass_through.py tests/torch/test_transformers_modules.py tests/torch/test_module_tails.py > $D/gpu_tests.txt 2>&1; tail -n 6 $D/gpu_tests.txt
say tests; save
run() { # tag tree model timeout ov
  ( cd $2 && PYTHONPATH=/tmp/site:$2/src:$2/benchmarks timeout $4 python3 benchmarks/models.py --models $3 \
      --variants eager,eager_graph,dnntune_auto --skip-compile --tune-budget-s 12 --rounds 8 \
      --overrides $W/$5 --model-timeout-s $(($4 - 5)) --out $D/$1 > $D/$1.log 2>&1 )
  say "$1"; grep "^| $3" $D/$1/models.md; cp $W/*.json $D/ 2>/dev/null; save
}
run dec_new $R llama_decode 60 dec_ov.json
run dec_base /tmp/base llama_decode 50 dec_ov.json
run dec_new2 $R llama_decode 50 dec_ov.json
run pre_new $R llama_prefill 60 pre_ov.json
run pre_base /tmp/base llama_prefill 55 pre_ov.json
left=$((565 - $(date +%s) + T0))
[ $left -gt 50 ] && run pre_new2 $R llama_prefill 50 pre_ov.json
left=$((575 - $(date +%s) + T0))
[ $left -gt 30 ] && timeout $left python3 .snap/torch_lin.py > $D/torch_lin.txt 2>&1; cat $D/torch_lin.txt
save; say done
