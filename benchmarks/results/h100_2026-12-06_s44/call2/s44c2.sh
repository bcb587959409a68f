unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c2 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/res2; mkdir -p $D
save() { tar -czf $OUT/r2.tgz -C /tmp res2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
for m in llama_decode gpt2 efficientnet_b0; do
  DNNTUNE_CACHE_DIR=/tmp/pc_$m timeout 110 python3 benchmarks/profile_optimize.py --models $m --tune-budget-s 12 --rows 80 --out $D > $D/prof_$m.log 2>&1
  say "$m"; tail -n 2 $D/prof_$m.log; sed -n 1,4p $D/profile_optimize_$m.txt; save
done
mkdir -p $D/warm; DNNTUNE_CACHE_DIR=/tmp/pc_llama_decode timeout 100 python3 benchmarks/profile_optimize.py --models llama_decode --tune-budget-s 12 --rows 80 --out $D/warm > $D/warm/prof.log 2>&1
say warm; sed -n 1,4p $D/warm/profile_optimize_llama_decode.txt
save; say done
