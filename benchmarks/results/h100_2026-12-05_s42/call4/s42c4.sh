unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c4 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w4; mkdir -p $W /tmp/old /tmp/norot /tmp/res4
tar -xf .snap/old41b.tar -C /tmp/old; cp -r benchmarks /tmp/old/
cp -r src benchmarks /tmp/norot/; sed -i 's/rotary = install_rotary(module) if fuse else \[\]/rotary = []/' /tmp/norot/src/dnntune/torch/optimize.py
grep -c "rotary = \[\]" /tmp/norot/src/dnntune/torch/optimize.py
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
python3 -c "import transformers, timm, torch, triton; print('transformers', transformers.__version__, 'timm', timm.__version__, 'torch', torch.__version__, 'triton', triton.__version__)" >> $OUT/gpu.txt
python3 -c "import kernels; print('kernels', kernels.__version__)" >> $OUT/gpu.txt 2>&1
cat $OUT/gpu.txt
DNNTUNE_CACHE_DIR=$W/c timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/torch/test_rotary.py tests/torch/test_pass_through.py tests/torch/test_transformers_modules.py tests/torch/test_module_tails.py > /tmp/res4/gpu_tests.txt 2>&1; tail -n 3 /tmp/res4/gpu_tests.txt
DNNTUNE_CACHE_DIR=$W/c2 timeout 60 python3 -m pytest -q -p no:cacheprovider tests/torch/test_known_wrappers.py tests/torch/test_rotary.py > /tmp/res4/all_tests.txt 2>&1; tail -n 1 /tmp/res4/all_tests.txt
timeout 60 python3 benchmarks/rotary.py > /tmp/res4/rotary.txt 2>&1; cat /tmp/res4/rotary.txt
say tests; cp -r /tmp/res4 $OUT/
run() { # tag tree model timeout ov
  ( cd $2 && PYTHONPATH=/tmp/site timeout $4 python3 benchmarks/models.py --models $3 \
      --variants eager,eager_graph,dnntune_auto --skip-compile --tune-budget-s 12 --rounds 8 \
      --overrides $W/$5 --model-timeout-s $(($4 - 5)) --out /tmp/res4/$1 > /tmp/res4/$1.log 2>&1 )
  say "$1"; grep "^| $3" /tmp/res4/$1/models.md; cp -r /tmp/res4 $OUT/
}
run dec_new $R llama_decode 60 dec_ov.json
run dec_norot /tmp/norot llama_decode 50 dec_ov.json
run pre_new $R llama_prefill 60 pre_ov.json
run pre_norot /tmp/norot llama_prefill 50 pre_ov.json
left=$((450 - $(date +%s) + T0))
[ $left -gt 55 ] && run pre_old /tmp/old llama_prefill 55 pre_ov.json
left=$((450 - $(date +%s) + T0))
[ $left -gt 50 ] && run dec_new2 $R llama_decode 50 dec_ov.json
cp $W/*.json /tmp/res4/
rm -rf /tmp/res4/*/logs; cp -r /tmp/res4 $OUT/
say done
