unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c5 $(($(date +%s) - T0)) s] $*"; }
cd $R; W=/tmp/w5; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
python3 .snap/vitgemm.py $W/g > $OUT/vitgemm.txt 2>&1; cat $OUT/vitgemm.txt
for m in device latency; do
  DNNTUNE_CACHE_DIR=$W/c_$m timeout 150 python3 -m dnntune tune -g $W/g --device cuda --ranking-metric $m \
     -o $W/ov_$m.json --report $OUT/tune_$m.json > $OUT/tune_$m.txt 2>&1; echo "rc=$?" >> $OUT/tune_$m.txt
  say $m; grep -v "^\s*$" $OUT/tune_$m.txt | tail -14
done
