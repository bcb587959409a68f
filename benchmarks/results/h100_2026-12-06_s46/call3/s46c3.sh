# where optimize's seconds go now (GPT-2, decode; budget 12 s, as models.py); clone strategies on the device clock
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c3 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/res3; mkdir -p $D /tmp/new
S=$R/.snap; tar -xf $S/s46new.tar -C /tmp/new; R=/tmp/new; cd $R
export PYTHONPATH=/tmp/site:$R/src:$R/benchmarks
save() { tar -czf $OUT/r3.tgz -C /tmp res3; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
python3 $S/clone_micro.py > $D/clone_micro.txt 2>&1; cat $D/clone_micro.txt; say micro; save
python3 -c "import torch, torch._inductor, triton, dnntune.torch" 2>/dev/null; say imports
for m in gpt2 llama_decode; do
  DNNTUNE_CACHE_DIR=/tmp/c_$m timeout 150 python3 benchmarks/profile_optimize.py --models $m --tune-budget-s 12 --rows 50 --out $D > $D/prof_$m.log 2>&1
  say "prof $m"; head -n 40 $D/profile_optimize_$m.txt; save
done
say done
