# the output tails A/B (A = a337dac, before them; B = HEAD) on GPT-2 and the prefill, one override file per model tuned by both first; clone strategies micro-benchmark
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c2 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w2; D=/tmp/res2; mkdir -p $W $D /tmp/pre /tmp/new
S=$R/.snap; tar -xf $S/s46new.tar -C /tmp/new; tar -xf $S/s44pre_tails.tar -C /tmp/pre; R=/tmp/new; cd $R
export PYTHONPATH=/tmp/site:$R/benchmarks
save() { rm -rf $D/*/logs $D/*/*/logs; tar -czf $OUT/r2.tgz -C /tmp res2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
python3 $S/clone_micro.py > $D/clone_micro.txt 2>&1; cat $D/clone_micro.txt; say micro; save
for m in gpt2 llama_prefill; do
  left=$((585 - $(date +%s) + T0)); [ $left -lt 150 ] && break
  AB_FLAGS="--rounds 8 --model-timeout-s 80" timeout $left bash benchmarks/ab_trees.sh /tmp/pre/src $R/src $D/ab_tails $m > $D/ab_$m.txt 2>&1; tail -5 $D/ab_$m.txt; say "ab $m"; save
done
say done
