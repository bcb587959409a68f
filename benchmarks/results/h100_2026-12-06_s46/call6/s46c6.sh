# the batched output copy, A/B on GPT-2 (A = before it, a827bde; B = HEAD), one override file tuned by both first
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c6 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/res6; mkdir -p $D /tmp/new /tmp/precopy
S=$R/.snap; tar -xf $S/s46new.tar -C /tmp/new; tar -xf $S/s46pre_copy.tar -C /tmp/precopy; R=/tmp/new; cd $R
save() { rm -rf $D/*/logs $D/*/*/logs; tar -czf $OUT/r6.tgz -C /tmp res6; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $D/gpu.txt; cat $D/gpu.txt
PYTHONPATH=/tmp/site:$R/benchmarks AB_FLAGS="--rounds 8 --model-timeout-s 60" timeout 280 bash benchmarks/ab_trees.sh /tmp/precopy/src $R/src $D/ab_copy gpt2 > $D/ab_copy.txt 2>&1
tail -n 5 $D/ab_copy.txt; say done; save
