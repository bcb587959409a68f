unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c3 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/res3; mkdir -p $D /tmp/base
save() { rm -rf $D/*/logs; tar -czf $OUT/r3.tgz -C /tmp res3; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
tar -xf .snap/s44base.tar -C /tmp/base; cp -r benchmarks /tmp/base/
DNNTUNE_CACHE_DIR=/tmp/nm timeout 60 python3 .snap/notes_micro.py > $D/notes_micro.txt 2>&1; cat $D/notes_micro.txt; say micro; save
run() { # tag tree model timeout
  ( cd $2 && PYTHONPATH=/tmp/site:$2/src:$2/benchmarks timeout $4 python3 benchmarks/models.py --models $3 \
      --variants eager,eager_graph,dnntune_auto --skip-compile --tune-budget-s 12 --rounds 8 \
      --model-timeout-s $(($4 - 5)) --out $D/$1 > $D/$1.log 2>&1 )
  say "$1"; grep "^| $3" $D/$1/models.md; save
}
run dec_new $R llama_decode 60
run dec_base /tmp/base llama_decode 60
run gpt2_new $R gpt2 60
run gpt2_base /tmp/base gpt2 60
run pre_new $R llama_prefill 60
run pre_base /tmp/base llama_prefill 60
save; say done
