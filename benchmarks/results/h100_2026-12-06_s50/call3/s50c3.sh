# session 50 call 3: what PyTorch's route costs the decode steps (route_cost.py), generate() with a prompt
# met before keeping its own race (tree with that change), ConvNeXt-T uncaptured twice (its check_speed readings)
unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
T0=$(date +%s); say() { echo "[c3 $(($(date +%s) - T0)) s] $*"; }
cd $R; D=/tmp/c3; mkdir -p $D
export PYTHONPATH=/tmp/site:$R/src
save() { rm -rf $D/*/logs; tar -czf $OUT/c3.tgz -C /tmp c3; }
DNNTUNE_CACHE_DIR=/tmp/c_rc timeout 200 python3 benchmarks/results/h100_2026-12-06_s50/call3/route_cost.py cuda > $D/route_cost.txt 2>&1
grep -v Warn $D/route_cost.txt | head -8; say route_cost; save
DNNTUNE_CACHE_DIR=/tmp/c_g timeout 150 python3 benchmarks/generate.py --new-tokens 64 --prompt 128 --rounds 4 \
    --without-race --out $D/gen_128 > $D/gen_128.log 2>&1
grep "\[generate\]" $D/gen_128.log; say generate; save
for run in 1 2; do
  left=$((560 - $(date +%s) + T0)); [ $left -lt 70 ] && break
  DNNTUNE_CACHE_DIR=/tmp/c_cn$run timeout $left python3 benchmarks/models.py --models convnext_tiny --variants eager,dnntune \
    --skip-compile --tune-budget-s 15 --rounds 8 --out $D/convnext_$run > $D/convnext_$run.log 2>&1
  grep "\[models\]" $D/convnext_$run.log
  python3 -c "import json;r=json.load(open('$D/convnext_$run/models.json'))['models'][0]['variants']['dnntune'];print({k:r.get(k) for k in ('check_speedup','check_eager_ms','check_ms','reverted','check_readings_ms','median_ms')})" 2>&1 | tail -1
  say convnext $run; save
done
say done
